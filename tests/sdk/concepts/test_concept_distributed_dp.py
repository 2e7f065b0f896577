"""ConceptTask under distributed DP (sdk/concepts/distributed_training.py): a hospital's contribution
is its clipped per-patient gradient sum over EVERY coordinate of the derived model (zeros on the
modules it does not train) plus its Skellam share on every coordinate, checked against a
per-patient loop; a voted run trains under it with the server's share, ε-floor and noise checks
passing, and the [dp_policy] is checked against the derived model's dimension before training."""

from __future__ import annotations

import copy
import hashlib
import json

import numpy as np
import pytest
import torch
from clinograph.sdk.concepts.distributed_training import (
    ConceptDistributedTrainer,
    concept_distributed_trainer,
)
from clinograph.sdk.concepts.encoders import MLPEncoder
from clinograph.sdk.concepts.federation import run_concept_federation
from clinograph.sdk.concepts.model import fcm_loss
from clinograph.sdk.concepts.modules import ConceptHParams
from clinograph.sdk.concepts.params import freeze_unsupervised, module_parameters
from clinograph.sdk.concepts.task import ConceptTask, ConceptTraining
from clinograph.sdk.config import PrivacySection
from clinograph.secure.audit import AuditTrail
from clinograph.secure.runtime.config import FederationSection
from test_concept_task_dp import CARDS, SIGNER, _data, _model, _site

from clinograph.core.errors import ConfigError, PrivacyError
from clinograph.core.identity import Identity
from clinograph.core.spec import ModuleKind

PRIVACY = {"enabled": True, "mode": "distributed", "epsilon_budget": 50.0, "noise_multiplier": 1.0,
           "sample_rate": 1.0, "min_honest": 2, "planned_rounds": 4}
SCALE = 2.0 ** 14
PLAN = {"masked.scale": SCALE, "masked.clip": 1e6, "masked.threshold": 2}


def _task(tmp_path, **privacy):
    x, labels, split = _data()
    model = _model()
    trainer = concept_distributed_trainer(privacy=PrivacySection(**(PRIVACY | privacy)), n_train=len(split.train),
                                          site="h1", state_dir=tmp_path, signer=SIGNER)
    task = ConceptTask(model=model, inputs=x, labels=labels, task="y", split=split,
                       training=ConceptTraining(p_intervention=0.0), privacy=trainer)
    return task, x, labels, split


def _sent(task) -> dict[str, np.ndarray]:
    """z per module, as the client's w·(θ − θ_local) and the masked encoder's rint(x·s) give it."""
    w = task.num_samples
    glob = task.modules.global64
    return {n: np.rint(w * (glob[n] - task.modules.get(n)) * SCALE) for n in task.trained_modules(None)}


def test_contribution_is_the_clipped_per_patient_sum_over_every_module_plus_the_share(tmp_path, monkeypatch):
    """The Skellam share set to zero (its own test is below), q = 1: z/s equals Σ_i clip_C'(∇ℓ_i)
    over the whole model, ℓ_i eq. (2) for patient i by a per-patient loop, C' = parts_sum_clip(C, d),
    within ONE randomised rounding of the hospital's sum (< 1 a coordinate; rounding each patient's
    row would be off by ~sqrt(n)/2); the module it does not train (concept c) is sent, zero. The sum
    comes from the engine's parts (sdk/privacy/parts_sum.py): no per-patient row is formed."""
    import clinograph.sdk.concepts.distributed_training as dt
    import clinograph.sdk.privacy.distributed_sum as distributed_sum
    import clinograph.sdk.privacy.parts_sum as parts_sum

    def no_rows(*args, **kwargs):
        raise AssertionError("the float32 model's sum comes from the engine's parts, without rows")

    monkeypatch.setattr(dt, "concept_rows", no_rows)
    monkeypatch.setattr(distributed_sum, "skellam_noise", lambda variance, n, source=None: np.zeros(n, dtype=np.int64))
    task, x, labels, split = _task(tmp_path)
    ref = copy.deepcopy(task.model)
    task.modules.load(task.modules.state(ModuleKind.SHARED))
    dim = sum(m.size for m in task.modules.spec().shared)
    clip, n = parts_sum.parts_sum_clip(1.0, dim), len(split.train)
    out = task.train(round_=0, epochs=1, plan_options=PLAN)
    assert out.ledger is not None and out.ledger.share is not None and out.ledger.steps == 1
    assert task.num_samples == n and task.privacy.last_batch == n  # q = 1: everyone, weight q·n

    freeze_unsupervised(ref, supervised={"a", "b"}, has_task=True)
    total = {name: np.zeros(sum(p.numel() for p in ps)) for name, ps in module_parameters(ref).items()}
    norms = []
    for i in split.train:
        ref.zero_grad()
        fcm_loss(ref(x[i:i + 1]), {v: y[i:i + 1] for v, y in labels.items()}, supervised={"a", "b"}, has_task=True,
                 task="y", gamma=0.8).backward()
        g = {name: np.concatenate([(p.grad if p.grad is not None else torch.zeros_like(p)).double().reshape(-1).numpy()
                                   for p in ps]) for name, ps in module_parameters(ref).items()}
        norm = float(np.sqrt(sum((v ** 2).sum() for v in g.values())))
        norms.append(norm)
        for name in total:
            total[name] += g[name] * min(1.0, clip / norm)
    assert max(norms) > clip  # clipping binds, so the test checks it
    sent = _sent(task)
    assert set(sent) == set(total) and "concept/c" in sent  # every module, the untrained one included
    worst = max(float(np.abs(z - SCALE * total[name]).max()) for name, z in sent.items())
    assert 0.5 < worst < 1.01  # one rounding: below 1 (float32 gradients aside), yet not exact
    assert np.abs(sent["concept/c"]).max() == 0 and np.abs(sent["concept/a"]).max() > 100


