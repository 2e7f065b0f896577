"""PrivacyLedger: composition across rounds and runs, refusal before training; ε is recomputed from the
stored history on load, never read back from the file (an edited number cannot admit a round)."""

from __future__ import annotations

import json

import pytest
from clinograph.sdk.privacy import (
    PrivacyBudgetExceeded,
    PrivacyError,
    PrivacyLedger,
)
from clinograph.sdk.privacy.accountant import normalise
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus.accountants import RDPAccountant

from clinograph.core.identity import Identity

DELTA = 1e-5
SIGNER = Identity.generate("alpha")  # the hospital's identity: every ledger is signed


def _run_round(ledger: PrivacyLedger, *, round_: int, sigma: float, q: float, steps: int):
    """What DPTrainer does around training: restore, check, let Opacus step, commit."""
    ledger.check_round(round_=round_, noise_multiplier=sigma, sample_rate=q, steps=steps)
    acc = ledger.make_accountant()
    for _ in range(steps):
        acc.step(noise_multiplier=sigma, sample_rate=q)
    return ledger.commit(round_=round_, history=acc.history, noise_multiplier=sigma, sample_rate=q, clip_norm=1.0)


def test_epsilon_composes_over_every_step_of_every_round_and_run(tmp_path):
    plan = [(1.1, 0.05, 20), (1.1, 0.05, 20), (0.9, 0.1, 10), (1.3, 0.02, 50)]
    single = RDPAccountant()
    for r, (sigma, q, steps) in enumerate(plan):
        ledger = PrivacyLedger(tmp_path, site="alpha", budget_epsilon=100.0, delta=DELTA, signer=SIGNER)  # a new run each round
        entry = _run_round(ledger, round_=r, sigma=sigma, q=q, steps=steps)
        for _ in range(steps):
            single.step(noise_multiplier=sigma, sample_rate=q)
        assert entry.epsilon == pytest.approx(single.get_epsilon(delta=DELTA), rel=1e-12)
        assert (entry.round, entry.steps, entry.noise_multiplier, entry.sample_rate) == (r, steps, sigma, q)
        assert (entry.accountant, entry.delta, entry.budget_epsilon) == ("rdp", DELTA, 100.0)
    reread = PrivacyLedger(tmp_path, site="alpha", budget_epsilon=100.0, delta=DELTA, signer=SIGNER)
    assert reread.epsilon() == pytest.approx(single.get_epsilon(delta=DELTA), rel=1e-12)
    assert sum(t for *_, t in reread.history) == sum(t for *_, t in plan)
    assert [e["round"] for e in reread.entries] == list(range(len(plan)))
    assert reread.computations == 1  # recomputed once from the stored history (no ε is trusted from disk)


def test_a_round_past_the_budget_is_refused_before_training(tmp_path):
    probe = PrivacyLedger(tmp_path / "probe", site="alpha", budget_epsilon=100.0, delta=DELTA, signer=SIGNER)
    after_one = probe.project(noise_multiplier=1.0, sample_rate=0.1, steps=30)
    after_two = probe.epsilon([(1.0, 0.1, 60)])
    budget = round((after_one + after_two) / 2, 3)
    ledger = PrivacyLedger(tmp_path / "h", site="alpha", budget_epsilon=budget, delta=DELTA, signer=SIGNER)
    _run_round(ledger, round_=0, sigma=1.0, q=0.1, steps=30)
    before = (tmp_path / "h" / "privacy_ledger.json").read_bytes()
    msg = (rf"Hospital 'alpha': round 1 would take ε from {after_one:.3f} to {after_two:.3f} \(δ = 1e-05, 30 steps "
           rf"at σ = 1, q = 0.1\), past its budget ε = {budget:g}\. Refused before training\.")
    with pytest.raises(PrivacyBudgetExceeded, match=msg):
        ledger.check_round(round_=1, noise_multiplier=1.0, sample_rate=0.1, steps=30)
    assert (tmp_path / "h" / "privacy_ledger.json").read_bytes() == before
    # a new run on the same state dir is refused too: the history was restored
    again = PrivacyLedger(tmp_path / "h", site="alpha", budget_epsilon=budget, delta=DELTA, signer=SIGNER)
    with pytest.raises(PrivacyBudgetExceeded):
        again.check_round(round_=1, noise_multiplier=1.0, sample_rate=0.1, steps=30)
    # ... while a fresh state dir (no history) would have allowed it: the refusal is the history's doing
    PrivacyLedger(tmp_path / "fresh", site="alpha", budget_epsilon=budget, delta=DELTA, signer=SIGNER).check_round(
        round_=0, noise_multiplier=1.0, sample_rate=0.1, steps=30)


def test_epsilon_is_cached_by_history(tmp_path):
    ledger = PrivacyLedger(tmp_path, site="alpha", budget_epsilon=50.0, delta=DELTA, signer=SIGNER)
    projected = ledger.check_round(round_=0, noise_multiplier=1.0, sample_rate=0.05, steps=40)
    assert ledger.computations == 1
    entry = _run_round(ledger, round_=0, sigma=1.0, q=0.05, steps=40)  # check + commit hit the cache
    assert ledger.computations == 1 and entry.epsilon == projected
    for _ in range(5):
        ledger.epsilon()
    assert ledger.computations == 1
    ledger.project(noise_multiplier=1.0, sample_rate=0.05, steps=41)
    assert ledger.computations == 2  # a different history is a miss


