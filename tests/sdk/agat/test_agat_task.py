"""AGATTask: the layers (augmentation, kNN graph, temporal step), module-wise training, the one runtime."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from clinograph.sdk.agat import AGATTask
from clinograph.sdk.agat.augmentation import AlignmentAugmentation
from clinograph.sdk.agat.graph import knn_graph, knn_neighbours
from clinograph.sdk.config import HospitalConfig, SimulationConfig
from clinograph.sdk.datasets.alarm import BLOOD_GAS
from clinograph.sdk.federation.build import build_task
from clinograph.sdk.federation.simulate import build_simulation, simulate
from clinograph.sdk.federation.split import hospital_split
from clinograph.sdk.ingest.table import PatientTable
from clinograph.secure.audit import verify_audit_dir
from clinograph.secure.messages import ClientUpdate
from clinograph.secure.policy import InsecureOptionWarning
from clinograph.secure.wire import load_payload, parse_envelope
from sdk_helpers import small_tables

from clinograph.core.errors import ConfigError

AGAT = {"hidden": 16, "k_neighbours": 4, "temporal_hidden": 8}


def cfg(mode, rounds=2, strategy="fedsgd", **fed):
    return SimulationConfig.model_validate({
        "task": "agat", "agat": AGAT,
        "federation": {"rounds": rounds, "secure_mode": mode, "min_clients": 2, "local_epochs": 1,
                       "strategy": strategy, **fed},
        "training": {"lr": 0.01, "batch_size": 32}})


def task_for(table, **over):
    config = HospitalConfig.model_validate({"task": "agat", "agat": AGAT, **over})
    return build_task(table, dictionary=table.dictionary, config=config)


# -- kNN graph ---------------------------------------------------------------------------------
def test_knn_neighbours_match_sklearn_at_any_block_size():
    from sklearn.neighbors import NearestNeighbors

    x = torch.randn(41, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    _, ref = NearestNeighbors(n_neighbors=6).fit(x.numpy()).kneighbors(x.numpy())
    for block in (8 * 2 * 41, 8 * 2 * 41 * 7, 1 << 27):
        nbr = knn_neighbours(x, k=5, block_bytes=block)
        assert [set(r) for r in nbr.tolist()] == [set(r[1:]) for r in ref.tolist()], block


def test_knn_ties_go_to_the_lower_index():
    x = torch.tensor([[0.0], [1.0], [-1.0], [1.0], [-1.0], [2.0]], dtype=torch.float64)
    # patient 0 has four patients at distance 1 (1, 2, 3, 4): the two lowest indices win
    for block in (8 * 2 * 6, 1 << 27):
        assert knn_neighbours(x, k=2, block_bytes=block)[0].tolist() == [1, 2]
        assert knn_neighbours(x, k=3, block_bytes=block)[5].tolist() == [1, 3, 0]  # 1 and 3 tie at 1, then 0


def test_knn_graph_has_k_distinct_neighbours_per_node_and_is_not_self_loops():
    k = 5
    x = torch.randn(50, 7, generator=torch.Generator().manual_seed(0))
    nbr = knn_neighbours(x, k=k)
    assert nbr.shape == (50, k)
    for i in range(50):
        row = nbr[i].tolist()
        assert i not in row and len(set(row)) == k
        d = torch.cdist(x[i:i + 1], x)[0]
        d[i] = float("inf")
        assert set(row) == set(d.topk(k, largest=False).indices.tolist())  # the k nearest, exactly
    edges = knn_graph(x, k=k)
    assert (edges[0] != edges[1]).all()  # no self-loops at all
    assert torch.unique(edges, dim=1).shape[1] == edges.shape[1]  # no duplicates
    rev = {tuple(e) for e in edges.t().tolist()}
    assert all((b, a) in rev for a, b in rev)  # symmetric: P_i in N(P_j) or vice versa
    deg = torch.bincount(edges[1], minlength=50)
    assert (deg >= k).all()


def test_the_task_graph_over_augmented_patients_has_k_real_neighbours():
    task = task_for(small_tables()[2])  # east lacks the blood gases: they are drawn
    current, _, edges = task._inputs()
    n = task.table.n_patients
    assert current.shape == (n, len(task.table.dictionary.node_ids()))
    assert (edges[0] != edges[1]).all()
    for i in range(n):
        assert len(set(edges[0][edges[1] == i].tolist())) >= AGAT["k_neighbours"]


def test_building_and_training_a_task_leaves_the_callers_torch_generator_as_it_was():
    """Its initial weights, its own estimator and its dropout draw inside seeded blocks: a host
    process's next torch.rand is the one it would have drawn (the estimator once drew from it)."""
    torch.manual_seed(31)
    want = torch.rand(3)
    torch.manual_seed(31)
    task = task_for(small_tables()[2])
    task._train_local(round_=1, epochs=1)
    assert torch.equal(torch.rand(3), want)


