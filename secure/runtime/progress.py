"""Progress inside a run, for the operator: who has answered each stage, who is slowest, and an ETA.

The round loop (:func:`.loop.run_round`) emits one ``stage_progress`` event after each exchange
(``plan``, ``stage 1``, ...): how many of the hospitals asked have answered, and the slowest of
them with its seconds. It costs one dict a stage; the seconds come from the transport
(``last_timings``, see :class:`.transport.Transport`), never from the hospitals' messages.

:class:`RoundClock` turns a run's ``run_started`` / ``round_opened`` / ``round_closed`` events
into an ETA: the mean seconds a round has taken so far times the rounds left
(:func:`eta_seconds`). Early stopping on the validation loss can only end a run sooner, so the
ETA is an upper estimate. Under early elimination (secure/runtime/elimination.py) it counts every
candidate's whole run until the first cut, then only the resumed candidate's rounds left (the
other survivors' are not counted). Both the Flower ServerApp's log lines and ``clinograph simulate``
use it. Events carry names, counts and seconds only -- no data.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def eta_seconds(round_seconds: Sequence[float], *, rounds_left: int) -> float | None:
    """Mean seconds per round so far x ``rounds_left``; None before any round closed."""
    if not round_seconds:
        return None
    return sum(round_seconds) / len(round_seconds) * max(rounds_left, 0)


def duration_text(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min``."""
    s = int(round(max(seconds, 0.0)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class RoundClock:
    """Times the rounds from the progress events and adds ``seconds`` and ``eta_s`` to each
    ``round_closed`` (:meth:`observe`). ``rounds``: training rounds per candidate model; a run whose
    ``run_started`` says ``scoring`` ends with one more, the evaluation-only scoring round, which
    is counted too (it was not: "last round" was printed before it, and the ETA left it out);
    ``clock`` is injectable for tests (default :func:`time.monotonic`)."""

    def __init__(self, *, rounds: int, clock: Callable[[], float] = time.monotonic):
        self.rounds, self.clock = rounds, clock
        self.seconds: list[float] = []  # every closed round's duration, over all candidates
        self._opened: dict[int, float] = {}
        self._trained_in_run = 0  # training rounds closed in this candidate's run
        self._scoring = 0  # 1: each run ends with a scoring round
        self._scored = False  # this run's scoring round closed
        self._runs_after = 0  # candidate runs still to come after this one

    def rounds_left(self) -> int:
        this_run = max(self.rounds - self._trained_in_run, 0) + (self._scoring and not self._scored)
        return this_run + (self.rounds + self._scoring) * self._runs_after

    def observe(self, kind: str, data: Mapping[str, Any]) -> dict[str, Any]:
        """The event's data, with ``seconds`` (the round's) and ``eta_s`` added to a ``round_closed``."""
        out = dict(data)
        if kind == "run_started":
            self._trained_in_run, self._scored = 0, False
            self._scoring = int(bool(data.get("scoring", False)))
            self._runs_after = max(int(data.get("count", 1)) - int(data.get("index", 0)) - 1, 0)
        elif kind in ("resumed", "run_resumed", "run_extended"):
            # after a restart, a pause or an ended run: its training rounds count as done; an extension
            # scores again at its end
            self._trained_in_run = int(data.get("rounds_completed", 0))
            self._scored = self._scored and kind != "run_extended"
        elif kind == "round_opened":
            self._opened[int(data.get("round", -1))] = self.clock()
        elif kind == "round_closed":
            start = self._opened.pop(int(data.get("round", -1)), None)
            if start is not None:
                self.seconds.append(self.clock() - start)
                out["seconds"] = round(self.seconds[-1], 3)
            if data.get("scoring"):
                self._scored = True
            else:
                self._trained_in_run += 1
            eta = eta_seconds(self.seconds, rounds_left=self.rounds_left())
            if eta is not None:
                out["eta_s"] = round(eta, 1)
                out["rounds_left"] = self.rounds_left()
        return out


def stage_line(data: Mapping[str, Any]) -> str:
    """The one-line account of a ``stage_progress`` event."""
    line = (f"round {data.get('round')} {data.get('stage')}: {data.get('answered')} of {data.get('asked')} "
            "hospital(s) answered")
    if data.get("slowest") is not None:
        line += f"; slowest {data.get('slowest')} ({float(data.get('slowest_s', 0.0)):.1f} s)"
    missing = list(data.get("missing") or [])
    if missing:
        line += f"; no answer from {', '.join(str(m) for m in missing)}"
    return line


def eta_line(data: Mapping[str, Any]) -> str:
    """`` (round took 12 s; ETA 1 min 05 s for 5 round(s) left)`` for a timed ``round_closed``, else ''."""
    if "eta_s" not in data:
        return ""
    took = f"round took {duration_text(float(data['seconds']))}; " if "seconds" in data else ""
    left = int(data.get("rounds_left", 0))
    if left == 0:
        return f" ({took}last round)" if took else ""
    return f" ({took}ETA at most {duration_text(float(data['eta_s']))} for {left} round(s) left)"