def test_unreadable_or_foreign_ledger_is_refused(tmp_path):
    _run_round(PrivacyLedger(tmp_path, site="alpha", budget_epsilon=50.0, delta=DELTA, signer=SIGNER),
               round_=0, sigma=1.0, q=0.05, steps=5)
    with pytest.raises(PrivacyError, match="not a clinograph/privacy-ledger/v1 ledger of hospital 'beta'"):
        PrivacyLedger(tmp_path, site="beta", budget_epsilon=50.0, delta=DELTA, signer=SIGNER)
    (tmp_path / "privacy_ledger.json").write_text("{truncated")
    with pytest.raises(PrivacyError, match="unreadable"):
        PrivacyLedger(tmp_path, site="alpha", budget_epsilon=50.0, delta=DELTA, signer=SIGNER)


def test_commit_refuses_a_history_that_does_not_extend_the_stored_one(tmp_path):
    ledger = PrivacyLedger(tmp_path, site="alpha", budget_epsilon=50.0, delta=DELTA, signer=SIGNER)
    _run_round(ledger, round_=0, sigma=1.0, q=0.05, steps=10)
    with pytest.raises(PrivacyError, match="does not extend"):
        ledger.commit(round_=1, history=[(1.0, 0.05, 3)], noise_multiplier=1.0, sample_rate=0.05, clip_norm=1.0)


@settings(max_examples=5, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.8, 1.2]), st.sampled_from([0.05, 0.2]), st.integers(1, 30)),
                min_size=1, max_size=3))
def test_merging_history_never_changes_epsilon(plan):
    raw = RDPAccountant()
    raw.history = list(plan)
    merged = RDPAccountant()
    merged.history = normalise(plan)
    assert merged.get_epsilon(delta=DELTA) == pytest.approx(raw.get_epsilon(delta=DELTA), rel=1e-12)


def test_state_file_is_plain_json_without_patient_data(tmp_path):
    _run_round(PrivacyLedger(tmp_path, site="alpha", budget_epsilon=50.0, delta=DELTA, signer=SIGNER),
               round_=0, sigma=1.0, q=0.05, steps=5)
    state = json.loads((tmp_path / "privacy_ledger.json").read_text())
    assert set(state) == {"format", "site", "history", "releases", "entries", "signature"}  # no cached ε to tamper with
    assert state["history"] == [[1.0, 0.05, 5]]


@pytest.mark.parametrize(("budget", "delta"), [(float("inf"), DELTA), (0.0, DELTA), (float("nan"), DELTA), (5.0, 1.0)])
def test_a_budget_must_be_finite_and_positive(tmp_path, budget, delta):
    with pytest.raises(PrivacyError, match="needs a finite ε > 0 and 0 < δ < 1"):
        PrivacyLedger(tmp_path, site="alpha", budget_epsilon=budget, delta=delta, signer=SIGNER)


def test_zero_noise_is_refused_as_infinite_epsilon(tmp_path):
    ledger = PrivacyLedger(tmp_path, site="alpha", budget_epsilon=1e6, delta=DELTA, signer=SIGNER)
    with pytest.raises(PrivacyBudgetExceeded, match="to inf"):
        ledger.check_round(round_=0, noise_multiplier=0.0, sample_rate=0.1, steps=1)


def test_begin_round_restores_a_stale_accountant_and_interrupted_rounds_count(tmp_path):
    ledger = PrivacyLedger(tmp_path, site="alpha", budget_epsilon=100.0, delta=DELTA, signer=SIGNER)
    _run_round(ledger, round_=0, sigma=1.0, q=0.1, steps=5)
    stale = ledger.make_accountant([])  # e.g. an accountant left behind by a failed commit
    acc = ledger.begin_round(stale, round_=1, noise_multiplier=1.0, sample_rate=0.1, steps=5)
    assert acc is not stale and normalise(acc.history) == ledger.history
    current = ledger.make_accountant()
    assert ledger.begin_round(current, round_=1, noise_multiplier=1.0, sample_rate=0.1, steps=5) is current
    before = (tmp_path / "privacy_ledger.json").read_bytes()
    ledger.commit_interrupted(acc, round_=1, noise_multiplier=1.0, sample_rate=0.1, clip_norm=1.0)
    assert (tmp_path / "privacy_ledger.json").read_bytes() == before, "no step taken: nothing to record"
    for _ in range(3):  # the round fails after 3 of its 5 steps
        acc.step(noise_multiplier=1.0, sample_rate=0.1)
    ledger.commit_interrupted(acc, round_=1, noise_multiplier=1.0, sample_rate=0.1, clip_norm=1.0)
    assert sum(t for *_, t in ledger.history) == 8
    assert PrivacyLedger(tmp_path, site="alpha", budget_epsilon=100.0, delta=DELTA, signer=SIGNER).entries[-1]["steps"] == 3
