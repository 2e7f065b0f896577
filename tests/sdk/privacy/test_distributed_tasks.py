"""Distributed DP for the survival head and the temporal model (sdk/privacy/distributed_trainer.py): the
one per-patient engine on each task's objective gives each patient's gradient over the released
columns exactly (against a per-patient loop), and a tiny masked FedSGD federation runs with
every round accepted and every noise check passed, private selection included."""

from __future__ import annotations

import copy
import json
import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch
from clinograph.sdk.config import HospitalConfig, SimulationConfig
from clinograph.sdk.datasets import timeseries as ts
from clinograph.sdk.federation.simulate import simulate
from clinograph.sdk.graph.star import star_batch
from clinograph.sdk.graph.temporal import snapshot_batch
from clinograph.sdk.ingest import ingest
from clinograph.sdk.model.heads import SurvivalNSFLModel
from clinograph.sdk.model.modules import ModuleMap
from clinograph.sdk.model.nsfl import NSFLConfig
from clinograph.sdk.model.temporal import TemporalNSFL, add_temporal_modules
from clinograph.sdk.privacy import star_loss
from clinograph.sdk.privacy.distributed import Columns, columns_clipper, per_patient_gradients
from clinograph.sdk.privacy.per_patient import PerPatientClipper
from clinograph.sdk.privacy.survival import HazardClipper, hazard_loss_sum
from clinograph.sdk.training.personal import personal_module_map
from clinograph.sdk.training.survival import interval_targets
from sdk_helpers import SURVIVAL_TARGET, lung_survival

from clinograph.core.spec import ModuleKind

WINDOW = 4


def _moved(model: torch.nn.Module) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():  # off the symmetric / identity init, so every parameter matters
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


def _columns(model: torch.nn.Module, node_ids) -> tuple[Columns, ModuleMap]:
    personal = HospitalConfig().personal.modules  # the task's module map, as NSFLTask builds it
    mm = add_temporal_modules(personal_module_map(model, node_ids, personal=personal), model, node_ids)
    return Columns.of(model, mm, mm.names(ModuleKind.SHARED)), mm


def _loop(model, cols: Columns, inputs, y, loss) -> np.ndarray:
    """Each patient's gradient of its own loss term, one backward a patient, over ``cols``."""
    rows = []
    for i in range(len(y)):
        model.zero_grad(set_to_none=True)
        loss(model(*(a[i:i + 1] for a in inputs)), y[i:i + 1]).backward()
        rows.append(np.concatenate([(torch.zeros(p.shape, dtype=p.dtype) if p.grad is None else
                                     p.grad if row is None else p.grad[row]).detach().double().reshape(-1).numpy()
                                    for _, p, row in cols.pieces]))
    return np.stack(rows)


def _check_against_loop(model, node_ids, inputs, y, loss, *, row_shape, engine) -> Columns:
    cols, _ = _columns(model, node_ids)
    clipper = columns_clipper(model, cols, row_shape=row_shape, engine=engine)
    got = per_patient_gradients(model, cols, inputs=inputs, labels=y, clipper=clipper)
    reference = copy.deepcopy(model)
    ref_cols, _ = _columns(reference, node_ids)
    want = _loop(reference, ref_cols, inputs, y, loss)
    assert got.shape == want.shape == (len(y), cols.dim)
    assert np.abs(got - want).max() < 1e-8 * (1 + np.abs(want).max())
    assert np.linalg.norm(want, axis=1).min() > 0  # every patient moves the released columns
    return cols


@pytest.fixture(scope="module")
def ts_tables():
    hospitals = (replace(ts.DEFAULT_TS_HOSPITALS[0], n_patients=30),  # hourly, 12 snapshots
                 replace(ts.DEFAULT_TS_HOSPITALS[7], n_patients=26))  # 4-hourly: 3 snapshots
    d = ts.load_dictionary()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return d, [ingest(s.table, schema=s.schema, dictionary=d)
                   for s in ts.make_timeseries_sites(seed=1, hospitals=hospitals)]


