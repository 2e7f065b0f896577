"""ConceptTask with patient-level local DP (sdk/concepts/dp_training.py, F-CMs appendix E.4):
the DP step equals a per-patient loop, the ledger records ε, the runtime carries it."""

from __future__ import annotations

import copy
import hashlib

import numpy as np
import pytest
import torch
from clinograph.sdk.concepts.dp_training import ConceptDPTrainer, concept_dp_trainer
from clinograph.sdk.concepts.encoders import MLPEncoder
from clinograph.sdk.concepts.federation import ConceptSite, run_concept_federation
from clinograph.sdk.concepts.graph import ConceptGraph
from clinograph.sdk.concepts.model import ConceptModel, fcm_loss
from clinograph.sdk.concepts.modules import ConceptHParams
from clinograph.sdk.concepts.params import freeze_unsupervised
from clinograph.sdk.concepts.task import ConceptTask, ConceptTraining
from clinograph.sdk.config import PrivacySection
from clinograph.sdk.federation.split import Split
from clinograph.sdk.privacy.accountant import PrivacyLedger, rdp_epsilon
from clinograph.secure.audit import AuditTrail
from clinograph.secure.runtime.config import FederationSection

from clinograph.core.errors import ConfigError, PrivacyBudgetExceeded
from clinograph.core.identity import Identity

CARDS = {"a": 2, "b": 2, "c": 2, "y": 2}

SIGNER = Identity.generate("h1")  # the hospital's identity: signs its ledger


def _data(n: int = 40, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5)).astype(np.float32)
    a = (x[:, 0] > 0).astype(np.int64)
    b = (x[:, 1] + a > 0.5).astype(np.int64)
    y = ((a + b) > 0).astype(np.int64)
    labels = {"a": torch.from_numpy(a), "b": torch.from_numpy(b), "y": torch.from_numpy(y)}
    labels["b"][::3] = -1  # missing labels contribute nothing
    split = Split(train=np.arange(n - 10), validation=np.arange(n - 10, n - 5), test=np.arange(n - 5, n))
    return torch.from_numpy(x), labels, split


def _model() -> ConceptModel:
    torch.manual_seed(0)
    g = ConceptGraph.from_edges(nodes=["a", "b", "c", "y"], edges=[("a", "b"), ("b", "y"), ("c", "y")], task="y",
                                cards=CARDS)
    return ConceptModel(kind="c2bm", encoder=MLPEncoder(5, 8, (16,)), graph=g, z_dim=8,
                        hp=ConceptHParams(hidden=8, emb=4))


def test_dp_round_equals_a_per_patient_loop(tmp_path):
    """With q = 1 (B ≥ n), σ's draw replaced by zeros and plain SGD (lr 1), one round moves the
    trained parameters by exactly −Σ_i clip_C(∇ℓ_i) / n, ℓ_i eq. (2) for patient i; the frozen
    module (concept c: no labels here) does not move."""
    x, labels, split = _data()
    model = _model()
    ref = copy.deepcopy(model)
    clip, n = 0.05, len(split.train)
    ledger = PrivacyLedger(tmp_path, site="h1", budget_epsilon=100.0, delta=1e-5, signer=SIGNER)
    dp = ConceptDPTrainer(ledger=ledger, n_train=n, noise_multiplier=1.0, clip_norm=clip, batch_size=n)
    dp._noise = lambda std, shape, dtype: torch.zeros(shape, dtype=dtype)
    dp._optimizer = torch.optim.SGD
    task = ConceptTask(model=model, inputs=x, labels=labels, task="y", split=split,
                       training=ConceptTraining(lr=1.0, p_intervention=0.0), privacy=dp)
    assert dp.sample_rate == 1.0 and dp.expected_batch == n
    task.train(round_=0, epochs=1, plan_options={})

    freeze_unsupervised(ref, supervised={"a", "b"}, has_task=True)
    names = [k for k, p in ref.named_parameters() if p.requires_grad]
    params = dict(ref.named_parameters())
    total = {k: torch.zeros_like(params[k]) for k in names}
    norms = []
    for i in split.train:
        ref.zero_grad()
        out = ref(x[i:i + 1])
        loss = fcm_loss(out, {v: y[i:i + 1] for v, y in labels.items()}, supervised={"a", "b"}, has_task=True,
                        task="y", gamma=0.8)
        loss.backward()
        g = {k: params[k].grad.clone() if params[k].grad is not None else torch.zeros_like(params[k]) for k in names}
        norm = float(torch.sqrt(sum((v.double() ** 2).sum() for v in g.values())))
        norms.append(norm)
        for k in names:
            total[k] += g[k] * min(1.0, clip / norm)
    assert max(norms) > clip  # clipping binds, so the test checks it
    after = dict(model.named_parameters())
    for k in names:
        torch.testing.assert_close(after[k].detach(), params[k].detach() - total[k] / n, rtol=1e-4, atol=1e-6)
    frozen = [k for k, p in ref.named_parameters() if not p.requires_grad]
    assert frozen and all(torch.equal(after[k], params[k]) for k in frozen)
    sent = task.trained_modules(None)
    assert "concept/a" in sent and "head/task" in sent and "concept/c" not in sent