def test_the_share_reaches_every_coordinate_and_the_ledger_refuses_past_the_budget(tmp_path):
    task, *_ = _task(tmp_path, epsilon_budget=1.0, planned_rounds=1)
    task.modules.load(task.modules.state(ModuleKind.SHARED))
    with pytest.raises(PrivacyError, match="Refused before training"):  # ε of one round at σ = 1 is past 1
        task.train(round_=0, epochs=1, plan_options=PLAN)
    task, *_ = _task(tmp_path / "b")
    task.modules.load(task.modules.state(ModuleKind.SHARED))
    task.train(round_=0, epochs=1, plan_options=PLAN)
    z = _sent(task)["concept/c"]  # untrained here: noise alone, std σ·C·s/sqrt(h) ≈ 1.2e4 on 118 coordinates
    rms = float(np.sqrt(np.mean(z ** 2)))  # below half the share's std with probability < 1e-15 (χ²_118)
    assert 0.5 < rms / (SCALE / np.sqrt(2)) < 2 and (z != 0).mean() > 0.99


@pytest.mark.parametrize(("options", "epochs", "why"), [
    ({k: v for k, v in PLAN.items() if k != "masked.scale"}, 1, "secure_mode = 'masked'"),
    (PLAN | {"weight/h1": 1.0}, 1, "strategy = 'fedsgd'"),
    (PLAN | {"masked.threshold": 1}, 1, "below min_honest"),
    (PLAN, 2, "one DP-SGD step"),
    (PLAN | {"fedprox.mu": 0.1}, 1, "FedProx"),
])
def test_a_plan_that_is_not_a_distributed_round_is_refused_before_training(tmp_path, options, epochs, why):
    task, *_ = _task(tmp_path)
    task.modules.load(task.modules.state(ModuleKind.SHARED))
    with pytest.raises(PrivacyError, match=why):
        task.train(round_=0, epochs=epochs, plan_options=options)
    assert not (tmp_path / "distributed_ledger.json").exists()


def test_a_vote_task_is_not_trained_under_distributed_dp(tmp_path):
    from clinograph.sdk.concepts.task import ConceptVote

    x, labels, split = _data()
    trainer = ConceptDistributedTrainer(ledger=None, policy=None, n_train=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="vote runs before it"):
        ConceptTask(model=_model(), inputs=x, labels=labels, task="y", split=split, privacy=trainer,
                    vote=ConceptVote(concepts=("a", "y"), nodes=("a", "y"), edges=()))


def _federation(tmp_path, fed: FederationSection):
    sites = [_site(f"h{k}", k) for k in range(3)]
    server_id = Identity.generate("server")
    audit = AuditTrail(tmp_path / "audit", identity=server_id)
    try:
        return run_concept_federation(
            sites=sites, concepts=("a", "b", "y"), task="y", cards=CARDS, kind="c2bm", federation=fed, audit=audit,
            encoder=lambda: MLPEncoder(5, 8, (16,)), z_dim=8, server_identity=server_id,
            dictionary_hash=hashlib.sha256(b"dp").hexdigest(), hp=ConceptHParams(hidden=8, emb=4),
            privacy=PrivacySection(**(PRIVACY | {"planned_rounds": None})), state_dir=tmp_path / "state")
    finally:
        audit.close()


def _entries(tmp_path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "audit" / "audit.jsonl").read_text().splitlines()]


