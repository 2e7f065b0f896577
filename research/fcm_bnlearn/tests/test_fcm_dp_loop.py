"""The research F-CMs loop under DP (research/fcm_bnlearn/fcm_federation.py, research/fcm_bnlearn/fcm_dp.py): the
distributed mode trains (FedSGD over noisy integer sums) and the opaque baseline predicts the task only."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from clinograph.sdk.concepts.modules import ConceptHParams
from clinograph.sdk.concepts.views import make_client_views
from clinograph.sdk.datasets import bnlearn

from research.fcm_bnlearn.fcm_federation import (
    ClientData,
    ConceptDP,
    FCMFederation,
    FederationConfig,
    local_dp_steps_per_epoch,
)


@pytest.fixture(scope="module")
def asia():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    nodes = bnlearn.topological_nodes("asia")
    states = bnlearn.network_states("asia")
    codes = bnlearn.encode_states(bnlearn.sample_network("asia", 1600, 0), states)
    cards = {v: len(states[v]) for v in nodes}
    cols = [j for j, v in enumerate(nodes) if v != "dysp"]
    x = bnlearn.featurise(codes[:, cols], [cards[nodes[j]] for j in cols], latent_dim=16, seed=0, epochs=2)
    yield nodes, cards, x, codes
    torch.set_num_threads(before)


def federation(asia, *, kind: str, dp: ConceptDP | None, rounds: int) -> FCMFederation:
    nodes, cards, x, codes = asia
    views = make_client_views(nodes=nodes, edges=bnlearn.network_edges("asia"), task="dysp", n_clients=4,
                              rng=np.random.default_rng(0), task_drop=0.0)
    parts = np.array_split(np.arange(1200), 4)
    lab = lambda idx, keep: {v: torch.from_numpy(codes[idx, j]) for j, v in enumerate(nodes) if v in keep}  # noqa: E731
    clients = [ClientData(f"h{k}", torch.from_numpy(x[p]), lab(p, set(v.nodes)), v)
               for k, (p, v) in enumerate(zip(parts, views, strict=True))]
    val = np.arange(1200, 1600)
    cfg = FederationConfig(kind=kind, rounds=rounds, clients_per_round=4, n_initial=4, join_round=10, local_epochs=1,
                           batch_size=300, lr=5e-3, z_dim=16, encoder_hidden=(32,), hp=ConceptHParams(hidden=16, emb=4),
                           seed=0, dp=dp)
    return FCMFederation(config=cfg, concepts=nodes, task="dysp", cards=cards, clients=clients, in_dim=x.shape[1],
                         val=(torch.from_numpy(x[val]), lab(val, set(nodes))))


def test_distributed_dp_rounds_train_the_concept_model(asia):
    dp = ConceptDP(mode="distributed", noise_multiplier=0.05, clip=1.0, sample_rate=1.0, min_honest=2,
                   scale=2.0 ** 16, server_lr=1e-2)
    res = federation(asia, kind="c2bm", dp=dp, rounds=6).run()
    assert res.val_loss[-1] < res.val_loss[1] - 0.05, res.val_loss


def test_distributed_dp_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="Registered: local, distributed"):
        ConceptDP(mode="central", noise_multiplier=1.0)


def test_opaque_baseline_predicts_the_task_only_and_learns_under_local_dp(asia):
    dp = ConceptDP(mode="local", noise_multiplier=0.05, clip=1.0, sample_rate=1.0)
    fed = federation(asia, kind="opaqnn", dp=dp, rounds=4)
    res = fed.run()
    # every client is sampled every round (4 of 4), 1 local epoch at q = 1: exactly 1 step a round
    assert fed.dp_steps == {f"h{k}": 4 for k in range(4)}, fed.dp_steps
    assert list(res.model.graph.nodes) == ["dysp"]
    assert res.val_loss[-1] < res.val_loss[0], res.val_loss


def test_local_dp_takes_one_expected_pass_an_epoch_not_ceil_of_one_over_q():
    # B = 512 on n_k = 525 patients: q ~ 0.975 is ONE step an epoch (ceil(1/q) = 2 doubled the privacy spent)
    assert local_dp_steps_per_epoch(512 / 525) == 1
    assert local_dp_steps_per_epoch(1.0) == 1
    assert local_dp_steps_per_epoch(0.1) == 10
    assert local_dp_steps_per_epoch(0.3) == 3


def test_a_distributed_round_without_dp_settings_is_a_config_error(asia):
    from clinograph.core.errors import ConfigError

    fed = federation(asia, kind="c2bm", dp=None, rounds=1)
    with pytest.raises(ConfigError, match="distributed_round needs FederationConfig.dp"):
        fed.distributed_round([])