# -- augmentation (eqs. 3-4) --------------------------------------------------------------------
def test_augmentation_keeps_observed_cells_and_draws_the_rest_from_the_gaussian():
    aug = AlignmentAugmentation(3)
    with torch.no_grad():
        aug.gaussian[2] = torch.tensor([1.5, np.log(0.5)], dtype=torch.float64)
    values = torch.tensor([[0.1, 0.2, 0.0], [0.3, 0.4, 0.0]])
    observed = torch.tensor([[True, True, False], [True, False, False]])
    z = torch.tensor([[9.0, 9.0, 2.0], [9.0, 1.0, -2.0]], dtype=torch.float64)
    out = aug(values, observed, z)
    assert out[0, :2].tolist() == pytest.approx([0.1, 0.2])
    assert out[0, 2].item() == pytest.approx(1.5 + 0.5 * 2.0)
    assert out[1, 1].item() == pytest.approx(0.0 + 1.0 * 1.0)  # untouched Gaussian: N(0, 1)
    assert out[1, 2].item() == pytest.approx(1.5 - 0.5 * 2.0)


def test_a_hospital_estimates_only_the_gaussians_of_features_it_observes():
    east = task_for(small_tables()[2])
    ids = east.table.dictionary.node_ids()
    assert not set(BLOOD_GAS) & east.observed
    before = east.model.augmentation.gaussian.detach().clone()
    east.train(round_=0, epochs=1, plan_options={})
    after = east.model.augmentation.gaussian.detach()
    for f, nid in enumerate(ids):
        changed = not torch.equal(before[f], after[f])
        assert changed == (nid in east.observed), nid


def test_a_hospitals_missing_cells_come_from_its_own_gaussian_in_evaluation_as_in_training():
    # eq. (3): client k draws from its own N(mu_(k), sigma2_(k)). The global model it evaluates (a
    # selected round's) carries the federation's Gaussians; the cells east lacks *within* a feature it
    # observes must still be drawn from east's own estimate, as in training, so that the kNN graph
    # and the inputs at evaluation are the ones it trained on.
    east = task_for(small_tables()[2])
    values, observed = east._steps[-1]
    east.model.augmentation.estimate(values, observed, east.split.train)  # what local training loads (eq. 3)
    trained = east._inputs()[0].clone()
    with torch.no_grad():  # a global model whose Gaussians are not east's (other hospitals' estimates)
        east.model.augmentation.gaussian[:, 0] += 3.0
    evaluated = east._inputs()[0]
    ids = east.table.dictionary.node_ids()
    own = np.array([nid in east.observed for nid in ids])
    missing_own = torch.as_tensor(~observed & own[None, :])
    assert missing_own.any() and (~own).any()
    assert torch.equal(evaluated[missing_own], trained[missing_own])
    assert torch.equal(evaluated[torch.as_tensor(observed)], trained[torch.as_tensor(observed)])
    # the features east lacks are drawn from the loaded (global) Gaussians
    assert evaluated[:, ~own].numpy() == pytest.approx(trained[:, ~own].numpy() + 3.0, abs=1e-5)


def test_a_categorical_features_unrecorded_levels_are_absent_not_drawn():
    # gbsg2's tumour grade: each patient has one level node recorded (value 1). The other levels are
    # absent (0), not missing: drawn from the levels' Gaussians (all observed values 1, so mu = 1)
    # every patient carried every level and the grade carried nothing.
    pytest.importorskip("lifelines")
    from clinograph.sdk.datasets.real_tables import cohort_tables
    from clinograph.sdk.ingest import ingest

    c = cohort_tables("gbsg2")
    df, schema = c.hospitals[-1]
    table = ingest(df, schema=schema, dictionary=c.dictionary)
    task = task_for(table)
    ids = c.dictionary.node_ids()
    grade = [i for i, nid in enumerate(ids) if nid.startswith("tumour_grade=")]
    _, observed = table.dense()
    recorded = observed[:, grade].any(axis=1)
    assert len(grade) == 3 and recorded.any()
    x = task._inputs()[0].numpy()[recorded][:, grade]
    assert np.array_equal(np.sort(x, axis=1), np.tile([0.0, 0.0, 1.0], (len(x), 1)))  # exactly one level, others 0
    g = task.model.augmentation.gaussian.detach().clone()
    task.model.augmentation.estimate(*task._steps[-1], task.split.train)
    mu = task.model.augmentation.gaussian.detach()[grade, 0].numpy()
    assert mu.sum() == pytest.approx(1.0) and (mu < 1).all()  # the levels' frequencies, not 1 each
    assert not torch.equal(g, task.model.augmentation.gaussian.detach())