FED = FederationSection(id="concepts-ddp", rounds=2, secure_mode="masked", strategy="fedsgd", local_epochs=1, seed=3,
                        max_weight=1000.0, min_clients=3)


def test_a_voted_run_trains_under_distributed_dp_with_the_servers_checks_passing(tmp_path):
    out = _federation(tmp_path, FED)
    entries = _entries(tmp_path)
    kinds = [e["kind"] for e in entries]
    assert "update_rejected" not in kinds and "round_aborted" not in kinds and "hospital_refused" not in kinds
    derived = next(e["payload"] for e in entries if e["kind"] == "model_derived")
    checks = [e["payload"] for e in entries if e["kind"] == "noise_check"]
    # the training rounds only (the vote has no DP), over the derived model's every coordinate
    assert [c["round"] for c in checks] == [1, 2]
    assert all(c["passed"] and c["contributors"] == 3 and c["dim"] == derived["parameters"] for c in checks)
    assert out.server.dp_policy.distributed is not None and out.server.dp_policy.distributed.rounds == FED.rounds
    for h in out.hospitals.values():
        entry = h.last.ledger
        assert entry.share is not None and entry.share.dim == derived["parameters"] and entry.steps == 1
        assert 0 < entry.epsilon < entry.share.epsilon_alone <= 50.0
        assert h.task.trained_modules(None) == [m.name for m in out.server.spec.shared]


def test_the_policy_is_checked_against_the_derived_models_dimension_before_training(tmp_path):
    """A ring too coarse for the derived model's coordinates (sqrt(d)/(C·s) > 0.1) is refused when
    the training run is built: after the vote and the derivation, before any training round."""
    with pytest.raises(ConfigError, match=r"too coarse for C = 1 over \d+ coordinates"):
        _federation(tmp_path, FED.model_copy(update={"masked_clip": 10_000.0}))
    kinds = [e["kind"] for e in _entries(tmp_path)]
    assert "model_derived" in kinds and kinds.count("round_plan") == 1  # the vote's round only
    assert not (tmp_path / "state" / "h0" / "distributed_ledger.json").exists()


@pytest.mark.parametrize("path", ["parts", "rows"])
@pytest.mark.parametrize("change", ["drop", "add"])
def test_rows_whose_width_is_not_the_specs_shared_size_are_refused_before_anything_is_drawn(tmp_path, monkeypatch,
                                                                                             change, path):
    """z is cut into the spec's shared modules by their sizes: a clipped sum (from the engine's parts)
    or rows one piece short (or one longer) would shift every module after it. Refused, nothing
    committed to the ledger."""
    import clinograph.sdk.concepts.distributed_training as dt
    from clinograph.sdk.privacy.distributed import PatientRows

    real_rows, real_sum = dt.concept_rows, dt.concept_sum

    def off_rows(*args, **kwargs):
        rows = real_rows(*args, **kwargs)
        blocks = rows.blocks[:-1] if change == "drop" else [*rows.blocks, (3, None)]
        return PatientRows(blocks, n=rows.n, clip=rows.clip)

    def off_sum(*args, **kwargs):
        x = real_sum(*args, **kwargs)
        return x[:-1] if change == "drop" else np.concatenate([x, np.zeros(3)])

    monkeypatch.setattr(dt, "concept_rows", off_rows)
    monkeypatch.setattr(dt, "concept_sum", off_sum if path == "parts" else lambda *a, **k: None)
    task, *_ = _task(tmp_path)
    task.modules.load(task.modules.state(ModuleKind.SHARED))
    with pytest.raises(PrivacyError, match=r"gradients have \d+ coordinates but the model spec's shared modules have"):
        task.train(round_=0, epochs=1, plan_options=PLAN)
    assert not (tmp_path / "distributed_ledger.json").exists()


def test_a_hospital_past_the_float64_sums_bound_rounds_each_patients_row(tmp_path, monkeypatch):
    """More training patients than distributed_sum.SUM_MAX_ROWS (public: the FedSGD weight is q·n):
    each patient's clipped row is rounded (noised_sum), not the hospital's sum."""
    import clinograph.sdk.concepts.distributed_training as dt

    calls = []
    real = dt.noised_sum

    def recording(rows, **kwargs):
        calls.append(rows.clip)
        return real(rows, **kwargs)

    monkeypatch.setattr(dt, "SUM_MAX_ROWS", 3)
    monkeypatch.setattr(dt, "noised_sum", recording)
    task, *_ = _task(tmp_path)
    task.modules.load(task.modules.state(ModuleKind.SHARED))
    out = task.train(round_=0, epochs=1, plan_options=PLAN)
    assert calls == [1.0] and out.ledger is not None and out.ledger.share is not None
