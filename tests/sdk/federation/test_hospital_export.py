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
        loaded = load_exported(client.model_path, trusted=client.identity.public)
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
    assert load_exported(tmp_path / "kept.safetensors", trusted=me.public).description.selected_round == 99
    assert task.export_kept(tmp_path / "kept.safetensors", signer=me) is None  # same kept round: not written again


def test_no_state_directory_no_file(fed):
    from clinograph.sdk.federation.client import HospitalClient

    tables, sim, _ = fed
    c = sim.hospitals[tables[0].site].client
    bare = HospitalClient(task=c.task, identity=c.identity, server=c.server, peers=c.peers,
                          dictionary_hash=c.dictionary_hash, federation_id="f1", release=c.release)
    assert bare.model_path is None
