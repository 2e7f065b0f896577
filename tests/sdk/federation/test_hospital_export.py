"""A hospital with a state directory writes, after every round, the model it would keep --
selected on validation, calibrated -- as an export (safetensors + a description signed with its
identity) it can use without the federation."""

import warnings

import numpy as np
import pytest
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.simulate import simulate
from clinograph.sdk.model.load import load_exported, predict_exported
from clinograph.secure.policy import InsecureOptionWarning
from sdk_helpers import small_tables


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("hospital_export")
    tables = small_tables()
    cfg = SimulationConfig.model_validate({
        "federation": {"rounds": 3, "secure_mode": "masked", "min_clients": 2, "local_epochs": 1},
        "model": {"hidden": 8}, "graph": {"k_similar": 0}, "training": {"lr": 0.01, "batch_size": 32},
        "output": str(tmp_path / "out")})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureOptionWarning)
        res = simulate(tables, tables[0].dictionary, cfg, audit_dir=tmp_path / "audit", choose=False)
    return tables, res, res


def test_each_hospital_keeps_an_export_of_its_selected_calibrated_model(fed):
    tables, sim, res = fed
    for table in tables:
        client = sim.hospitals[table.site].client
        assert client.model_path is not None and client.model_path.exists()
        loaded = load_exported(client.model_path, trusted=client.identity.public, insecure_untrusted_model=True)
        assert loaded.description.selected_round == res.selection["round"]
        # the file scores like the hospital's own finished model (selected round, personal layers, Platt)
        assert np.allclose(predict_exported(loaded, table), client.predict_table(table), atol=1e-6)


def test_export_between_rounds_leaves_training_state_untouched(fed, tmp_path):
    tables, sim, _ = fed
    task = sim.hospitals[tables[1].site].client.task
    before = {k: v.clone() for k, v in task.model.state_dict().items()}
    calibration = task.calibration
    task.selection.best_state = {k: v + 1.0 for k, v in before.items()}  # a different kept model
    task.selection.best_round = 99
    me = sim.hospitals[tables[1].site].identity
    task.export_kept(tmp_path / "kept.safetensors", signer=me)
    after = task.model.state_dict()
    assert all(np.array_equal(before[k].numpy(), after[k].numpy()) for k in before)
    assert task.calibration is calibration
    assert load_exported(tmp_path / "kept.safetensors", trusted=me.public, insecure_untrusted_model=True).description.selected_round == 99
    assert task.export_kept(tmp_path / "kept.safetensors", signer=me) is None  # same kept round: not written again


def test_no_state_directory_no_file(fed):
    from clinograph.sdk.federation.client import HospitalClient

    tables, sim, _ = fed
    c = sim.hospitals[tables[0].site].client
    bare = HospitalClient(task=c.task, identity=c.identity, server=c.server, peers=c.peers,
                          dictionary_hash=c.dictionary_hash, federation_id="f1", release=c.release)
    assert bare.model_path is None


def _changed_export(tmp_path, client, edit):
    """The hospital's kept model with ``edit(model)`` applied, exported and signed by the hospital
    itself with the same release binding (what a holder of the hospital's key could write)."""
    import copy

    import torch
    from clinograph.sdk.model.export import export_model

    task = client.task
    loaded = load_exported(client.model_path, trusted=client.identity.public, insecure_untrusted_model=True)
    model = copy.deepcopy(task.model)
    model.load_state_dict(loaded.module.model.state_dict())
    with torch.no_grad():
        edit(model)
    d = loaded.description
    path, _ = export_model(model, tmp_path / "changed.safetensors", dictionary=task.table.dictionary,
                           signer=client.identity, calibration=task.calibration,
                           meta={"site": d.site, "selected_round": d.selected_round,
                                 "release": d.release.model_dump(mode="json")})
    return path


def test_the_shared_modules_are_checked_against_the_released_global_model(fed, tmp_path):
    """Issue 31 item 1: with the audit trail and the server's key, an export's shared modules must
    be the global model the server published (and released) for the round it names."""
    from clinograph.core.errors import IntegrityError
    from clinograph.core.identity import Identity

    tables, sim, res = fed
    audit = res.audit_dir
    for table in tables:
        client = sim.hospitals[table.site].client
        loaded = load_exported(client.model_path, trusted=client.identity.public, audit_dir=audit,
                               server=client.server)
        rel = loaded.description.release
        assert rel is not None and loaded.released_round == rel.round
        assert rel.personal_modules == tuple(client.task.config.personal.modules)
        assert np.allclose(predict_exported(loaded, table), client.predict_table(table), atol=1e-6)
    client = sim.hospitals[tables[0].site].client
    with pytest.raises(IntegrityError, match="does not verify under the server key"):
        load_exported(client.model_path, trusted=client.identity.public, audit_dir=audit,
                      server=Identity.generate("server").public)
    # the hospital's key alone cannot vouch for a global model the federation did not release ...
    forged = _changed_export(tmp_path, client, lambda m: m.embedding.weight.mul_(1.01))
    load_exported(forged, trusted=client.identity.public, insecure_untrusted_model=True)  # its own signature holds
    with pytest.raises(IntegrityError, match=r"\d+ shared module\(s\) differ from the global model the server "
                                             r"released for round \d+"):
        load_exported(forged, trusted=client.identity.public, audit_dir=audit, server=client.server)
    # ... while its personal layers (here the masks) are its own, vouched for by its signature
    personal = _changed_export(tmp_path, client, lambda m: m.mask_logit.weight.add_(0.5))
    assert load_exported(personal, trusted=client.identity.public, audit_dir=audit,
                         server=client.server).released_round == rel.round


