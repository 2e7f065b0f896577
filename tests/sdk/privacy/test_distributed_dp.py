"""Distributed DP at the hospital: exact per-patient clipping, unbiased rounding, exact masked sums."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.simulate import build_simulation
from clinograph.sdk.graph.star import star_batch
from clinograph.sdk.model.nsfl import NSFLConfig, NSFLModel
from clinograph.sdk.model.nsfl_modules import nsfl_modules
from clinograph.sdk.privacy import star_loss
from clinograph.sdk.privacy.distributed import (
    Columns,
    PatientRows,
    clip_rows,
    distributed_step,
    noisy_integer_sum,
    per_patient_gradients,
    randomised_round,
)
from clinograph.secure.dp import DistributedPolicy
from clinograph.secure.hazmat.discrete_noise import CsprngUniform, skellam
from clinograph.secure.strategies.fedavg import FedSGD
from hypothesis import example, given, settings
from hypothesis import strategies as st

from clinograph.core.errors import PrivacyError
from clinograph.core.identity import Identity
from clinograph.core.spec import ModuleKind


def _model(n_features: int) -> NSFLModel:
    model = NSFLModel(n_features, NSFLConfig(hidden=8, init_seed=5))
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            if p.dtype == torch.float32:
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return model


def test_clipped_per_patient_sum_equals_a_per_patient_loop(tables, dictionary):
    model = _model(len(dictionary.node_ids()))
    mm = nsfl_modules(model, dictionary.node_ids())
    cols = Columns.of(model, mm, mm.names(ModuleKind.SHARED))
    assert "gnn/layer1/similar_to" not in cols.modules and cols.dim > 100
    stars = star_batch(tables[2])
    fi, x, m, y = stars.feature_index[:12], stars.values[:12], stars.mask[:12].clone(), stars.labels[:12]
    m[0] = False  # a patient without any observed feature
    got = clip_rows(per_patient_gradients(model, cols, inputs=(fi, x, m), labels=y), 0.05).sum(0)
    reference = copy.deepcopy(model)
    ref_mm = nsfl_modules(reference, dictionary.node_ids())
    ref_cols = Columns.of(reference, ref_mm, ref_mm.names(ModuleKind.SHARED))
    want = np.zeros(cols.dim)
    for i in range(len(y)):
        reference.zero_grad(set_to_none=True)
        star_loss(reference.forward_star(fi[i:i + 1], x[i:i + 1], m[i:i + 1]), y[i:i + 1]).backward()
        g = np.concatenate([(torch.zeros(p.shape) if p.grad is None else p.grad if row is None else p.grad[row])
                            .detach().double().reshape(-1).numpy() for _, p, row in ref_cols.pieces])
        want += g * min(1.0, 0.05 / max(np.linalg.norm(g), 1e-300))
    assert np.abs(got - want).max() < 1e-6
    assert all(p.grad is None and not hasattr(p, "grad_sample") for p in model.parameters())


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=8), st.binary(min_size=32, max_size=32))
@example(values=[0.0, 1.625, 0.0, 1.25, 1.000001, 0.0], key=bytes(32))  # one up in 4000 at 1e-6: 16 s.e.
@example(values=[2.8295616870595745e-306], key=bytes(32))  # binomtest overflowed here
def test_randomised_rounding_is_unbiased(values, key):
    x = np.repeat(np.asarray(values)[None, :], 4000, axis=0)
    r = randomised_round(x, source=CsprngUniform(_key=key))
    assert np.all((r == np.floor(x)) | (r == np.floor(x) + 1))
    from scipy.stats import binom

    frac = x[0] - np.floor(x[0])
    ups = (r - np.floor(x)).sum(0).astype(int)
    # each column's rounding-ups are Binomial(4000, frac): its exact tails (each >= 5e-10), not 6 standard
    # errors (for frac = 1e-6 one up in 4000 -- probability 0.4 % -- is 16 standard errors off: a false
    # failure); binom's cdf and sf, not binomtest, which overflows at fractions like 1e-306
    tails = [min(binom.cdf(k, 4000, f), binom.sf(k - 1, 4000, f)) for k, f in zip(ups, frac, strict=True)]
    assert min(tails) >= 5e-10, (ups, frac, tails)


def test_skellam_shares_have_the_declared_variance():
    s = skellam(4.0e6, 20000, source=CsprngUniform(_key=bytes(range(32))))
    assert s.dtype == np.int64 and abs(s.mean()) < 6 * 2000 / np.sqrt(20000)
    assert s.var() == pytest.approx(4.0e6, rel=0.05)



@pytest.mark.parametrize("bad", [[float("nan")] * 2, [float("inf"), 0.0]])
@pytest.mark.parametrize("count", [1, 2])
def test_a_non_finite_patient_row_is_refused_before_rounding(bad, count):
    """A NaN (or inf, which clipping turns into NaN) row cast to int64 is -2^63: two of them wrapped
    to exactly 0 and the sum went out, one was refused by the ring check -- refusal by parity."""
    g = torch.tensor([[1.0, 0.0], *[bad] * count, [0.0, 1.0]], dtype=torch.float64)
    with pytest.raises(PrivacyError, match="not finite"):
        noisy_integer_sum(PatientRows([(2, g)], n=len(g), clip=1.0), scale=2.0 ** 10, share_variance=1.0,
                          source=CsprngUniform(_key=bytes(32)))


def test_an_extra_row_past_the_clip_norm_is_refused_and_one_within_is_summed_with_the_declared_share():
    """distributed_step's extra rows (the validation patients') go through the one noised sum:
    a row of norm 1.001·C is refused before anything is drawn; rows within C give z with the
    policy's share declared (evaluation-only round: the extra coordinates alone)."""
    policy = DistributedPolicy(mechanism="skellam", noise_multiplier=1.0, clip_norm=1.0, sample_rate=1.0,
                               min_honest=2, rounds=5, max_epsilon=50.0, delta=1e-5)
    step = dict(policy=policy, scale=1000.0, inputs=[], labels=torch.zeros(0), train=False)
    with pytest.raises(PrivacyError, match="exceeds the clip norm C"):
        distributed_step(None, None, extra_rows=np.array([[0.6, 0.8008]]), **step)  # type: ignore[arg-type]
    out = distributed_step(None, None, extra_rows=np.array([[0.6, 0.8], [0.0, 1.0]]),  # type: ignore[arg-type]
                           source=CsprngUniform(_key=bytes(range(32))), **step)
    assert out.z.shape == (2,) and out.z.dtype == np.int64 and out.batch == 0
    assert out.declaration.share_variance == policy.share_variance(1000.0) and out.declaration.scale == 1000.0