def test_the_ledger_records_epsilon_and_refuses_past_the_budget(tmp_path):
    x, labels, split = _data()
    priv = PrivacySection(enabled=True, epsilon_budget=2.0, batch_size=10, planned_rounds=2, planned_local_epochs=1)
    dp = concept_dp_trainer(privacy=priv, n_train=len(split.train), site="h1", state_dir=tmp_path, signer=SIGNER)
    task = ConceptTask(model=_model(), inputs=x, labels=labels, task="y", split=split, privacy=dp)
    eps = []
    for r in range(2):
        out = task.train(round_=r, epochs=1, plan_options={})
        eps.append(out.ledger.epsilon)
    assert 0 < eps[0] < eps[1] <= 2.0 + 1e-6
    stored = PrivacyLedger(tmp_path, site="h1", budget_epsilon=2.0, delta=priv.delta, signer=SIGNER)
    assert sum(t for *_, t in stored.history) == 2 * dp.steps_per_epoch == 6
    assert rdp_epsilon(stored.history, priv.delta) == pytest.approx(eps[1])
    with pytest.raises(PrivacyBudgetExceeded, match="Refused before training"):
        task.train(round_=2, epochs=1, plan_options={})


def test_distributed_mode_builds_the_distributed_trainer_or_names_what_is_missing(tmp_path):
    """mode = "distributed" picks the one-step-a-round trainer (tests/sdk/concepts/test_concept_distributed_dp.py)."""
    from clinograph.sdk.concepts.distributed_training import ConceptDistributedTrainer

    priv = PrivacySection(enabled=True, mode="distributed", noise_multiplier=1.0)
    with pytest.raises(ConfigError, match=r"needs \['sample_rate', 'min_honest', 'planned_rounds'\]"):
        concept_dp_trainer(privacy=priv, n_train=30, site="h1", state_dir=tmp_path, signer=SIGNER)
    priv = priv.model_copy(update={"sample_rate": 0.5, "min_honest": 2, "planned_rounds": 3})
    trainer = concept_dp_trainer(privacy=priv, n_train=30, site="h1", state_dir=tmp_path, signer=SIGNER)
    assert isinstance(trainer, ConceptDistributedTrainer) and trainer.expected_batch == 15.0


def _site(name: str, k: int) -> ConceptSite:
    x, labels, split = _data(n=60, seed=k)
    return ConceptSite(name=name, inputs=x, labels=labels, split=split, nodes=("a", "b", "y"),
                       edges=(("a", "b"), ("b", "y")))


@pytest.mark.slow
def test_runtime_federation_carries_each_hospitals_ledger(tmp_path):
    sites = [_site(f"h{k}", k) for k in range(3)]
    fed = FederationSection(id="concepts-dp", rounds=2, secure_mode="masked", strategy="fedavg", local_epochs=1,
                            seed=3, max_weight=1000.0, min_clients=3)
    priv = PrivacySection(enabled=True, epsilon_budget=5.0, batch_size=16, planned_rounds=2)
    kw = {"sites": sites, "concepts": ("a", "b", "y"), "task": "y", "cards": CARDS, "kind": "c2bm",
          "encoder": lambda: MLPEncoder(5, 8, (16,)), "z_dim": 8, "federation": fed,
          "dictionary_hash": hashlib.sha256(b"dp").hexdigest(), "hp": ConceptHParams(hidden=8, emb=4),
          "privacy": priv}
    server_id = Identity.generate("server")
    audit = AuditTrail(tmp_path / "audit", identity=server_id)
    try:
        with pytest.raises(ConfigError, match="state directory"):
            run_concept_federation(audit=audit, server_identity=server_id, **kw)
        out = run_concept_federation(audit=audit, server_identity=server_id, state_dir=tmp_path / "state", **kw)
    finally:
        audit.close()
    assert out.server.dp_policy is not None and out.server.dp_policy.required
    for name, h in out.hospitals.items():
        entry = h.last.ledger
        assert entry is not None and entry.round == out.server.round - 1 and 0 < entry.epsilon <= 5.0
        assert (tmp_path / "state" / name / "privacy_ledger.json").exists()
