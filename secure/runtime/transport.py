"""The transport seam: one method, ``exchange``, that carries one stage to some hospitals.

A transport moves named byte parts; it never interprets them. Whatever it cannot deliver or
get an answer to is reported per hospital as a reason, and the round loop treats that
hospital as dropped at that stage (the secure mode's dropout recovery does the rest).
"""

from __future__ import annotations

import logging
import re
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from clinograph.core.errors import ClinographError, ConfigError
from clinograph.core.identity import Identity

from ..refusals import REFUSABLE_STAGES, REFUSAL_PART
from .participant import RoundParticipant, dispatch, refuse

Parts = dict[str, bytes]
#: How a transport words "this hospital gave no answer at all" (the start of its reason, after the
#: round loop's ``"<stage>: "`` prefix): silent in process, not reachable, no reply within the timeout
#: over Flower (``flower/driver.py``). A hospital's own words never come first: they follow
#: ``"refused at "``, ``"error reply at "`` or ``"bad reply at "``.
SILENT_REASONS = ("silent from exchange ", "not reachable", "no reply to ", "its worker process ended")


_STAGE_PREFIX = re.compile(r"^[a-z_]{1,32}(?: \d{1,9})?: ")  # "stage 2: ", "end: " (participation.RoundBook)


def went_silent(reason: str) -> bool:
    """True if ``reason`` (a round's dropped reason) says the hospital gave no answer at all."""
    return _STAGE_PREFIX.sub("", reason, count=1).startswith(SILENT_REASONS)


_log = logging.getLogger(__name__)


class Transport(Protocol):
    """Carries one stage to hospitals and brings back their answers."""

    #: True: a round's global model rides with the next plan instead of its own exchange.
    defers_model: bool

    # Optional: ``last_timings`` (name -> seconds until its answer in the last exchange), read by
    # the round loop's ``stage_progress`` event when present (:mod:`.progress`).

    def hospitals(self) -> tuple[str, ...]:
        """The hospitals this transport can reach (in-process: all; Flower: the greeted nodes)."""

    def exchange(self, stage: str, outgoing: Mapping[str, Mapping[str, bytes]], *,
                 round_: int) -> tuple[dict[str, Parts], dict[str, str]]:
        """Send ``outgoing[name]`` to each hospital; return (name -> answer, name -> reason it gave none)."""


