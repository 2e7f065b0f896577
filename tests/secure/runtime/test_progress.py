"""Progress inside a run: the ETA arithmetic, the round clock, the stage lines, and the round
loop's ``stage_progress`` events (counts, slowest, who did not answer)."""

from __future__ import annotations

import pytest
from clinograph.secure.runtime.loop import stage_progress
from clinograph.secure.runtime.progress import (
    RoundClock,
    duration_text,
    eta_line,
    eta_seconds,
    stage_line,
)


def test_eta_is_the_mean_round_times_the_rounds_left():
    assert eta_seconds([10.0, 20.0, 30.0], rounds_left=4) == pytest.approx(80.0)
    assert eta_seconds([12.5], rounds_left=0) == 0.0
    assert eta_seconds([], rounds_left=5) is None


def test_durations_read_as_an_operator_would():
    assert [duration_text(s) for s in (4.4, 65, 2 * 3600 + 7 * 60 + 30)] == ["4 s", "1 min 05 s", "2 h 07 min"]


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_round_clock_times_rounds_and_counts_later_candidates():
    clock = _Clock()
    rc = RoundClock(rounds=3, clock=clock)
    rc.observe("run_started", {"candidate": "a", "index": 0, "count": 2})
    rc.observe("round_opened", {"round": 0})
    clock.now += 10
    first = rc.observe("round_closed", {"round": 0})
    assert first["seconds"] == 10.0 and first["rounds_left"] == 2 + 3 and first["eta_s"] == 50.0
    rc.observe("round_opened", {"round": 1})
    clock.now += 30
    second = rc.observe("round_closed", {"round": 1})
    assert second["eta_s"] == pytest.approx(20.0 * 4)
    rc.observe("run_started", {"candidate": "b", "index": 1, "count": 2})  # the last candidate: 3 rounds left
    assert rc.rounds_left() == 3


def test_a_resumed_run_counts_the_rounds_completed_before_the_restart():
    clock = _Clock()
    rc = RoundClock(rounds=5, clock=clock)
    rc.observe("run_started", {"candidate": "a", "index": 0, "count": 1})
    rc.observe("resumed", {"rounds_completed": 3, "round": 4, "stage": "close"})
    rc.observe("round_opened", {"round": 4})
    clock.now += 8
    assert rc.observe("round_closed", {"round": 4})["eta_s"] == 8.0  # one round left, not four


def test_a_round_never_seen_opening_gets_no_seconds_and_no_eta():
    out = RoundClock(rounds=2, clock=_Clock()).observe("round_closed", {"round": 5, "contributors": ["h1"]})
    assert out == {"round": 5, "contributors": ["h1"]}


def test_stage_and_eta_lines():
    assert stage_line({"round": 2, "stage": "stage 1", "answered": 2, "asked": 3, "slowest": "h2",
                       "slowest_s": 4.26, "missing": ["h3"]}) == (
        "round 2 stage 1: 2 of 3 hospital(s) answered; slowest h2 (4.3 s); no answer from h3")
    assert stage_line({"round": 0, "stage": "plan", "answered": 0, "asked": 2, "missing": ["a", "b"]}) == (
        "round 0 plan: 0 of 2 hospital(s) answered; no answer from a, b")
    assert eta_line({"seconds": 12.0, "eta_s": 65.0, "rounds_left": 5}) == (
        " (round took 12 s; ETA at most 1 min 05 s for 5 round(s) left)")
    assert eta_line({"seconds": 12.0, "eta_s": 0.0, "rounds_left": 0}) == " (round took 12 s; last round)"
    assert eta_line({"round": 1}) == ""


def test_stage_progress_names_the_slowest_of_those_who_answered():
    class Transport:
        last_timings = {"h1": 1.0, "h2": 3.5, "h3": 9.0}  # h3's late answer was not kept

    seen = []
    stage_progress(lambda k, d: seen.append((k, d)), Transport(), round_=4, stage="plan",
                   asked={"h1": 1, "h2": 1, "h3": 1}, answers={"h1": {}, "h2": {}})
    assert seen == [("stage_progress", {"round": 4, "stage": "plan", "answered": 2, "asked": 3, "missing": ["h3"],
                                        "slowest": "h2", "slowest_s": 3.5})]


def test_a_transport_without_timings_still_counts():
    seen = []
    stage_progress(lambda k, d: seen.append(d), object(), round_=0, stage="stage 2", asked={"a": 1}, answers={"a": 1})
    assert seen == [{"round": 0, "stage": "stage 2", "answered": 1, "asked": 1, "missing": []}]


def test_the_scoring_round_of_each_run_is_counted_and_the_last_round_is_the_last():
    """The deployment guide's run (4 candidates, 2 rounds each, each run ending with its scoring
    round) printed 'round 1 closed (...; last round)' and then closed round 2, the scoring round;
    the first ETA was for 7 rounds where 11 were left."""
    clock = _Clock()
    rc = RoundClock(rounds=2, clock=clock)
    lefts = []
    for index in range(2):
        rc.observe("run_started", {"candidate": f"c{index}", "index": index, "count": 2, "scoring": True})
        for r, scoring in ((0, False), (1, False), (2, True)):
            rc.observe("round_opened", {"round": r})
            clock.now += 4
            out = rc.observe("round_closed", {"round": r, "scoring": scoring})
            lefts.append(out["rounds_left"])
    assert lefts == [5, 4, 3, 2, 1, 0]
    assert eta_line({"seconds": 4.0, "eta_s": 4.0, "rounds_left": 1}).endswith("for 1 round(s) left)")
    assert eta_line({"seconds": 4.0, "eta_s": 0.0, "rounds_left": 0}) == " (round took 4 s; last round)"
    # an extension of an ended run (rounds 2 -> 3): one training round and its own scoring round
    rc = RoundClock(rounds=3, clock=clock)
    rc.observe("run_started", {"candidate": "model", "index": 0, "count": 1, "scoring": True})
    rc.observe("run_extended", {"rounds_completed": 2, "rounds_planned": 3, "next_round": 3})
    assert rc.rounds_left() == 2
    rc.observe("round_opened", {"round": 3})
    assert rc.observe("round_closed", {"round": 3, "scoring": False})["rounds_left"] == 1