def test_a_release_check_needs_a_release_a_trail_and_both_options(fed, tmp_path):
    from clinograph.sdk.model.export import export_model

    from clinograph.core.errors import ConfigError, IntegrityError

    tables, sim, res = fed
    client = sim.hospitals[tables[0].site].client
    with pytest.raises(ConfigError, match="needs both the federation's audit directory and the server's public key"):
        load_exported(client.model_path, trusted=client.identity.public, audit_dir=res.audit_dir)
    path, _ = export_model(client.task.model, tmp_path / "bare.safetensors", dictionary=tables[0].dictionary,
                           signer=client.identity)
    with pytest.raises(IntegrityError, match="names no federation round"):
        load_exported(path, trusted=client.identity.public, audit_dir=res.audit_dir, server=client.server)
    with pytest.raises(ConfigError, match="is not a directory"):
        load_exported(client.model_path, trusted=client.identity.public, audit_dir=tmp_path / "none",
                      server=client.server)


def _two_round_simulation(tmp_path):
    """A masked 2-round federation of the small hospitals, built and not yet run."""
    from clinograph.sdk.federation.simulate import build_simulation

    tables = small_tables()
    cfg = SimulationConfig.model_validate({
        "federation": {"rounds": 2, "secure_mode": "masked", "min_clients": 2, "local_epochs": 1},
        "model": {"hidden": 8}, "graph": {"k_similar": 0}, "output": str(tmp_path / "out")})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureOptionWarning)
        return build_simulation(tables, tables[0].dictionary, cfg, audit_dir=tmp_path / "audit")


def test_an_export_written_mid_run_has_no_release_to_check(tmp_path):
    """The round's global model is published, but the run has not released a model yet."""
    from clinograph.secure.runtime import run_round

    from clinograph.core.errors import IntegrityError

    tables = small_tables()
    sim = _two_round_simulation(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureOptionWarning)
        run_round(sim.server, sim.transport, deliver=True)
    from clinograph.sdk.model.export import export_model

    client = sim.hospitals[tables[0].site]
    fid, round_ = client.task.global_origin  # the model now holds round 0's global model
    path, _ = export_model(client.task.model, tmp_path / "mid.safetensors", dictionary=tables[0].dictionary,
                           signer=client.identity, meta={"release": {"federation_id": fid, "round": round_,
                                                                     "personal_modules": []}})
    assert round_ == 0
    with pytest.raises(IntegrityError, match=r"published round 0 of .* but records no release after it"):
        load_exported(path, trusted=client.identity.public, audit_dir=tmp_path / "audit", server=client.server)


@pytest.mark.parametrize("change", [{"deep": False}, {"negative_slope": 0.6}, {"value_clip": 0.5}])
def test_weight_free_model_settings_are_bound_to_the_release(fed, tmp_path, change):
    """Issue 31, the last medium: the released weights under other [model] settings (re-signed by
    the hospital's own key) compute other risks; the release check refuses them, since the
    server's signed plan of that round carries the settings' digest."""
    from clinograph.core.errors import IntegrityError

    tables, sim, res = fed
    client = sim.hospitals[tables[0].site].client
    forged = _changed_export(tmp_path, client,
                             lambda m: setattr(m, "config", m.config.model_copy(update=change)))
    honest = load_exported(client.model_path, trusted=client.identity.public, insecure_untrusted_model=True)
    other = load_exported(forged, trusted=client.identity.public, insecure_untrusted_model=True)  # its own signature holds
    assert other.description.model.model_dump(include=set(change)) == change
    assert not np.allclose(predict_exported(other, tables[0]), predict_exported(honest, tables[0]))
    with pytest.raises(IntegrityError, match=r"model settings .* digest to [0-9a-f]{12}…, but for round \d+ of .* "
                                             r"its signed plan names model settings [0-9a-f]{12}…"):
        load_exported(forged, trusted=client.identity.public, audit_dir=res.audit_dir, server=client.server)


def test_a_plan_is_refused_by_a_hospital_whose_model_settings_differ(tmp_path):
    """The server's plan carries the digest of `clinograph model init`'s model settings; a
    hospital whose [model] section differs in a weight-free setting refuses to train."""
    from clinograph.sdk.model.settings import PLAN_OPTION, config_settings_digest

    from clinograph.core.errors import ProtocolError

    sim = _two_round_simulation(tmp_path)
    names = tuple(sorted(sim.hospitals))
    client = sim.hospitals[names[0]]
    plan = sim.server.open_round(names)
    from clinograph.secure.messages import RoundPlan
    from clinograph.secure.wire import open_envelope, parse_envelope

    options = open_envelope(parse_envelope(plan), sender=client.server, model=RoundPlan).options
    assert options[PLAN_OPTION] == config_settings_digest(client.task.config)
    client.task.config = client.task.config.model_copy(
        update={"model": client.task.config.model.model_copy(update={"value_clip": 2.0})})
    with pytest.raises(ProtocolError, match=r"plan for round 0 names model settings [0-9a-f]{12}…, but this "
                                            r"hospital's \[model\] settings .* digest to [0-9a-f]{12}…"):
        client.on_plan(plan)