def test_survival_rows_of_the_distributed_step_equal_a_per_patient_loop():
    pytest.importorskip("lifelines")
    d, tables = lung_survival()
    t = tables[0]
    node_ids = d.node_ids()
    model = _moved(SurvivalNSFLModel(len(node_ids), NSFLConfig(hidden=8, init_seed=5), intervals=5).double())
    stars = star_batch(t, k_similar=0)
    ev = t.survival.event
    rows = np.sort(np.r_[np.flatnonzero(ev == 1)[:5], np.flatnonzero(ev == 0)[:5]])
    fi, x, m = stars.feature_index[rows], stars.values[rows].double(), stars.mask[rows].clone()
    m[0] = False  # a patient with no observed feature
    s, e = interval_targets(t.survival.time[rows], ev[rows], np.array([3, 6, 12, 24, 36]) * 30.44)
    assert (e.sum(1) == 0).any() and (e.sum(1) == 1).any()  # censored and observed patients both
    y = torch.as_tensor(np.concatenate([s, e], axis=1))
    cols = _check_against_loop(model, node_ids, (fi, x, m), y, hazard_loss_sum, row_shape=None, engine=HazardClipper)
    assert "head/hazard_baseline" in cols.modules


def test_temporal_rows_of_the_distributed_step_are_whole_sequences_and_equal_a_per_patient_loop(ts_tables):
    d, tables = ts_tables
    node_ids = d.node_ids()
    model = _moved(TemporalNSFL(len(node_ids), NSFLConfig(hidden=8, init_seed=2, temporal="attention",
                                                         temporal_window=WINDOW)).double())
    b = snapshot_batch(tables[0], window=WINDOW)
    fi, x, m, y = b.feature_index[:8], b.values[:8].double(), b.mask[:8].clone(), b.labels[:8].double()
    m[0, :2] = False  # a patient whose early snapshots are empty
    cols = _check_against_loop(model, node_ids, (fi, x, m), y, star_loss, row_shape=tuple(fi.shape[1:]),
                               engine=PerPatientClipper)
    assert {"temporal/attention", "temporal/combine"} <= set(cols.modules)


def _config(tmp_path, **extra) -> SimulationConfig:
    return SimulationConfig.model_validate({
        "federation": {"rounds": 2, "secure_mode": "masked", "local_epochs": 1, "min_clients": 2, "strategy": "fedsgd"},
        "model": {"hidden": 8, **extra.pop("model", {})}, "graph": {"k_similar": 0},
        "privacy": {"enabled": True, "mode": "distributed", "epsilon_budget": 50.0, "noise_multiplier": 1.0,
                    "clip_norm": 1.0, "sample_rate": 1.0, "min_honest": 2, "state_dir": str(tmp_path / "state")},
        "selection": {"enabled": True, "candidates": []}, "output": str(tmp_path / "out"), **extra})


def _run(tables, dictionary, cfg, tmp_path) -> list[dict]:
    simulate(tables, dictionary, cfg, audit_dir=tmp_path / "audit")
    return [json.loads(x) for x in (tmp_path / "audit" / "audit.jsonl").read_text().splitlines()]


def _assert_accepted(entries: list[dict], *, rounds: int) -> None:
    kinds = [e["kind"] for e in entries]
    assert "hospital_refused" not in kinds and "update_rejected" not in kinds and "round_aborted" not in kinds
    checks = [e["payload"] for e in entries if e["kind"] == "noise_check"]
    assert len(checks) == rounds + 1 and all(c["passed"] for c in checks)  # + the scoring round
    selected = next(e["payload"] for e in entries if e["kind"] == "model_selected")
    assert selected["rounds_evaluated"] == rounds + 1
    ledgers = [e["payload"] for e in entries if e["kind"] == "ledger"]
    assert ledgers and 0 < max(p["epsilon"] for p in ledgers) <= 50.0


def test_a_survival_federation_runs_under_distributed_dp_with_private_selection(tmp_path):
    pytest.importorskip("lifelines")
    d, tables = lung_survival()
    _assert_accepted(_run(list(tables), d, _config(tmp_path, target=SURVIVAL_TARGET), tmp_path), rounds=2)
    from clinograph.sdk.federation.simulate import build_simulation

    sim = build_simulation(list(tables), d, _config(tmp_path / "again", target=SURVIVAL_TARGET),
                           audit_dir=tmp_path / "audit2")
    sim.run_round()
    sim.audit.close()
    task = next(iter(sim.hospitals.values())).task
    m = task.evaluate("test")  # the survival metrics at the horizon, as without DP
    assert 0 <= m["cindex"] <= 1 and m["known"] <= m["n"]
    assert task.finish()["platt_a"] == 1.0 and task.calibration is None


def test_a_temporal_federation_runs_under_distributed_dp_with_private_selection(ts_tables, tmp_path):
    d, tables = ts_tables
    cfg = _config(tmp_path, model={"temporal": "attention", "temporal_window": WINDOW})
    _assert_accepted(_run(tables, d, cfg, tmp_path), rounds=2)
