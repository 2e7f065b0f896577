"""`clinograph simulate` shows each stage's answers and slowest hospital (the progress bar's text) and
prints each round's time and ETA."""

from __future__ import annotations

from clinograph.demo_view import simulation_progress


def test_simulate_prints_stage_progress_and_the_eta():
    now = [0.0]
    lines: list[str] = []
    shown: list[str] = []
    show = simulation_progress(3, lines.append, status=shown.append, clock=lambda: now[0])
    show("run_started", {"candidate": "wide", "index": 0, "count": 1})
    show("round_opened", {"round": 0, "participants": ["a", "b"]})
    show("stage_progress", {"round": 0, "stage": "plan", "answered": 2, "asked": 2, "missing": [],
                            "slowest": "b", "slowest_s": 2.0})
    now[0] = 20.0
    show("round_closed", {"round": 0, "contributors": ["a", "b"]})
    show("dropped", {"round": 0, "hospital": "a", "reason": "x"})  # not one of the progress lines
    assert shown == ["round 0 plan: 2 of 2 hospital(s) answered; slowest b (2.0 s)"]  # the bar's live text
    assert lines == ["round 0 closed: 2 contributor(s) (round took 20 s; ETA at most 40 s for 2 round(s) left)"]