class InProcessTransport:
    """Every hospital in this process: an exchange is a function call per hospital.

    ``drop_at(round_, {name: k})`` makes hospital ``name`` go silent in that round from its
    k-th exchange on (0 = it never answers the plan), which is how tests and simulations
    exercise dropouts. A hospital that raises a ClinographError at ``plan``, ``stage`` or
    ``end`` answers with its signed refusal (``{"refusal": HospitalRefusal envelope}``, see
    :mod:`clinograph.secure.refusals`) if it has an ``identity`` to sign with, as the Flower
    worker does; otherwise (and at ``setup``) it gave no answer, with that reason. Any other
    exception (a bug in the hospital's code) is no answer either, named by its class only, so
    the round goes on without that hospital and closes (or aborts) as audited.
    """

    defers_model = False

    def __init__(self, participants: Mapping[str, RoundParticipant]):
        if not participants:
            raise ConfigError("An in-process transport needs at least one hospital.")
        for name, p in participants.items():
            if p.name != name:
                raise ConfigError(f"Hospital registered as {name!r} calls itself {p.name!r}.")
        self.participants = dict(participants)
        self._drops: dict[int, dict[str, int]] = {}
        self._exchanges: dict[int, dict[str, int]] = {}
        self.last_timings: dict[str, float] = {}  # name -> seconds its answer took in the last exchange

    def hospitals(self) -> tuple[str, ...]:
        return tuple(sorted(self.participants))

    def drop_at(self, round_: int, silent_from: Mapping[str, int]) -> None:
        """Schedule dropouts for ``round_`` (name -> index of its first unanswered exchange)."""
        self._drops[round_] = dict(silent_from)

    def exchange(self, stage: str, outgoing: Mapping[str, Mapping[str, bytes]], *,
                 round_: int) -> tuple[dict[str, Parts], dict[str, str]]:
        answers: dict[str, Parts] = {}
        failed: dict[str, str] = {}
        self.last_timings = {}
        due = self._due(stage, outgoing, round_=round_, failed=failed)
        for name, (answer, reason, seconds) in self._answer_all(stage, due, round_=round_).items():
            if answer is not None:
                answers[name] = answer
            else:
                failed[name] = reason or "gave no answer"
            if seconds is not None:
                self.last_timings[name] = seconds
        return answers, failed

    def call(self, fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
        """``fn(participant, *args)`` for every hospital, by name: a read of the hospitals' own state
        between rounds (a simulation's measurements). ``fn`` is a module-level function, so that
        :class:`.workers.ProcessTransport` can run it where the hospital lives."""
        return {name: fn(self.participants[name], *args) for name in self.hospitals()}

    def _due(self, stage: str, outgoing: Mapping[str, Mapping[str, bytes]], *, round_: int,
             failed: dict[str, str]) -> dict[str, Mapping[str, bytes]]:
        """The hospitals this exchange reaches, by name (the drop schedule and unknown names go to ``failed``)."""
        seen = self._exchanges.setdefault(round_, {})
        run_step = stage == "setup" and any(p.get("step", b"").startswith(b"run/") for p in outgoing.values())
        due: dict[str, Mapping[str, bytes]] = {}
        for name, parts in sorted(outgoing.items()):
            index = seen.get(name, 0)
            if not run_step:  # the run's own set-up steps do not shift a scheduled dropout
                seen[name] = index + 1
            if name not in self.participants:
                failed[name] = "not reachable in this process"
            elif self._drops.get(round_, {}).get(name, 1 << 30) <= index:
                failed[name] = f"silent from exchange {index} ({stage!r})"  # SILENT_REASONS
            else:
                due[name] = parts
        return due

    def _answer_all(self, stage: str, due: Mapping[str, Mapping[str, bytes]], *, round_: int) -> dict[str, Answer]:
        """Every due hospital's :func:`answer`, one after another (in name order)."""
        return {name: answer(self.participants[name], name, stage, parts, round_=round_)
                for name, parts in due.items()}


#: one hospital's reply to one exchange: (its parts, or None; why none; seconds it took, or None)
Answer = tuple["Parts | None", "str | None", "float | None"]


def answer(participant: RoundParticipant, name: str, stage: str, parts: Mapping[str, bytes], *,
           round_: int) -> Answer:
    """One hospital's answer to one stage message, as every in-process transport gives it (in this
    process, or in a worker process: :mod:`.workers`): its parts; its signed refusal for a
    ClinographError at a refusable stage when it has an ``identity``; else no answer and the reason
    (a foreign exception named by its class only)."""
    began = time.monotonic()
    try:
        out = dispatch(participant, stage, parts)
        return out, None, time.monotonic() - began
    except ClinographError as exc:
        identity = getattr(participant, "identity", None)
        if stage in REFUSABLE_STAGES and isinstance(identity, Identity):
            return {REFUSAL_PART: refuse(participant, identity, round_=round_, stage=stage, parts=parts, exc=exc)}, None, None
        return None, f"refused the {stage!r} message: {type(exc).__name__}: {exc}", None
    except Exception as exc:  # noqa: BLE001 - a hospital's own bug must not leave the round open
        # Its class only: the message of a foreign exception may carry the hospital's data. Where it
        # happened (the frames, without the message) goes to this process's log, never the audit.
        _log.warning("hospital %r failed at the %r message with %s (a bug in its code?); where:\n%s", name,
                     stage, type(exc).__name__, "".join(traceback.format_tb(exc.__traceback__)))
        return None, (f"failed at the {stage!r} message with {type(exc).__name__} (not a Clinograph "
                      "error: a bug or an unhandled case in the hospital's code)"), None


class Restricted:
    """A transport that reaches only ``names`` of another's hospitals (the CKKS key holders, the
    hospitals that accepted a candidate's run); exchanges go through unchanged."""

    def __init__(self, inner: Transport, names: Iterable[str]):
        self.inner, self.names = inner, frozenset(names)
        self.defers_model = inner.defers_model

    @property
    def last_timings(self) -> dict[str, float]:
        return dict(getattr(self.inner, "last_timings", None) or {})

    def hospitals(self) -> tuple[str, ...]:
        return tuple(n for n in self.inner.hospitals() if n in self.names)

    def exchange(self, stage: str, outgoing: Mapping[str, Mapping[str, bytes]], *,
                 round_: int) -> tuple[dict[str, Parts], dict[str, str]]:
        return self.inner.exchange(stage, outgoing, round_=round_)
