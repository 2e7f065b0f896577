"""Logs after a fault: a planned end (budgets spent) logs no ERROR; round numbers agree.

The budget run is the real one (``crash_harness``: four hospitals whose ε budget runs out after
two rounds), its progress events rendered by the operator's log (``progress_line``).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from clinograph.secure.messages import RoundResult
from clinograph.secure.runtime.loop import _deliver_pending
from clinograph.secure.runtime.resume import RunState

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import crash_harness  # noqa: E402


@pytest.mark.slow
def test_budget_exhaustion_is_a_planned_end_without_an_error_line(tmp_path):
    from clinograph.secure.transport.flower.oplog import progress_line

    assert crash_harness.run_in_child(tmp_path, "--rounds", "4", "--budget", "2.5", "--events") == 0
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    aborted = [e for e in events if e["event"] == "round_aborted"]
    assert len(aborted) == 1 and aborted[0]["planned_end"] is True
    lines = [progress_line(e["event"], e, nodes={}) for e in events]
    assert max(level for level, _ in lines) == logging.WARNING, [t for lvl, t in lines if lvl >= logging.ERROR]
    ended = [json.loads(x)["payload"] for x in (tmp_path / "audit" / "audit.jsonl").read_text().splitlines()
             if json.loads(x)["kind"] == "run_ended"]
    assert ended[-1]["status"] == "too_few_hospitals"


def test_an_unplanned_abort_is_still_an_error():
    from clinograph.secure.transport.flower.oplog import progress_line

    level, text = progress_line("round_aborted", {"round": 3, "reason": "too few survivors", "planned_end": False},
                                nodes={})
    assert level == logging.ERROR and text == "round 3 aborted: too few survivors"


def test_a_voided_round_and_its_attribution_are_warnings_with_names():
    """A voided round does not end the run (issue 31: the run goes on and names whose input voided it)."""
    from clinograph.secure.transport.flower.oplog import progress_line

    level, text = progress_line("round_aborted", {"round": 4, "reason": "out of bounds", "planned_end": False,
                                                  "voided": True}, nodes={})
    assert level == logging.WARNING and text.startswith("round 4 voided, nothing applied: out of bounds")
    level, text = progress_line("attribution_step", {"round": 5, "test": 1, "outcome": "voided",
                                                     "suspects": ["h1", "h2"], "end": None}, nodes={"h1": 7})
    assert level == logging.INFO and "suspects h1 (node 7), h2" in text
    level, text = progress_line("hospital_retired", {"round": 6, "client": "h2", "reason": "its input voided"},
                                nodes={})
    assert level == logging.WARNING and text == "round 6: h2 retired: its input voided"


def test_successive_halving_is_one_line_a_step():
    from clinograph.secure.transport.flower.oplog import progress_line

    level, text = progress_line("candidates_eliminated", {"rung": 1, "rounds": 7, "kept": ["a", "b"],
                                                          "eliminated": ["c", "d"]}, nodes={})
    assert level == logging.INFO and text == "candidates after 7 round(s) (rung 1): kept a, b; eliminated c, d"
    level, text = progress_line("run_paused", {"candidate": "a", "rung": 1, "next_round": 8}, nodes={})
    assert text == "candidate model 'a': run paused (rung 1, next round 8)"
    level, text = progress_line("model_chosen", {"chosen": "b", "candidates": ["a", "b"]}, nodes={})
    assert text == "model chosen: 'b' of a, b"


def test_a_deferred_end_carries_the_closed_rounds_number():
    class Transport:
        def exchange(self, stage, messages, *, round_):
            self.sent = (stage, round_)
            return {}, {}

    transport = Transport()
    closed = RoundResult(federation_id="fed-x", round=1, contributors=("h1",), global_state_digest="a" * 64)
    server = SimpleNamespace(history=[closed], round=2)  # the server has moved on to round 2
    _deliver_pending(server, transport, RunState(pending={"h1": b"model"}), lambda kind, data: None)
    assert transport.sent == ("end", 1)


def test_the_scoring_round_is_named_in_the_operators_log():
    """rounds = 1 with model selection runs rounds 0 and 1: the second only scores the last model."""
    from clinograph.secure.transport.flower.oplog import progress_line

    _, text = progress_line("round_closed", {"round": 1, "contributors": ["a"], "scoring": True}, nodes={})
    assert text.startswith("round 1 closed (scoring round: the last model evaluated, no training): contributors")
    _, text = progress_line("round_closed", {"round": 0, "contributors": ["a"], "scoring": False}, nodes={})
    assert text.startswith("round 0 closed: contributors")


def test_a_catch_up_is_an_info_line_naming_the_hospitals():
    from clinograph.secure.transport.flower.oplog import progress_line

    level, text = progress_line("model_caught_up", {"round": 5, "hospitals": ["h2", "h3"]}, nodes={"h2": 7})
    assert level == logging.INFO and text.startswith("round 5: the current global model sent with the plan to ")
    assert "h3" in text and "missed the last round" in text
