"""The noise-aware selection rule (secure/runtime/selection.py): a released loss is worse only
beyond its known noise; the kept round is the latest not worse; without noise, the rule of old."""

from __future__ import annotations

import math
import random

import pytest
from clinograph.secure.messages import GlobalModel
from clinograph.secure.runtime.selection import (
    NOISE_Z,
    SelectionRule,
    SelectionStatus,
    SelectionTracker,
    released_loss_noise,
)

RULE = SelectionRule(patience=5, min_delta=1e-4)


def _status(name: str, scored: int, loss: float, noise: float | None = None) -> SelectionStatus:
    return SelectionStatus(federation_id="fed", round=scored, client=name, scored=scored, loss=loss, noise=noise)


def _feed(tracker: SelectionTracker, losses, noise: float) -> None:
    for r, x in enumerate(losses):
        tracker.observe({"a": _status("a", r, x, noise or None)})
        if tracker.should_stop:
            return


def _old_rule(losses, *, patience: int, min_delta: float) -> tuple[int, int]:
    """The rule before session 54, written out: (kept round, last round scored)."""
    best, best_round, bad = math.inf, None, 0
    for r, x in enumerate(losses):
        if best_round is None or x < best - min_delta:
            best, best_round, bad = x, r, 0
        else:
            bad += 1
        if patience and bad >= patience:
            return best_round, r
    return best_round, len(losses) - 1


def test_the_latest_round_not_worse_beyond_the_noise_is_kept():
    # s = 0.5: a rise of 0.3 is within noise (kept: more training wins), one of 2 is not (not kept)
    t = SelectionTracker(RULE)
    _feed(t, [1.0, 0.8, 1.1, 2.9, 1.0], noise=0.5)
    assert t.best_round == 4 and t.best_loss == 1.0
    assert t.low_loss == 0.8 and t.low_noise == 0.5  # the reference: the lowest release
    assert t.bad == 0
    t = SelectionTracker(RULE)
    _feed(t, [1.0, 0.8, 1.1, 2.9], noise=0.5)
    assert t.best_round == 2 and t.bad == 1  # 2.9 > 0.8 + 2·√2·0.5: worse
    assert 0.8 + NOISE_Z * math.hypot(0.5, 0.5) < 2.9


def test_pure_noise_rarely_stops_the_run_as_the_docstring_says():
    """26 releases (25 rounds and the scoring round) of an unchanging loss with std s: the
    docstring's false-stop probability is ≈ 3 %; the rule of old (s ignored) stops nearly always."""
    rng = random.Random(54)
    n, stops, kept = 400, 0, []
    for _ in range(n):
        t = SelectionTracker(RULE)
        _feed(t, [0.6 + 0.3 * rng.gauss(0, 1) for _ in range(26)], noise=0.3)
        stops += t.should_stop
        kept.append(t.best_round)
    p = 0.031
    assert stops <= n * p + 4 * math.sqrt(n * p * (1 - p))  # ≤ 26 of 400: 4 sd above the docstring's 3 %
    assert sum(kept) / n > 20  # the kept round is late: more training wins
    rng = random.Random(54)
    old = [_old_rule([0.6 + 0.3 * rng.gauss(0, 1) for _ in range(26)], patience=5, min_delta=1e-4) for _ in range(n)]
    assert sum(last < 25 for _, last in old) > n / 2  # what session 53 measured: runs stop on noise


def test_without_noise_the_rule_is_the_one_of_old():
    rng = random.Random(7)
    for _ in range(300):
        losses = [round(rng.uniform(0.3, 0.9), rng.choice([1, 2, 4])) for _ in range(rng.randint(1, 30))]
        delta = rng.choice([0.0, 1e-4, 0.05])
        t = SelectionTracker(SelectionRule(patience=rng.choice([0, 2, 5]), min_delta=delta))
        _feed(t, losses, noise=0.0)
        kept, last = _old_rule(losses, patience=t.rule.patience, min_delta=delta)
        assert (t.best_round, t.rounds[-1]) == (kept, last)
        assert t.best_loss == losses[kept] and t.low_loss == t.best_loss


def test_the_majority_noise_is_used_and_a_hospital_reporting_another_is_named():
    t = SelectionTracker(RULE)
    assert t.observe({"a": _status("a", 0, 0.7, 0.2), "b": _status("b", 0, 0.7, 0.2), "c": _status("c", 0, 0.7, 0.9)}) == 0.7
    assert t.noises == [0.2] and t.disagreeing == {"c": 0}


def test_the_journal_carries_the_noises_and_the_reference():
    t = SelectionTracker(RULE)
    _feed(t, [1.0, 0.8, 1.1, 2.9], noise=0.5)
    u = SelectionTracker(RULE)
    u.load(t.to_dict())
    assert (u.noises, u.low_loss, u.low_noise, u.best_round, u.bad) == (t.noises, 0.8, 0.5, 2, 1)
    old = {k: v for k, v in t.to_dict().items() if k not in ("noises", "low_loss", "low_noise")}
    u.load(old)  # a journal from before: noises 0, the reference the kept round's
    assert u.noises == [0.0] * 4 and u.low_loss == u.best_loss


def test_messages_without_dp_are_byte_for_byte_as_before():
    s = _status("a", 1, 0.5)
    assert "noise" not in s.model_dump_json() and '"noise":0.25' in _status("a", 1, 0.5, 0.25).model_dump_json()
    from clinograph.core.spec import ModelSpec

    msg = GlobalModel(federation_id="fed", round=1, spec=ModelSpec(version=0, modules=()), modules=())
    assert "validation" not in msg.model_dump_json()


@pytest.mark.parametrize(("mean", "count", "k", "h"), [(0.5, 100.0, 4, 2), (0.0, 12.0, 3, 3), (3.0, 0.2, 3, 2)])
def test_the_noise_formula(mean, count, k, h):
    tilde = min(max(mean, 0.0), 1.0)
    expected = 7.5 * math.sqrt(2 * k / h) * math.sqrt(1 + tilde**2) / max(count, 1.0)
    assert released_loss_noise(mean=mean, count=count, noise_multiplier=7.5, contributors=k,
                               min_honest=h) == pytest.approx(expected, rel=1e-5)