def _config(tmp_path, **privacy) -> SimulationConfig:
    return SimulationConfig.model_validate({
        "federation": {"rounds": 2, "secure_mode": "masked", "local_epochs": 1, "min_clients": 2},
        "model": {"hidden": 8}, "graph": {"k_similar": 0},
        "privacy": {"enabled": True, "mode": "distributed", "epsilon_budget": 20.0, "noise_multiplier": 1.0,
                    "clip_norm": 1.0, "sample_rate": 0.2, "min_honest": 2, "state_dir": str(tmp_path / "state"),
                    **privacy},
        "output": str(tmp_path / "out")})


class _Recording(FedSGD):
    def apply(self, state, sums):
        self.sums = sums
        return super().apply(state, sums)


def test_masked_noisy_sum_is_exactly_the_sum_of_the_hospitals_integer_vectors(tables, dictionary, tmp_path):
    sim = build_simulation(tables, dictionary, _config(tmp_path), audit_dir=tmp_path / "audit")
    sim.server.strategy = _Recording(server_lr=1.0)
    zs = {}
    for h in sim.hospitals.values():  # keep each hospital's z (a test-only view of local state)
        original = h.task.trainer._set_local

        def keep(z, *, scale, weight, _name=h.name, _orig=original):
            zs[_name] = (z.copy(), scale)
            _orig(z, scale=scale, weight=weight)

        h.task.trainer._set_local = keep
    out = sim.run_round()
    sim.audit.close()
    assert not out.dropped and len(zs) == len(tables)
    scale = next(iter(zs.values()))[1]
    cols = next(iter(sim.hospitals.values())).task.trainer.columns
    total = cols.split(sum(z for z, _ in zs.values()).astype(np.float64))
    sums = sim.server.strategy.sums
    assert set(sums.sums) == set(cols.modules)
    for name, vec in total.items():
        assert np.array_equal(np.rint(sums.sums[name] * scale), vec), name
    weights = {t.site: 0.2 * len(sim.hospitals[t.site].task.split.train) for t in tables}
    assert sums.weights[cols.modules[0]] == pytest.approx(sum(weights.values()))



