"""The research F-CMs loop (research/fcm_bnlearn/fcm_federation.py, the benchmark's) on tiny Asia, and
module-wise aggregation over contributors (4.2.3). The protocol path (masked, audited) is
tested in test_concept_task.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from clinograph.sdk.concepts.modules import ConceptHParams
from clinograph.sdk.concepts.views import make_client_views
from clinograph.sdk.datasets import bnlearn
from clinograph.secure.aggregation.base import LocalUpdate

from research.fcm_bnlearn.fcm_federation import (
    ClientData,
    FCMFederation,
    FederationConfig,
    aggregate_module_sums,
)


def test_module_wise_aggregation_averages_over_contributors_only():
    ups = {"h1": LocalUpdate(modules={"concept/a": 2.0 * np.ones(3), "encoder/mlp": 2.0 * np.ones(2)}, weight=2.0),
           "h2": LocalUpdate(modules={"encoder/mlp": 6.0 * np.full(2, 3.0)}, weight=6.0)}
    sums = aggregate_module_sums(ups)
    np.testing.assert_allclose(sums.mean("concept/a"), np.ones(3))  # only h1 trained it
    np.testing.assert_allclose(sums.mean("encoder/mlp"), np.full(2, 2.5))
    assert sums.counts == {"concept/a": 1, "encoder/mlp": 2}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: one intra-op thread is faster and avoids oversubscribing a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def asia(one_thread):
    name, n = "asia", 3000
    nodes = bnlearn.topological_nodes(name)
    states = bnlearn.network_states(name)
    codes = bnlearn.encode_states(bnlearn.sample_network(name, n, 0), states)
    cards = {v: len(states[v]) for v in nodes}
    cols = [j for j, v in enumerate(nodes) if v != "dysp"]
    x = bnlearn.featurise(codes[:, cols], [cards[nodes[j]] for j in cols], latent_dim=16, seed=0, epochs=3)
    return nodes, cards, x, codes


def labels(codes, idx, nodes, keep):
    return {v: torch.from_numpy(codes[idx, j]) for j, v in enumerate(nodes) if v in keep}


def four_clients(asia, *, seed: int, rows: int, task_drop: float):
    """Four appendix D.1 views over Asia, each with an equal share of the first ``rows`` rows."""
    nodes, _, x, codes = asia
    views = make_client_views(nodes=nodes, edges=bnlearn.network_edges("asia"), task="dysp", n_clients=4,
                              rng=np.random.default_rng(seed), task_drop=task_drop)
    parts = np.array_split(np.arange(rows), 4)
    clients = [ClientData(f"h{k}", torch.from_numpy(x[p]), labels(codes, p, nodes, set(v.nodes)), v)
               for k, (p, v) in enumerate(zip(parts, views, strict=True))]
    return views, clients


@pytest.mark.parametrize("kind", ["cbm", "c2bm"])
def test_two_round_federation_on_asia_improves(asia, kind):
    nodes, cards, x, codes = asia
    edges = bnlearn.network_edges("asia")
    views, clients = four_clients(asia, seed=0, rows=2400, task_drop=0.0)
    val = np.arange(2400, 3000)
    cfg = FederationConfig(kind=kind, rounds=3, clients_per_round=4, n_initial=4, join_round=10, local_epochs=2,
                           batch_size=200, lr=5e-3, z_dim=16, encoder_hidden=(32,), hp=ConceptHParams(hidden=16, emb=4),
                           seed=0)
    fed = FCMFederation(config=cfg, concepts=nodes, task="dysp", cards=cards, clients=clients, in_dim=x.shape[1],
                        val=(torch.from_numpy(x[val]), labels(codes, val, nodes, set(nodes))))
    res = fed.run()
    assert res.val_loss[2] < res.val_loss[0], res.val_loss
    covered = set().union(*(v.nodes for v in views))
    assert set(res.model.graph.nodes) == covered
    if kind == "c2bm":  # unperturbed votes recover the ground truth among covered nodes
        assert set(res.outcome.edges()) == {(a, b) for a, b in edges if a in covered and b in covered}


def test_early_stopping_waits_for_the_join_then_stops_on_patience(asia):
    """Appendix D.3: early stopping on the global validation loss, never before late joiners arrive."""
    nodes, cards, x, codes = asia
    _, clients = four_clients(asia, seed=1, rows=2400, task_drop=0.0)
    val = np.arange(2400, 3000)
    cfg = FederationConfig(kind="cbm", rounds=60, patience=2, clients_per_round=2, n_initial=2, join_round=6,
                           local_epochs=1, batch_size=200, lr=3e-2, z_dim=16, encoder_hidden=(32,),
                           hp=ConceptHParams(hidden=16, emb=4), seed=0)
    res = FCMFederation(config=cfg, concepts=nodes, task="dysp", cards=cards, clients=clients, in_dim=x.shape[1],
                        val=(torch.from_numpy(x[val]), labels(codes, val, nodes, set(nodes)))).run()
    last = len(res.val_loss) - 1
    assert last < 59, "a high learning rate should plateau well before 60 rounds"
    assert last >= cfg.join_round
    assert last - res.best_round == cfg.patience
    after = res.val_loss[cfg.join_round:]
    assert res.val_loss[res.best_round] == min(after)

