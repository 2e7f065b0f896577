"""Private model choice (sdk/privacy/selection.py): the validation loss released under DP,
composed with DP-SGD in one ledger, checked by the server, calibrated together."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clinograph.sdk.config import (
    GraphSection,
    NSFLConfig,
    PrivacySection,
    SelectionSection,
    SimulationConfig,
)
from clinograph.sdk.federation.simulate import simulate
from clinograph.sdk.privacy import PrivacyBudgetExceeded, PrivacyLedger
from clinograph.sdk.privacy.accountant import rdp_epsilon
from clinograph.sdk.privacy.selection import PrivateValidation, clipped_loss_sum, plan_noise
from clinograph.secure.dp_checks import check_ledger
from clinograph.secure.messages import DPPolicy
from clinograph.secure.runtime.config import FederationSection
from hypothesis import given, settings
from hypothesis import strategies as st

from clinograph.core.identity import Identity

DELTA = 1e-5
SIGNER = Identity.generate("alpha")


def _train(ledger: PrivacyLedger, *, round_: int, sigma: float = 1.0, q: float = 0.1, steps: int = 10):
    ledger.check_round(round_=round_, noise_multiplier=sigma, sample_rate=q, steps=steps)
    acc = ledger.make_accountant()
    for _ in range(steps):
        acc.step(noise_multiplier=sigma, sample_rate=q)
    return ledger.commit(round_=round_, history=acc.history, noise_multiplier=sigma, sample_rate=q, clip_norm=1.0)


def test_releases_compose_with_training_in_one_rdp_sum_and_survive_a_reload(tmp_path):
    ledger = PrivacyLedger(tmp_path, site="alpha", budget_epsilon=50.0, delta=DELTA, signer=SIGNER)
    ledger.commit_release(round_=0, noise_multiplier=5.0, purpose="selection")
    entry = _train(ledger, round_=0)
    ledger.commit_release(round_=1, noise_multiplier=5.0, purpose="selection")
    second = _train(ledger, round_=1)
    both = [(1.0, 0.1, 20), (5.0, 1.0, 2)]
    assert second.epsilon == pytest.approx(rdp_epsilon(both, DELTA))
    assert second.epsilon_training == pytest.approx(rdp_epsilon([(1.0, 0.1, 20)], DELTA))
    assert second.epsilon_selection == pytest.approx(rdp_epsilon([(5.0, 1.0, 2)], DELTA))
    # composed before the conversion: more than either part, less than their sum
    assert max(second.epsilon_training, second.epsilon_selection) < second.epsilon
    assert second.epsilon < second.epsilon_training + second.epsilon_selection
    assert [(r.noise_multiplier, r.count, r.purpose) for r in entry.releases] == [(5.0, 1, "selection")]
    again = PrivacyLedger(tmp_path, site="alpha", budget_epsilon=50.0, delta=DELTA, signer=SIGNER)
    assert again.epsilon() == pytest.approx(second.epsilon)
    assert again.epsilon_parts()["selection"] == pytest.approx(second.epsilon_selection)


def test_a_release_past_the_budget_is_refused_before_anything_is_recorded(tmp_path):
    ledger = PrivacyLedger(tmp_path, site="alpha", budget_epsilon=1.0, delta=DELTA, signer=SIGNER)
    release = PrivateValidation(ledger, noise_multiplier=0.5, clip=1.0)
    with pytest.raises(PrivacyBudgetExceeded, match="selection release of round 3"):
        release.release(np.ones(10), round_=3)
    assert ledger.releases == [] and ledger.epsilon() == 0.0


def test_an_edited_release_list_is_refused_by_the_signature(tmp_path):
    from clinograph.core.errors import PrivacyError

    ledger = PrivacyLedger(tmp_path, site="alpha", budget_epsilon=50.0, delta=DELTA, signer=SIGNER)
    ledger.commit_release(round_=0, noise_multiplier=5.0, purpose="selection")
    path = tmp_path / "privacy_ledger.json"
    state = json.loads(path.read_text())
    state["releases"] = []  # "forget" the release
    path.write_text(json.dumps(state))
    with pytest.raises(PrivacyError, match="privacy_ledger.json"):
        PrivacyLedger(tmp_path, site="alpha", budget_epsilon=50.0, delta=DELTA, signer=SIGNER)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=-5, max_value=1e6, allow_nan=False), min_size=0, max_size=40),
       st.floats(min_value=-5, max_value=1e6, allow_nan=False), st.floats(min_value=0.1, max_value=5))
def test_one_patient_moves_the_clipped_sum_by_at_most_the_clip(losses, extra, clip):
    """The sensitivity the accountant assumes: adding or removing one patient moves it by ≤ B."""
    a = clipped_loss_sum(np.asarray(losses), clip=clip)
    b = clipped_loss_sum(np.asarray([*losses, extra]), clip=clip)
    assert -1e-9 <= b - a <= clip + 1e-9  # float summation order: equal up to rounding


def test_a_non_finite_loss_counts_as_the_clip_not_as_infinity():
    assert clipped_loss_sum(np.array([np.inf, np.nan, 0.5]), clip=2.0) == pytest.approx(4.5)


def test_the_release_noise_has_the_accounted_scale(tmp_path):
    """σ_s·B is the standard deviation the ledger's RDP assumes; a release with less noise would
    be under-accounted. 400 releases (each a signed ledger write: ~3 s): the sample std is within 18 %
    of σ_s·B -- its relative sd is 1/√800 = 3.5 %, so 5 sd (a false failure ~1e-6; 12 % was 3.4 sd,
    ~7e-4 a run) -- and still far inside any mis-scaling (σ without B is off by 100 %)."""
    ledger = PrivacyLedger(tmp_path, site="alpha", budget_epsilon=1e9, delta=DELTA, signer=SIGNER)
    release = PrivateValidation(ledger, noise_multiplier=3.0, clip=0.5)
    losses = np.full(20, 0.2)
    draws = np.array([release.release(losses, round_=r) for r in range(400)])
    assert abs(draws.mean() - 4.0) < 5 * 1.5 / np.sqrt(400)
    assert draws.std() == pytest.approx(1.5, rel=0.18)
    assert sum(c for _, c, _ in ledger.releases) == 400


@pytest.mark.parametrize("share", [0.05, 0.2])
def test_the_plan_spends_the_target_together_and_the_share_alone(share):
    plan = plan_noise(target_epsilon=3.0, delta=DELTA, sample_rate=0.05, steps=400, releases=12, selection_share=share)
    together = rdp_epsilon([(plan.noise_multiplier, 0.05, 400), (plan.selection_noise_multiplier, 1.0, 12)], DELTA)
    assert 2.97 <= together <= 3.0
    # the releases take `share` of the Rényi divergence DP-SGD alone has at the order binding the target
    from clinograph.sdk.privacy.accountant import rdp_spent

    sigma0 = plan_noise(target_epsilon=3.0, delta=DELTA, sample_rate=0.05, steps=400, releases=12,
                        selection_share=1e-9).noise_multiplier
    _, alpha, budget = rdp_spent([(sigma0, 0.05, 400)], DELTA)
    assert 12 * alpha / (2 * plan.selection_noise_multiplier**2) == pytest.approx(share * budget, rel=1e-2)
    alone = plan_noise(target_epsilon=3.0, delta=DELTA, sample_rate=0.05, steps=400, releases=12,
                       selection_share=share / 4)
    assert alone.noise_multiplier < plan.noise_multiplier  # a bigger selection share costs DP-SGD noise


def test_the_server_floor_counts_the_releases(tmp_path):
    """A hospital that released validation sums but declares the training ε alone is caught."""
    ledger = PrivacyLedger(tmp_path, site="alpha", budget_epsilon=50.0, delta=DELTA, signer=SIGNER)
    ledger.commit_release(round_=0, noise_multiplier=2.0, purpose="selection")
    honest = _train(ledger, round_=0)
    policy = DPPolicy(required=True, max_epsilon=50.0, delta=DELTA, min_noise_multiplier=0.5, max_clip_norm=1.0)
    problems, _ = check_ledger(honest, previous=None, policy=policy)
    assert problems == []
    lying = honest.model_copy(update={"epsilon": honest.epsilon_training})
    problems, _ = check_ledger(lying, previous=None, policy=policy)
    assert any("below" in p and "RDP bound" in p for p in problems)


def test_an_evaluation_round_that_released_may_raise_epsilon_without_steps(tmp_path):
    ledger = PrivacyLedger(tmp_path, site="alpha", budget_epsilon=50.0, delta=DELTA, signer=SIGNER)
    first = _train(ledger, round_=0)
    policy = DPPolicy(required=True, max_epsilon=50.0, delta=DELTA, min_noise_multiplier=0.5, max_clip_norm=1.0)
    _, track = check_ledger(first, previous=None, policy=policy)
    ledger.commit_release(round_=1, noise_multiplier=2.0, purpose="selection")
    evaluation = ledger.release_entry(round_=1, noise_multiplier=1.0, sample_rate=0.1, clip_norm=1.0)
    assert evaluation.steps == 0 and evaluation.epsilon > first.epsilon
    problems, _ = check_ledger(evaluation, previous=track, policy=policy)
    assert problems == []
    silent = evaluation.model_copy(update={"releases": []})  # the same rise, no release declared
    problems, _ = check_ledger(silent, previous=track, policy=policy)
    assert any("zero steps" in p for p in problems)


def _dp_config(tmp_path, *, candidates=None, budget: float = 20.0) -> SimulationConfig:
    return SimulationConfig(
        federation=FederationSection(rounds=3, secure_mode="masked", local_epochs=1, min_clients=2),
        model=NSFLConfig(hidden=8), graph=GraphSection(k_similar=0),
        privacy=PrivacySection(enabled=True, epsilon_budget=budget, clip_norm=1.0, batch_size=16,
                               state_dir=tmp_path / "state"),
        selection=SelectionSection(enabled=True, candidates=candidates), output=tmp_path / "out")


def _audit(path):
    return [json.loads(x) for x in (path / "audit.jsonl").read_text().splitlines()]


def test_a_dp_federation_chooses_among_the_default_candidates_within_its_budget(tables, dictionary, tmp_path):
    """Candidates, successive halving, the kept round and the evaluation rounds all run under DP;
    every hospital's ε stays within its budget (σ, σ_s planned over the whole choice), every
    ledger entry the server accepted carries its releases, and nothing is refused."""
    simulate(tables, dictionary, _dp_config(tmp_path), audit_dir=tmp_path / "audit")
    entries = _audit(tmp_path / "audit")
    kinds = [e["kind"] for e in entries]
    assert "model_chosen" in kinds and "candidates_eliminated" in kinds
    assert "hospital_refused" not in kinds and "update_rejected" not in kinds
    ledgers = [e["payload"] for e in entries if e["kind"] == "ledger"]
    assert ledgers and all(p["releases"] and p["epsilon_selection"] > 0 for p in ledgers)
    for t in tables:
        mine = [p for p in ledgers if p["client"] == t.site]
        assert max(p["epsilon"] for p in mine) <= 20.0
        assert mine[-1]["epsilon_training"] < mine[-1]["epsilon"]
        assert sum(r["count"] for p in mine for r in p["releases"]) == len(mine)  # one release a round


def test_selection_under_subsampled_distributed_dp_is_refused_with_its_reason(tmp_path):
    with pytest.raises(ValueError, match="subsampled accountant does not cover"):
        SimulationConfig(privacy=PrivacySection(enabled=True, mode="distributed", sample_rate=0.2, min_honest=2),
                         selection=SelectionSection(enabled=True), output=tmp_path)