@pytest.mark.parametrize(("options", "why"), [({"fedprox.mu": 0.1}, "FedProx"), ({"graph.similar_to": True}, "similar_to")])
def test_the_distributed_trainer_refuses_a_coupled_plan_before_the_ledger(tables, dictionary, tmp_path, options, why):
    """The one distributed round (distributed_round.open_round) refuses what local DP refuses."""
    sim = build_simulation(tables, dictionary, _config(tmp_path), audit_dir=tmp_path / "audit")
    trainer = next(iter(sim.hospitals.values())).task.trainer
    with pytest.raises(PrivacyError, match=why):
        trainer.begin_round(round_=0, epochs=1, plan_options=options)
    sim.audit.close()
    assert trainer.ledger.entries == [] and trainer._round is None

def test_ledgers_record_the_guarantee_and_what_the_hospital_would_have_alone(tables, dictionary, tmp_path):
    sim = build_simulation(tables, dictionary, _config(tmp_path), audit_dir=tmp_path / "audit")
    for _ in range(2):
        sim.run_round()
    sim.audit.close()
    entries = [json.loads(x) for x in (tmp_path / "audit" / "audit.jsonl").read_text().splitlines()]
    assert not [e for e in entries if e["kind"] == "update_rejected"]
    led = json.loads((tmp_path / "state" / "alpha" / "distributed_ledger.json").read_text())["entries"]
    assert [e["round"] for e in led] == [0, 1]
    last = led[-1]
    assert last["mechanism"] == "skellam" and last["min_honest"] == 2
    assert last["noise_multiplier_alone"] == pytest.approx(1.0 / np.sqrt(2))
    assert 0 < led[0]["epsilon"] < last["epsilon"] < last["epsilon_alone"]
    audited = [e["payload"] for e in entries if e["kind"] == "ledger" and e["payload"]["client"] == "alpha"]
    assert audited[-1]["epsilon"] == last["epsilon"] and audited[-1]["accountant"] == "skellam-h2"


def test_a_hospital_whose_privacy_differs_from_the_policy_refuses_to_start(tables, dictionary, tmp_path):
    from clinograph.sdk.federation.dp_policy import distributed_policy
    from clinograph.sdk.federation.nsfl_task import NSFLTask
    from clinograph.sdk.federation.split import hospital_split

    cfg = _config(tmp_path)
    policy = distributed_policy(cfg).distributed()
    bad = cfg.hospital_config().model_copy(update={"privacy": cfg.privacy.model_copy(update={"clip_norm": 2.0})})
    t = tables[0]
    with pytest.raises(PrivacyError, match="differs from the federation's"):
        NSFLTask(t, dictionary=dictionary, config=bad, policy=policy, state_dir=tmp_path / "x",
                 signer=Identity.generate(t.site),
                 split=hospital_split(t.labels, site=t.site, test_fraction=0.3, validation_fraction=0.0, seed=0))


def test_the_server_refuses_a_hospital_that_adds_less_noise_than_the_policy(tables, dictionary, tmp_path):
    """A hospital that declares (and adds) half the noise share is refused, audited, every round."""
    import dataclasses

    sim = build_simulation(tables, dictionary, _config(tmp_path), audit_dir=tmp_path / "audit")
    cheat = sim.hospitals["alpha"].task.trainer
    cheat.policy = dataclasses.replace(cheat.policy, noise_multiplier=cheat.policy.noise_multiplier / 2)
    sim.run_round()
    sim.audit.close()
    entries = [json.loads(x) for x in (tmp_path / "audit" / "audit.jsonl").read_text().splitlines()]
    rejected = [e["payload"] for e in entries if e["kind"] == "update_rejected"]
    assert [p["client"] for p in rejected] == ["alpha"]
    assert "noise multiplier" in rejected[0]["reason"] and "is not the federation's" in rejected[0]["reason"]
    shares = [e["payload"]["share"] for e in entries if e["kind"] == "ledger"]
    assert shares and all(s["mechanism"] == "skellam" and s["epsilon_alone"] > 0 for s in shares)


