"""The crash journal in process (no torch, no processes): boundaries, resume rule, refusals.

A crash is simulated by an exception from the journal's ``on_saved`` hook; the process-level
SIGKILL tests are test_crash_resume.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from clinograph.secure.runtime import run_rounds
from clinograph.secure.runtime.journal import Journal, JournalKey, decode_state, encode_state

from clinograph.core.errors import ConfigError, IntegrityError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hostile_helpers import audit_entries, federation  # noqa: E402


class Crash(BaseException):
    """Stands for the process dying (not an Exception: nothing in the loop catches it)."""


def _crash_at(stage: str, round_: int):
    def hook(s: str, r: int) -> None:
        if (s, r) == (stage, round_):
            raise Crash
    return hook


def test_state_blob_round_trips_exactly_and_refuses_a_damaged_one():
    state = {"a": np.array([0.1, -2.5e-300, np.pi]), "b": np.arange(4.0)}
    data = encode_state(["a", "b"], state)
    back = decode_state(data)
    assert all(np.array_equal(back[k], state[k]) for k in state)
    with pytest.raises(IntegrityError, match="damaged"):
        decode_state(data[:-8])


def test_every_stage_boundary_is_journalled(tmp_path):
    server, transport, _ = federation(tmp_path)
    journal = Journal(tmp_path / "j.sqlite")
    run_rounds(server, transport, rounds=2, journal=journal)
    stages = journal.stages()
    assert stages[:8] == [(0, "start"), (0, "open"), (0, "plan"), (0, "stage 1"), (0, "stage 2"), (0, "stage 3"),
                          (0, "stage 4"), (1, "close")]
    assert stages[8] == (1, "end") and stages[-1] == (2, "run_ended")
    last = journal.latest(key=JournalKey(server.identity))
    assert last.run_ended and last.completed == 2 and last.audit_seq == json.loads(
        (tmp_path / "audit" / "head.json").read_text())["seq"]


def test_a_round_open_at_the_crash_is_aborted_audited_and_rerun_under_a_new_number(tmp_path):
    server, transport, _ = federation(tmp_path)
    journal = Journal(tmp_path / "j.sqlite", on_saved=_crash_at("stage 2", 1))
    with pytest.raises(Crash):
        run_rounds(server, transport, rounds=2, journal=journal)
    closed = server.history[0].global_state_digest
    server.audit.close()
    journal.close()
    server2, transport2, _ = federation(tmp_path)  # the restarted process: the trail reopens over the same files
    events: list[tuple[str, dict]] = []
    outcomes = run_rounds(server2, transport2, rounds=2, journal=Journal(tmp_path / "j.sqlite"),
                          on_event=lambda k, d: events.append((k, dict(d))))
    server2.audit.close()
    assert [o.result.round for o in outcomes] == [2]  # round 1 was spent by the crash
    assert server2.history[0].global_state_digest == closed  # round 0 restored, not re-run
    entries = audit_entries(tmp_path)
    aborted = [e["payload"] for e in entries if e["kind"] == "round_aborted"]
    assert [a["round"] for a in aborted] == [1] and aborted[0]["reason"].startswith("server restart")
    assert [e["payload"]["round"] for e in entries if e["kind"] == "aggregate"] == [0, 2]
    assert ("resumed", {"round": 2, "rounds_completed": 1, "stage": "stage 2"}) in events


def test_a_journal_of_another_run_or_an_audit_trail_behind_it_is_refused(tmp_path):
    server, transport, _ = federation(tmp_path, strategy="fedavg")
    journal = Journal(tmp_path / "j.sqlite", on_saved=_crash_at("close", 1))
    with pytest.raises(Crash):
        run_rounds(server, transport, rounds=2, journal=journal)
    other, t2, _ = federation(tmp_path / "other", mode="insecure_plaintext")
    with pytest.raises(ConfigError, match="secure mode 'masked' .this server: 'insecure_plaintext'"):
        run_rounds(other, t2, rounds=2, journal=Journal(tmp_path / "j.sqlite"))
    fresh, t3, _ = federation(tmp_path / "fresh")  # same federation, but its audit trail never saw that head
    with pytest.raises(IntegrityError, match="rolled back behind the journal"):
        run_rounds(fresh, t3, rounds=2, journal=Journal(tmp_path / "j.sqlite"))


def test_a_strategy_with_unjournalled_state_is_refused(tmp_path):
    server, transport, _ = federation(tmp_path, strategy="fedadam")
    with pytest.raises(ConfigError, match="Strategy 'fedadam' keeps server-side state"):
        run_rounds(server, transport, rounds=1, journal=Journal(tmp_path / "j.sqlite"))


def test_a_file_that_is_not_a_journal_is_refused(tmp_path):
    (tmp_path / "j.sqlite").write_bytes(b"not a database at all" * 100)
    with pytest.raises(ConfigError, match="is not a Clinograph journal"):
        Journal(tmp_path / "j.sqlite")


class _ScoreOnce:
    """The smallest run control (:class:`clinograph.secure.runtime.loop.RunControl`): one
    evaluation-only scoring round after the training rounds, as every run with selection has."""

    deliver = False

    def begin(self, *, first_round: int) -> None:
        pass

    def options(self, *, scoring: bool) -> dict:
        return {"run.phase": "score" if scoring else "train"}

    def after(self, server, outcome) -> bool:
        return False

    def wants_score(self) -> bool:
        return True

    def finish(self, server, transport, *, stopped: bool) -> None:
        pass

    def to_dict(self) -> dict:
        return {}

    def load(self, data) -> None:
        pass


def test_a_restart_after_the_scoring_round_counts_training_rounds_only(tmp_path):
    """rounds = 1 runs round 0 (training) and round 1 (scoring). A restart after round 1 closed said
    "resumed ...: 2 round(s) completed" -- 2 of 1 -- counting the scoring round as a training round."""
    server, transport, _ = federation(tmp_path)
    journal = Journal(tmp_path / "j.sqlite", on_saved=_crash_at("close", 2))  # round 1, the scoring round, closed
    with pytest.raises(Crash):
        run_rounds(server, transport, rounds=1, journal=journal, control=_ScoreOnce())
    server.audit.close()
    journal.close()
    server2, transport2, _ = federation(tmp_path)
    events: list[tuple[str, dict]] = []
    run_rounds(server2, transport2, rounds=1, journal=Journal(tmp_path / "j.sqlite"), control=_ScoreOnce(),
               on_event=lambda k, d: events.append((k, dict(d))))
    server2.audit.close()
    resumed = [d for k, d in events if k == "resumed"]
    assert [d["rounds_completed"] for d in resumed] == [1]
    ended = [e["payload"] for e in audit_entries(tmp_path) if e["kind"] == "run_ended"]
    # the crashed run's own end (written on its way down) and the resumed run's: 1 of 1 both times, and
    # the resumed run re-scores the last model (round 2) instead of counting a second training round
    assert [(e["status"], e["rounds_completed"], e["rounds_planned"]) for e in ended] == [
        ("failed", 1, 1), ("completed", 1, 1)]
    plans = [e["payload"]["round"] for e in audit_entries(tmp_path) if e["kind"] == "round_plan"]
    assert plans == [0, 1, 2]
