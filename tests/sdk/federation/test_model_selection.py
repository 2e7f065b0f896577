"""Model selection by federated validation loss: summed through the secure mode, the same
round kept everywhere, early stopping, the audit entry, the selected model's metrics."""

import json
import warnings

import numpy as np
import pytest
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.simulate import simulate, simulate_one
from clinograph.sdk.training.metrics import log_loss
from clinograph.sdk.training.selection import decode_validation, encode_validation
from clinograph.secure.policy import InsecureOptionWarning
from sdk_helpers import small_tables


def cfg(mode="masked", rounds=4, patience=5, **model):
    return SimulationConfig.model_validate({
        "federation": {"rounds": rounds, "secure_mode": mode, "min_clients": 2, "local_epochs": 1},
        "model": {"hidden": 8, **model}, "graph": {"k_similar": 0}, "training": {"lr": 0.01, "batch_size": 32},
        "selection": {"patience": patience}})


def run(tmp_path, mode="masked", on_event=None, **kw):
    tables = small_tables()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureOptionWarning)
        if on_event is not None:  # simulate_one with the run's progress events
            return simulate(tables, tables[0].dictionary, cfg(mode, **kw), audit_dir=tmp_path / mode, choose=False,
                            on_event=on_event)
        return simulate_one(tables, tables[0].dictionary, cfg(mode, **kw), audit_dir=tmp_path / mode)


def test_encoding_round_trips_through_a_weighted_mean():
    before = np.array([0.3, -1.0])
    vs = [(12.0, 30, 100.0), (5.0, 10, 40.0)]
    locals_ = [encode_validation(global_value=before, loss_sum=ls, count=c, weight=w, bound=4.0) for ls, c, w in vs]
    # the client sends w·(global − local); FedSGD moves the global by −η·Σ/Σw
    summed = sum(w * (before - loc) for (_, _, w), loc in zip(vs, locals_, strict=True))
    after = before - 0.5 * summed / sum(w for *_, w in vs)
    assert decode_validation(before=before, after=after) == pytest.approx(17.0 / 40)
    for (_, _, w), loc in zip(vs, locals_, strict=True):  # every weighted value within the bound
        assert np.all(np.abs(w * (before - loc)) <= 4.0)


def test_default_split_holds_a_validation_part():
    assert SimulationConfig().split.validation_fraction == pytest.approx(0.2)


def test_selected_model_is_the_best_on_federated_validation_and_audited(tmp_path):
    closed = []
    res = run(tmp_path, rounds=4, on_event=lambda kind, data: kind == "round_closed" and closed.append(data))
    sel = res.selection
    # rounds 0..4 scored: the initial model, after each round, and the final one
    assert sel["rounds_evaluated"] == [0, 1, 2, 3, 4]
    # round 4 only scores the last model: its progress line says so (it read as a fifth of 4 rounds)
    assert [(e["round"], e["scoring"]) for e in closed] == [(0, False), (1, False), (2, False), (3, False), (4, True)]
    assert sel["validation_loss"] == min(sel["validation_losses"])
    assert sel["validation_loss"] <= sel["validation_losses"][1]  # never worse than round 1
    entries = [json.loads(line) for line in (tmp_path / "masked" / "audit.jsonl").read_text().splitlines()]
    kept = [e["payload"] for e in entries if e["kind"] == "model_selected"]
    assert len(kept) == 1 and kept[0]["round"] == sel["round"]
    assert len(res.rounds) == 4 and set(res.final) == set(res.rounds[0])


def test_federated_loss_equals_the_pooled_validation_loss(tmp_path):
    """The decoded figure is Σ loss_k n_k / Σ n_k of the global model each hospital scored."""
    from clinograph.sdk.federation.simulate import build_simulation

    tables = small_tables()
    sim = build_simulation(tables, tables[0].dictionary, cfg(rounds=1), audit_dir=tmp_path / "a")
    ys, ps = [], []
    for h in sim.hospitals.values():  # the initial model, as every hospital scores it in round 0
        idx = h.task.split.validation
        ys.append(h.task.table.labels[idx])
        ps.append(h.task.predict()[idx])
    sim.run_round()
    sim.audit.close()
    got = {h.task.selection.losses[0] for h in sim.hospitals.values()}
    assert len(got) == 1  # every hospital decodes the same figure
    assert got.pop() == pytest.approx(log_loss(np.concatenate(ys), np.concatenate(ps)), abs=1e-4)


def test_early_stopping_stops_after_patience(tmp_path):
    res = run(tmp_path, rounds=30, patience=1, mode="masked")
    sel = res.selection
    if sel["stopped_early"]:
        assert len(res.rounds) < 30
        assert sel["rounds_evaluated"][-1] - sel["round"] >= 1
    assert sel["round"] in sel["rounds_evaluated"]


def test_selection_is_off_under_fedopt_and_the_last_model_is_kept(tmp_path):
    c = cfg(rounds=2).model_copy(update={"federation": cfg().federation.model_copy(update={"strategy": "fedopt"})})
    assert c.hospital_config().selection_active() is False


@pytest.mark.parametrize("strategy", ["fedadam", "fedyogi"])
def test_selection_is_off_under_every_adaptive_server_optimiser(strategy):
    # FedAdam and FedYogi are FedOpt variants: their step is not linear in the sums either.
    c = cfg(rounds=2).model_copy(update={"federation": cfg().federation.model_copy(update={"strategy": strategy})})
    assert c.hospital_config().selection_active() is False
    from clinograph.secure.strategies import linear_in_sums

    assert not linear_in_sums(strategy) and linear_in_sums("fedavg") and linear_in_sums("dq_weighted")


def test_the_decoded_loss_carries_six_significant_digits_not_a_ckks_decryptions_low_bits():
    """Under ckks every hospital decodes the loss from a CKKS decryption and reports it to the server,
    which knows the ciphertext: the full float64 handed it the decryption error's bits (a function of
    the secret key). Perturbations at that error's size (1e-13 relative) no longer reach the report."""
    before = np.array([0.0, 0.0])
    after = -np.array([1.0, 3.0])  # L = 1/3
    assert decode_validation(before=before, after=after) == 0.333333
    rng = np.random.default_rng(0)
    seen = {decode_validation(before=before, after=after * (1 + 1e-13 * rng.standard_normal(2))) for _ in range(200)}
    assert seen == {0.333333}