def test_build_server_refuses_a_distributed_policy_that_cannot_keep_its_promise(tables, dictionary, tmp_path):
    """The server builder (every deployment goes through it) checks the promise, not only simulations."""
    from clinograph.sdk.federation.build import initial_model_for
    from clinograph.secure.audit import AuditTrail
    from clinograph.secure.runtime import build_server
    from clinograph.secure.runtime.config import DPPolicySection, FederationSection

    from clinograph.core.errors import ConfigError
    from clinograph.core.identity import Identity

    cfg = _config(tmp_path)
    ids = {t.site: Identity.generate(t.site).public for t in tables}
    server_id = Identity.generate("server")
    initial = initial_model_for(cfg.hospital_config(), dictionary=dictionary)
    messages = []
    for h, sigma in ((len(tables) + 1, 1.0), (2, 0.3)):  # h above the hospitals; a σ too small for ε = 1
        policy = DPPolicySection(max_epsilon=1.0, delta=1e-5, max_clip_norm=1.0, min_noise_multiplier=0.0,
                                 mode="distributed", mechanism="skellam", noise_multiplier=sigma, sample_rate=0.5,
                                 min_honest=h, rounds=100)
        audit = AuditTrail(tmp_path / f"a{h}", identity=server_id)
        try:
            with pytest.raises(ConfigError) as err:
                build_server(federation=FederationSection(secure_mode="masked", strategy="fedsgd"),
                             identity=server_id, enrolled=ids, initial=initial, audit=audit, dp_policy=policy.policy())
        finally:
            audit.close()
        messages.append(str(err.value))
    assert "min_honest = 4 must be between" in messages[0]
    assert "ε" in messages[1]


def _entries(tmp_path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "audit" / "audit.jsonl").read_text().splitlines()]


def test_a_share_declared_at_another_ring_scale_is_refused(tables, dictionary, tmp_path):
    """A hospital that computes and declares its share at a million times smaller a scale than the
    plan publishes declares a consistent (σ, μ/h) pair, yet adds almost no noise in the ring: the
    server checks the share at the published masked.scale and refuses it."""
    sim = build_simulation(tables, dictionary, _config(tmp_path), audit_dir=tmp_path / "audit")
    cheat = sim.hospitals["alpha"].task
    honest = cheat.train

    def tiny(*, round_, epochs, plan_options):
        return honest(round_=round_, epochs=epochs,
                      plan_options={**plan_options, "masked.scale": float(plan_options["masked.scale"]) * 1e-6})

    cheat.train = tiny
    cheat.trainer.ledger.check_round = lambda record: 0.0  # an adversary ignores its own budget check
    sim.run_round()
    sim.audit.close()
    rejected = [e["payload"] for e in _entries(tmp_path) if e["kind"] == "update_rejected"]
    assert [p["client"] for p in rejected] == ["alpha"]
    assert "but this round's signed plan publishes masked.scale" in rejected[0]["reason"]


def test_an_understated_epsilon_alone_is_refused(tables, dictionary, tmp_path):
    sim = build_simulation(tables, dictionary, _config(tmp_path), audit_dir=tmp_path / "audit")
    ledger = sim.hospitals["alpha"].task.trainer.ledger
    honest = ledger.epsilons
    ledger.epsilons = lambda extra=None: (honest(extra)[0], honest(extra)[1] / 10)
    sim.run_round()
    sim.audit.close()
    rejected = [e["payload"] for e in _entries(tmp_path) if e["kind"] == "update_rejected"]
    assert [p["client"] for p in rejected] == ["alpha"]
    assert "epsilon_alone" in rejected[0]["reason"] and "is below" in rejected[0]["reason"]


