"""DPTrainer: one round of DP-SGD on stars, the guards, empty Poisson batches, the noise source."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from clinograph.sdk.config import GraphSection, HospitalConfig, PrivacySection
from clinograph.sdk.model.nsfl import NSFLConfig, NSFLModel
from clinograph.sdk.privacy import (
    DPTrainer,
    PrivacyBudgetExceeded,
    PrivacyError,
    PrivacyLedger,
    dp_trainer_factory,
    secure_gaussian,
)
from clinograph.sdk.training.local import TrainConfig

from clinograph.core.identity import Identity

SIGNER = Identity.generate("alpha")  # the hospital's identity: signs every ledger here


def _trainer(table, tmp_path, *, n_train=None, batch_size=16, budget=50.0, **kw):
    ledger = PrivacyLedger(tmp_path, site=table.site, budget_epsilon=budget, delta=1e-5, signer=SIGNER)
    idx = np.arange(table.n_patients if n_train is None else n_train)
    return DPTrainer(table, train_idx=idx, ledger=ledger, noise_multiplier=kw.pop("sigma", 1.0), clip_norm=1.0,
                     batch_size=batch_size, train_config=TrainConfig(lr=0.01), **kw)


def _model(dictionary):
    return NSFLModel(len(dictionary.node_ids()), NSFLConfig(hidden=8))


def test_one_round_trains_stars_only_and_returns_its_ledger_entry(tables, dictionary, tmp_path):
    tr = _trainer(tables[0], tmp_path)
    model = _model(dictionary)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    out = tr.train(model, round_=0, epochs=2, plan_options={})
    assert out.used_similar_to is False and np.isfinite(out.loss)
    e = out.ledger
    assert (e.round, e.steps, e.noise_multiplier, e.clip_norm) == (0, tr.planned_steps(2), 1.0, 1.0)
    assert e.sample_rate == pytest.approx(1 / np.ceil(tables[0].n_patients / 16))
    assert e.epsilon == pytest.approx(tr.ledger.epsilon()) and e.epsilon > 0
    after = dict(model.named_parameters())
    assert not torch.equal(before["head.weight"], after["head.weight"])  # trained
    for name in ("l1_similar_to.W.weight", "l2_similar_to.a_src.weight"):  # frozen: no similar_to under DP
        assert torch.equal(before[name], after[name])
    assert all(p.requires_grad for p in model.parameters())  # restored
    assert all(p.grad is None for p in model.parameters())  # nothing of the last step stays on the model
    assert model._forward_hooks == {} and model.head._forward_hooks == {}  # the engine's hooks removed
    p = tr.predict(model)
    assert p.shape == (tables[0].n_patients,) and np.all((p >= 0) & (p <= 1))


def test_empty_poisson_batches_are_stepped_not_skipped(tables, dictionary, tmp_path):
    # q = 1/2 with two patients: P(empty batch) = 1/4 a step; 60 steps have one with prob. 1 - 3e-8
    tr = _trainer(tables[1], tmp_path, n_train=2, batch_size=1, sigma=1.5)
    out = tr.train(_model(dictionary), round_=0, epochs=30, plan_options={})
    assert out.extras["empty_batches"] >= 1
    assert out.ledger.steps == 60  # every step, empty or not, is accounted


def test_budget_refusal_happens_before_any_training(tables, dictionary, tmp_path):
    tr = _trainer(tables[1], tmp_path, budget=0.5)
    model = _model(dictionary)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(PrivacyBudgetExceeded, match=r"Hospital 'beta': round 0 would take ε from 0\.000 to .* "
                                                    r"past its budget ε = 0\.5\. Refused before training\."):
        tr.train(model, round_=0, epochs=1, plan_options={})
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert tr.ledger.history == [] and not (tmp_path / "privacy_ledger.json").exists()


def test_adaptive_clipping_runs_and_reports_its_maximum_clip(tables, dictionary, tmp_path):
    tr = _trainer(tables[2], tmp_path, clipping="adaptive", adaptive={"max_clipbound": 1.0, "min_clipbound": 0.05})
    out = tr.train(_model(dictionary), round_=0, epochs=1, plan_options={})
    assert out.ledger.clip_norm == 1.0 and out.ledger.steps == tr.planned_steps(1)
    assert 0.05 <= tr.adaptive_clip.clip <= 1.0  # carried across rounds, within its range


def test_the_opacus_modes_are_refused_with_the_reason():
    for mode in ("hooks", "ew"):
        with pytest.raises(ValueError, match=f"grad_sample_mode = '{mode}' .* was removed: every DP task uses the "
                                             "per-patient engine"):
            PrivacySection(enabled=True, grad_sample_mode=mode)


def test_full_graph_and_similar_to_are_refused_under_dp(tables, tmp_path):
    with pytest.raises(PrivacyError, match=r"k_similar = 5\); refused: under patient-level DP every patient must be "
                                           r"one independent training example"):
        _trainer(tables[0], tmp_path, k_similar=5)
    tr = _trainer(tables[0], tmp_path)
    with pytest.raises(PrivacyError, match="asks for similar_to training under DP"):
        tr.train(NSFLModel(5), round_=0, epochs=1, plan_options={"graph.similar_to": True})
    with pytest.raises(PrivacyError, match="FedProx"):
        tr.train(NSFLModel(5), round_=0, epochs=1, plan_options={"fedprox.mu": 0.1})
    dp_on = PrivacySection(enabled=True, noise_multiplier=1.0)
    with pytest.raises(ValueError, match=r"\[graph\] k_similar = 5 with \[privacy\] enabled"):  # refused once, up front
        HospitalConfig(privacy=dp_on, graph=GraphSection(k_similar=5))
    assert HospitalConfig(privacy=dp_on).graph.k_similar == 0  # unwritten: 0 under DP (was 5, refused by every hospital)
    cfg = HospitalConfig(privacy=dp_on).model_copy(update={"graph": GraphSection(k_similar=5)})  # past the config
    with pytest.raises(PrivacyError, match="Fix: set \\[graph\\] k_similar = 0"):
        dp_trainer_factory(table=tables[0], train_idx=np.arange(10), config=cfg, site="alpha", state_dir=tmp_path, signer=SIGNER)
    with pytest.raises(PrivacyError, match="enabled = true"):
        dp_trainer_factory(table=tables[0], train_idx=np.arange(10), config=HospitalConfig(graph=GraphSection(k_similar=0)),
                           site="alpha", state_dir=tmp_path, signer=SIGNER)
    with pytest.raises(PrivacyError, match="planned_rounds"):
        dp_trainer_factory(table=tables[0], train_idx=np.arange(10), site="alpha", state_dir=tmp_path, signer=SIGNER,
                           config=HospitalConfig(privacy=PrivacySection(enabled=True), graph=GraphSection(k_similar=0)))


def test_factory_calibrates_sigma_when_none_is_given(tables, tmp_path):
    cfg = HospitalConfig(privacy=PrivacySection(enabled=True, epsilon_budget=8.0, planned_rounds=3,
                                                planned_local_epochs=2, batch_size=16), graph=GraphSection(k_similar=0))
    tr = dp_trainer_factory(table=tables[0], train_idx=np.arange(80), config=cfg, site="alpha", state_dir=tmp_path, signer=SIGNER)
    steps = 3 * 2 * tr.steps_per_epoch
    eps = tr.ledger.epsilon([(tr.noise_multiplier, tr.sample_rate, steps)])
    assert 7.9 <= eps <= 8.0


def test_secure_gaussian_is_gaussian_with_the_right_scale_and_fresh_each_call():
    z = secure_gaussian(2.0, torch.Size([200_000]), torch.float64).numpy()
    assert abs(z.mean()) < 0.03 and abs(z.std() - 2.0) < 0.02
    kurtosis = ((z - z.mean()) ** 4).mean() / z.var() ** 2
    assert abs(kurtosis - 3.0) < 0.1
    assert not np.array_equal(secure_gaussian(1.0, torch.Size([8]), torch.float64),
                              secure_gaussian(1.0, torch.Size([8]), torch.float64))


class _FailsOnThirdBatch(NSFLModel):
    armed = False
    calls = 0

    def forward(self, feature_index, values, mask):
        if self.armed:
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("simulated crash mid-round")
        return super().forward(feature_index, values, mask)


def test_steps_taken_before_a_crash_are_still_accounted(tables, dictionary, tmp_path):
    tr = _trainer(tables[0], tmp_path)
    model = _FailsOnThirdBatch(len(dictionary.node_ids()), NSFLConfig(hidden=8))
    tr.train(model, round_=0, epochs=1, plan_options={})  # a full round first: the crash is in a later one
    model.armed = True
    with pytest.raises(RuntimeError, match="simulated crash"):
        tr.train(model, round_=1, epochs=1, plan_options={})
    reread = PrivacyLedger(tmp_path, site=tables[0].site, budget_epsilon=50.0, delta=1e-5, signer=SIGNER)
    assert sum(t for *_, t in reread.history) == tr.steps_per_epoch + 2 and reread.epsilon() > 0


def test_engine_optimizer_and_accountant_are_built_once_and_carried_across_rounds(tables, dictionary, tmp_path):
    tr = _trainer(tables[1], tmp_path)
    model = _model(dictionary)
    accountant = tr.accountant
    epochs = (1, 2, 1)
    for r, e in enumerate(epochs):
        out = tr.train(model, round_=r, epochs=e, plan_options={})
        assert out.ledger.steps == tr.planned_steps(e)
        if r == 0:
            wrapped = (tr._opt, tr._clipper)
    assert tr.builds == 1 and tr.accountant is accountant
    assert (tr._opt, tr._clipper) == wrapped
    total = sum(tr.planned_steps(e) for e in epochs)
    assert sum(t for *_, t in accountant.history) == total == sum(t for *_, t in tr.ledger.history)
    reread = PrivacyLedger(tmp_path, site=tables[1].site, budget_epsilon=50.0, delta=1e-5, signer=SIGNER)
    assert reread.epsilon() == pytest.approx(tr.ledger.epsilon()) and reread.epsilon() > 0
    assert model._forward_hooks == {} and model.head._forward_hooks == {}  # nothing left on the model between rounds
    tr.train(_model(dictionary), round_=3, epochs=1, plan_options={})  # another model object: rebuilt for it
    assert tr.builds == 2


def test_poisson_sampling_comes_from_the_csprng_not_torch_or_numpy(tables, dictionary, tmp_path):
    from clinograph.sdk.privacy.trainer import poisson_indices
    from clinograph.secure.hazmat.discrete_noise import CsprngUniform

    draws = []
    for run in range(2):  # the same torch and numpy seeds: different patients sampled
        torch.manual_seed(0)
        np.random.seed(0)
        tr = _trainer(tables[0], tmp_path / str(run), batch_size=16)
        assert isinstance(tr.sampler, CsprngUniform)
        draws.append([poisson_indices(tables[0].n_patients, tr.sample_rate, tr.sampler).tolist()
                      for _ in range(5)])
    assert draws[0] != draws[1]
    torch.manual_seed(0)
    state = torch.get_rng_state()
    q, n, steps = 0.2, 500, 40
    sizes = [len(poisson_indices(n, q, CsprngUniform())) for _ in range(steps)]
    assert torch.equal(torch.get_rng_state(), state)  # torch's generator is never consumed
    se = np.sqrt(q * (1 - q) / (n * steps))
    assert abs(np.mean(sizes) / n - q) < 6 * se  # each patient joins with probability q
    assert np.std(sizes) > 0  # batch sizes vary (Poisson, not fixed-size)


def test_dp_training_honours_the_wide_rows_learning_rate(tables, dictionary, tmp_path):
    """[training] wide_lr_factor is not silently dropped under DP: Adam moves each row by at most about
    its lr a step, so at factor 1e-3 the wide rows move < 2·lr·1e-3·steps while the rest moves freely."""
    moved = {}
    for factor in (1.0, 1e-3):
        ledger = PrivacyLedger(tmp_path / str(factor), site=tables[0].site, budget_epsilon=50.0, delta=1e-5,
                               signer=SIGNER)
        tr = DPTrainer(tables[0], train_idx=np.arange(tables[0].n_patients), ledger=ledger, noise_multiplier=1.0,
                       clip_norm=1.0, batch_size=16,
                       train_config=TrainConfig(lr=0.01, wide_lr_factor=factor))
        model = NSFLModel(len(dictionary.node_ids()), NSFLConfig(hidden=8, linear_shape=True))
        before = model.linear.weight.detach().clone()
        tr.train(model, round_=0, epochs=1, plan_options={})
        moved[factor] = float((model.linear.weight.detach() - before).abs().max())
        steps = tr.planned_steps(1)
    assert moved[1e-3] < 2 * 0.01 * 1e-3 * steps
    assert moved[1.0] > 10 * 2 * 0.01 * 1e-3 * steps


def test_an_explicit_mask_lr_factor_under_dp_is_not_silently_ignored(tables, tmp_path):
    ledger = PrivacyLedger(tmp_path, site=tables[0].site, budget_epsilon=50.0, delta=1e-5, signer=SIGNER)
    with pytest.warns(UserWarning, match="mask_lr_factor applies to non-DP training only"):
        DPTrainer(tables[0], train_idx=np.arange(10), ledger=ledger, noise_multiplier=1.0, clip_norm=1.0,
                  batch_size=4, train_config=TrainConfig(lr=0.01, mask_lr_factor=3.0))


def test_a_default_mask_lr_factor_that_reads_as_set_does_not_warn(tables, tmp_path, recwarn):
    """A candidate's config is re-validated from a full dump, so every field reads as set: the
    warning is for a changed value, not for the default written out."""
    ledger = PrivacyLedger(tmp_path, site=tables[0].site, budget_epsilon=50.0, delta=1e-5, signer=SIGNER)
    DPTrainer(tables[0], train_idx=np.arange(10), ledger=ledger, noise_multiplier=1.0, clip_norm=1.0, batch_size=4,
              train_config=TrainConfig.model_validate(TrainConfig(lr=0.01).model_dump()))
    assert not [w for w in recwarn if "mask_lr_factor" in str(w.message)]