# -- module-wise --------------------------------------------------------------------------------
def test_a_hospital_without_a_feature_sends_nothing_for_its_augmentation_module(tmp_path):
    tables = small_tables()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureOptionWarning)
        sim = build_simulation(tables, tables[0].dictionary, cfg("insecure_plaintext"), audit_dir=tmp_path / "a")
    before = sim.server.state
    sim.run_round()
    sim.audit.close()
    sent = {}
    for name, h in sim.hospitals.items():
        for data in h.outgoing:
            env = parse_envelope(data)
            if env.kind == "client_update":
                sent[name] = {t.name for t in load_payload(env, ClientUpdate).modules}
    for gas in BLOOD_GAS:
        assert f"augmentation/{gas}" not in sent["east"]
        assert f"augmentation/{gas}" in sent["north"] and f"augmentation/{gas}" in sent["south"]
    for name, mods in sent.items():
        assert "gat/layer1" in mods and "head/task" in mods
        assert "temporal/mlp" not in mods, name  # static tables: no previous step
    assert np.array_equal(sim.server.state["temporal/mlp"], before["temporal/mlp"])


def long_table(t: PatientTable) -> PatientTable:
    """``t`` observed twice: snapshot 0 and a shifted snapshot 1."""
    shift = np.random.default_rng(0).normal(0, 0.3, t.std_value.size)
    cat = np.concatenate
    return PatientTable(dictionary=t.dictionary, site=t.site, patient_ids=t.patient_ids,
                        patient=cat([t.patient, t.patient]), node=cat([t.node, t.node]),
                        value=cat([t.value, t.value]), std_value=cat([t.std_value, t.std_value + shift]),
                        time=cat([np.zeros_like(t.time), np.ones_like(t.time)]), labels=t.labels, report=t.report)


def test_a_long_table_uses_the_previous_snapshot_and_trains_the_temporal_module():
    table = long_table(small_tables()[0])
    assert table.n_snapshots == 2
    task = task_for(table)
    current, previous, _ = task._inputs()
    assert previous is not None and not torch.equal(current, previous)
    before = task.modules.get("temporal/mlp")
    out = task.train(round_=0, epochs=1, plan_options={})
    assert "temporal/mlp" in task.trained_modules(out)
    assert not np.array_equal(before, task.modules.get("temporal/mlp"))
    static = task_for(small_tables()[0])
    assert "temporal/mlp" not in static.trained_modules(static.train(round_=0, epochs=1, plan_options={}))


def test_agat_refuses_dp_with_the_reason():
    with pytest.raises(ConfigError, match="task = 'agat' with \\[privacy\\] enabled"):
        task_for(small_tables()[0], privacy={"enabled": True})


def test_personal_modules_are_kept_and_unknown_ones_named():
    task = task_for(small_tables()[0], personal={"modules": ["head/task"]})
    assert "head/task" not in task.trained_modules(None)
    with pytest.raises(ConfigError, match="not AGAT modules"):
        task_for(small_tables()[0], personal={"modules": ["gnn/layer1"]})


def test_same_split_rule_as_every_task():
    t = small_tables()[1]
    task = task_for(t)
    ref = hospital_split(t.labels, site=t.site, test_fraction=0.3, validation_fraction=0.2, seed=0)
    assert np.array_equal(task.split.test, ref.test) and np.array_equal(task.split.validation, ref.validation)
    assert isinstance(task, AGATTask)


# -- the one runtime ----------------------------------------------------------------------------
def test_two_round_masked_federation_of_agat_hospitals_runs_and_its_audit_verifies(tmp_path):
    tables = small_tables()
    res = simulate(tables, tables[0].dictionary, cfg("masked", rounds=2), audit_dir=tmp_path / "audit")
    assert len(res.rounds) == 2 and all(not d for d in res.dropped)
    assert set(res.final) == {t.site for t in tables}
    assert all(np.isfinite(m["loss"]) for m in res.final.values())
    assert verify_audit_dir(tmp_path / "audit").ok