def test_honest_rounds_pass_the_noise_test_and_say_so(tables, dictionary, tmp_path):
    sim = build_simulation(tables, dictionary, _config(tmp_path), audit_dir=tmp_path / "audit")
    sim.run_round()
    sim.audit.close()
    checks = [e["payload"] for e in _entries(tmp_path) if e["kind"] == "noise_check"]
    assert len(checks) == 1 and checks[0]["passed"] and checks[0]["contributors"] == len(tables)
    assert checks[0]["energy_ratio"] > checks[0]["threshold_ratio"]


def _without_noise(monkeypatch, tables, dictionary, tmp_path):
    """A simulation whose hospitals declare the policy's share and add none (their noise is zeros)."""
    import clinograph.sdk.privacy.distributed as distributed

    monkeypatch.setattr(distributed, "skellam_noise", lambda variance, n, source=None: np.zeros(n, dtype=np.int64))
    return build_simulation(tables, dictionary, _config(tmp_path), audit_dir=tmp_path / "audit")


def _voided_round(sim, tmp_path) -> tuple[list[dict], dict]:
    """Run a round the noise test voids; (the audit entries, the noise_check payload)."""
    with pytest.raises(Exception, match="voided"):
        sim.run_round()
    sim.audit.close()
    entries = _entries(tmp_path)
    return entries, next(e["payload"] for e in entries if e["kind"] == "noise_check")


def test_shares_declared_but_not_added_void_the_round(tables, dictionary, tmp_path, monkeypatch):
    """Every hospital declares the policy's share and adds none (its noise is zeros): the reports
    conform, the aggregate does not -- the noise test voids the round and nothing is released."""
    sim = _without_noise(monkeypatch, tables, dictionary, tmp_path)
    before = {n: v.copy() for n, v in sim.server.state.items()}
    entries, check = _voided_round(sim, tmp_path)
    assert not [e for e in entries if e["kind"] == "update_rejected"]
    assert not check["passed"] and check["energy_ratio"] < check["threshold_ratio"]
    aborted = [e["payload"] for e in entries if e["kind"] == "round_aborted"]
    assert aborted and "voided" in aborted[0]["reason"]
    assert not [e for e in entries if e["kind"] in ("aggregate", "release")]
    assert all(np.array_equal(before[n], v) for n, v in sim.server.state.items())


def test_a_share_declared_over_one_coordinate_does_not_blind_the_noise_test(tables, dictionary, tmp_path,
                                                                              monkeypatch):
    """No hospital adds noise; one declares its share over a single coordinate. The noise test
    must use the coordinates the aggregate releases (the server's number from the model spec),
    not the smallest a hospital declares: over d = 1 no aggregate could fail it."""
    sim = _without_noise(monkeypatch, tables, dictionary, tmp_path)
    ledger = sim.hospitals["alpha"].task.trainer.ledger
    honest = ledger.commit
    ledger.commit = lambda record: honest({**record, "dim": 1})
    entries, check = _voided_round(sim, tmp_path)
    assert not [e for e in entries if e["kind"] == "aggregate"]
    cols = sim.hospitals["beta"].task.trainer.columns
    assert not check["passed"] and check["dim"] == cols.dim


def test_a_share_accounted_over_fewer_coordinates_than_the_spec_releases_is_refused(tables, dictionary, tmp_path):
    """A hospital that adds its noise but accounts its ε over one coordinate (consistently, so its
    own ledger agrees) understates ε; the server's floor is at the spec's released coordinates."""
    sim = build_simulation(tables, dictionary, _config(tmp_path), audit_dir=tmp_path / "audit")
    ledger = sim.hospitals["alpha"].task.trainer.ledger
    honest = ledger.commit
    ledger.commit = lambda record: honest({**record, "dim": 1})
    sim.run_round()
    sim.audit.close()
    rejected = [e["payload"] for e in _entries(tmp_path) if e["kind"] == "update_rejected"]
    released = sum(m.size for m in sim.server.spec.shared)
    assert [p["client"] for p in rejected] == ["alpha"]
    assert rejected[0]["reason"].startswith("ProtocolError: Hospital 'alpha': its update breaks the DP policy")
    assert f"accounted over 1 coordinates, but the model spec releases {released}" in rejected[0]["reason"]


