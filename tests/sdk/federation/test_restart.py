"""A hospital restarted between two rounds takes back what it held: the global model, its personal
layers, the rounds it completed and its record of the selection (the best model, the one offered
for scoring). A run with a restart then ends exactly as one without: the same model and the same
selection record at that hospital, bit for bit. An altered checkpoint is refused."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.build import build_hospital
from clinograph.sdk.federation.simulate import build_simulation
from sdk_helpers import small_tables

from clinograph.core.errors import IntegrityError


def _config(out: Path) -> SimulationConfig:
    return SimulationConfig.model_validate({
        "federation": {"rounds": 4, "secure_mode": "masked", "min_clients": 2, "local_epochs": 1},
        "model": {"hidden": 8}, "graph": {"k_similar": 0}, "training": {"lr": 0.02, "batch_size": 32},
        "personal": {"modules": ["head/task"], "fine_tune_epochs": 1}, "selection": {"enabled": True, "patience": 0},
        "output": str(out)})


def _run(tmp_path: Path, *, restart_after: int | None):
    tables = small_tables()
    config = _config(tmp_path / "out")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fed = build_simulation(tables, tables[0].dictionary, config, audit_dir=tmp_path / "audit")
        for r in range(4):
            if r == restart_after:  # the hospital's process is gone; a new one starts from its state directory
                old = fed.hospitals["north"]
                state_dir = old.anchor.path.parent
                table = next(t for t in tables if t.site == "north")
                new = build_hospital(table, dictionary=tables[0].dictionary, config=config.hospital_config(),
                                     identity=old.identity, server=old.server, peers=old.peers,
                                     federation_id=config.federation.id, state_dir=state_dir)
                fed.hospitals["north"] = new
                fed.transport.participants["north"] = new
            fed.run_round()
    return fed.hospitals["north"]


def _state(client) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in client.task.model.state_dict().items()}


def test_a_restarted_hospital_ends_the_run_as_if_it_had_not_restarted(tmp_path):
    steady = _run(tmp_path / "steady", restart_after=None)
    restarted = _run(tmp_path / "restarted", restart_after=2)
    a, b = _state(steady), _state(restarted)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # personal head included
    sa, sb = steady.task.selection, restarted.task.selection
    assert (sa.rounds, sa.losses, sa.best_round) == (sb.rounds, sb.losses, sb.best_round) and len(sa.rounds) >= 3
    assert all(torch.equal(sa.best_state[k], sb.best_state[k]) for k in sa.best_state)
    assert steady.task._rounds_done == restarted.task._rounds_done == 4


def test_without_the_checkpoint_the_personal_layers_would_be_lost(tmp_path):
    """The test above can fail: a hospital rebuilt without its checkpoint ends elsewhere."""
    steady = _run(tmp_path / "steady", restart_after=None)
    from clinograph.sdk.federation import client as client_module

    keep = client_module.HospitalClient._restore_checkpoint
    client_module.HospitalClient._restore_checkpoint = lambda self, fid: None  # type: ignore[method-assign]
    try:
        forgetful = _run(tmp_path / "forgetful", restart_after=2)
    finally:
        client_module.HospitalClient._restore_checkpoint = keep  # type: ignore[method-assign]
    a, b = _state(steady), _state(forgetful)
    assert any(not torch.equal(a[k], b[k]) for k in a) or \
        steady.task.selection.rounds != forgetful.task.selection.rounds


def test_an_altered_checkpoint_is_refused(tmp_path):
    client = _run(tmp_path, restart_after=None)
    state_dir = client.anchor.path.parent
    checkpoint = next(state_dir.glob("checkpoint.*.bin"))
    data = bytearray(checkpoint.read_bytes())
    data[-1] ^= 1
    checkpoint.write_bytes(bytes(data))
    table = next(t for t in small_tables() if t.site == "north")
    with pytest.raises(IntegrityError, match="restart checkpoint .* is missing or altered"):
        build_hospital(table, dictionary=table.dictionary, config=_config(tmp_path / "out").hospital_config(),
                       identity=client.identity, server=client.server, peers=client.peers,
                       federation_id=client.federation_id, state_dir=state_dir)


@pytest.mark.parametrize("meta", ['{}', '[]', '{"rounds_done": "x", "selection": null, "global_origin": null}',
                                  '{"rounds_done": 1, "selection": {"rounds": 1}, "global_origin": [1]}'])
def test_a_rewritten_checkpoint_whose_record_is_not_clinographs_is_an_integrity_error(tmp_path, meta):
    """Adversarial rerun of issue 31: a checkpoint rewritten with its digest (whoever can write the
    state directory) whose record is valid JSON of the wrong shape gave a KeyError or TypeError
    traceback at start-up; it is an IntegrityError naming the checkpoint."""
    import hashlib
    import json

    from safetensors.torch import load, save

    client = _run(tmp_path, restart_after=None)
    state_dir = client.anchor.path.parent
    checkpoint = next(state_dir.glob("checkpoint.*.bin"))
    data = save(load(checkpoint.read_bytes()), metadata={"clinograph": meta})
    checkpoint.write_bytes(data)
    anchor = json.loads(client.anchor.path.read_text())
    for rec in anchor["anchors"].values():
        rec["checkpoint_sha256"] = hashlib.sha256(data).hexdigest()
    client.anchor.path.write_text(json.dumps(anchor))
    table = next(t for t in small_tables() if t.site == "north")
    with pytest.raises(IntegrityError, match="restart checkpoint"):
        build_hospital(table, dictionary=table.dictionary, config=_config(tmp_path / "out").hospital_config(),
                       identity=client.identity, server=client.server, peers=client.peers,
                       federation_id=client.federation_id, state_dir=state_dir)