def test_hospitals_that_skip_their_noise_and_zero_their_count_slots_void_the_round(tables, dictionary, tmp_path,
                                                                                     monkeypatch):
    """Two of three hospitals add no noise and write 0 in their masked count slots: the sum then
    says one contributor per module, whose one share is exactly the noise present. The server
    takes K from the hospitals whose inputs are in the sum and requires every module counted by
    all of them; the round is voided."""
    import clinograph.sdk.privacy.distributed as distributed
    import clinograph.secure.masking.client as masked_client

    real_noise, real_encode = distributed.skellam_noise, masked_client.encode_update
    sim = build_simulation(tables, dictionary, _config(tmp_path), audit_dir=tmp_path / "audit")
    hostile = {"alpha", "beta"}
    weights = {sim.hospitals[h].task.num_samples for h in hostile}
    silent = {"on": False}

    def noise(variance, n, source=None):
        return np.zeros(n, dtype=np.int64) if silent["on"] else real_noise(variance, n, source=source)

    def encode(update, *, layout, **kw):
        parts = real_encode(update, layout=layout, **kw)
        if update.weight in weights:
            parts[1][len(layout.names):] = 0  # the count slots
        return parts

    for h in hostile:
        task = sim.hospitals[h].task
        honest = task.train

        def quiet(*, _honest=honest, **kw):
            silent["on"] = True
            try:
                return _honest(**kw)
            finally:
                silent["on"] = False

        task.train = quiet
    monkeypatch.setattr(distributed, "skellam_noise", noise)
    monkeypatch.setattr(masked_client, "encode_update", encode)
    with pytest.raises(Exception, match="voided"):
        sim.run_round()
    sim.audit.close()
    entries = _entries(tmp_path)
    assert not [e for e in entries if e["kind"] in ("aggregate", "update_rejected")]
    aborted = [e["payload"]["reason"] for e in entries if e["kind"] == "round_aborted"]
    assert aborted and "counted by other than the 3 hospitals whose inputs are in it" in aborted[0]


def test_the_noisy_sum_rounds_every_patient_row_with_the_reference_coins(monkeypatch):
    """noisy_integer_sum over PatientRows (a frozen block of zeros, a row slice of a parameter, clipping
    binding on some rows) and over BlockRows, read and rounded a block at a time in reused buffers,
    gives the integers -- and leaves the keystream where -- the definition leaves them: the whole
    clipped matrix, scaled, then randomised_round block by block and the Skellam share. Blocks of 3
    rows over 10 patients (a short last block)."""
    import clinograph.sdk.privacy.distributed as distributed
    from clinograph.sdk.privacy.distributed import BlockRows

    gen = torch.Generator().manual_seed(3)
    a = torch.randn(10, 4, 3, generator=gen) * torch.linspace(0.1, 1, 10)[:, None, None]
    b = torch.randn(10, 5, generator=gen) * 0.2
    rows = PatientRows([(6, a[:, 1:3]), (7, None), (5, b)], n=10, clip=1.0)
    dense = np.concatenate([a[:, 1:3].reshape(10, -1).double().numpy(), np.zeros((10, 7)), b.double().numpy()], 1)
    clipped = clip_rows(dense, 1.0)
    assert (np.linalg.norm(dense, axis=1) > 1).any() and (np.linalg.norm(dense, axis=1) < 1).any()
    extra = np.array([[0.3, 0.4], [0.0, -0.9]])
    block = np.zeros((12, 20))
    block[:10, :18], block[10:, 18:] = clipped, extra
    for source, reference in ((rows, clipped), (BlockRows(rows, extra), block)):
        monkeypatch.setattr(distributed, "ROW_CHUNK_BYTES", 8 * reference.shape[1] * 3)
        ref, new = CsprngUniform(_key=bytes(range(32))), CsprngUniform(_key=bytes(range(32)))
        signal = sum(randomised_round(reference[i:i + 3] * 1000.0, source=ref).sum(0) for i in range(0, 12, 3))
        want = signal + skellam(25.0, reference.shape[1], source=ref)
        z, got = noisy_integer_sum(source, scale=1000.0, share_variance=25.0, source=new)
        assert np.array_equal(got, signal) and np.array_equal(z, want) and new.raw(8) == ref.raw(8)
