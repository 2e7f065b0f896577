"""One candidate's run within a federation run (:mod:`.run`): its control (stop rule, scoring,
finish), its state, and the steps that open, resume and train it.

A candidate's run is opened once (``run/start``, then :meth:`~.assemble.ServerSide.open_run`:
its server and audit run). It trains in one call of :func:`.loop.run_rounds`, or -- under early
elimination (:mod:`.elimination`) -- in several: paused at a rung's budget (``run_paused``; its
server and :class:`~.resume.RunState` kept in memory, its audit run closed so the next
candidate can open one), resumed in a later rung (``run/start`` again, so every hospital
switches back to it; a new audit run with the ``manifest`` and ``run_resumed``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from clinograph.core.errors import ProtocolError

from ..server import FederationServer
from ..wire import seal
from .journal import Journal
from .liveness import Liveness
from .loop import EventSink, RoundOutcome, _quiet, run_rounds
from .models import CandidateModel, RunFinish, RunStart, overrides_digest, run_id
from .resume import RunState
from .selection import STATUS_PART, SelectionRule, SelectionTracker, read_statuses
from .transport import Restricted, Transport, went_silent


@dataclass
class SelectedRun:
    """The run's control (:class:`.loop.RunControl`): options, stop rule, scoring, finish."""

    candidate: str
    rounds: int
    rule: SelectionRule | None
    tracker: SelectionTracker | None = None
    #: hospitals whose status was not accepted (name -> why), and the round each kept
    rejected: dict[str, str] = field(default_factory=dict)
    kept: dict[str, int | None] = field(default_factory=dict)
    on_event: EventSink = _quiet
    #: the stop rule ended training (set by :meth:`finish`)
    stopped: bool = False
    #: the run's first round (``run.first_round`` in every plan: a hospital starts a new selection there)
    first_round: int | None = None
    #: hospitals that gave no answer at all in the last round seen (:func:`.transport.went_silent`) -> why
    #: (set by :meth:`after`): :meth:`finish` does not wait for them
    gone: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rule is not None and self.tracker is None:
            self.tracker = SelectionTracker(self.rule)

    @property
    def deliver(self) -> bool:
        return self.rule is not None

    def begin(self, *, first_round: int) -> None:
        if self.first_round is None:
            self.first_round = first_round

    def options(self, *, scoring: bool) -> dict[str, float | int | str | bool]:
        out: dict[str, float | int | str | bool] = {"run.candidate": self.candidate, "run.rounds": self.rounds,
                                                    "run.phase": "score" if scoring else "train"}
        if self.first_round is not None:
            out["run.first_round"] = self.first_round
        if self.rule is not None:
            out.update(self.rule.plan_options())
        return out

    def after(self, server: FederationServer, outcome: RoundOutcome) -> bool:
        self.gone = {n: why for n, why in outcome.dropped.items() if went_silent(why)}
        if self.tracker is None:
            return False
        good, bad = read_statuses(outcome.statuses, peers=server.enrolled, federation_id=server.federation_id,
                                  round_=outcome.result.round)
        self.rejected.update(bad)
        loss = self.tracker.observe(good)
        if loss is not None:
            self.on_event("validation", {"round": outcome.result.round, "loss": loss,
                                         "best_round": self.tracker.best_round})
        return self.tracker.should_stop

    def wants_score(self) -> bool:
        return self.tracker is not None and bool(self.tracker.rounds)

    def finish(self, server: FederationServer, transport: Transport, *, stopped: bool) -> None:
        """``run/finish`` to every hospital of the run that did not go silent in its last round,
        then ``model_selected`` (if a loss was seen).

        Why not the silent ones: a dead one (over Flower: a SIGKILLed SuperNode) held the exchange
        until Flower gave up on it, 9-17 s after the last round (``benchmarks/flower_scale``). A
        hospital that answered but was dropped (a refusal, a malformed answer, a ClientApp's error
        reply) is alive and still gets it: without it, it would neither keep the chosen model nor
        fit its calibration. Each skipped one is a ``finish_not_delivered`` event."""
        self.stopped = stopped
        last = server.history[-1].round if server.history else server.round
        reach = reachable(transport, server.enrolled)
        names = [n for n in reach if n not in self.gone]
        msg = seal(RunFinish(federation_id=server.federation_id, round=last), server.identity)
        answers, failed = transport.exchange("setup", {n: {"step": b"run/finish", "data": msg} for n in names},
                                             round_=last)
        failed.update({n: f"not sent: silent in the last round ({self.gone[n]})" for n in reach
                       if n in self.gone})
        for name, why in sorted(failed.items()):
            self.on_event("finish_not_delivered", {"round": last, "hospital": name, "reason": why[:300]})
        raw = {n: a[STATUS_PART] for n, a in answers.items() if STATUS_PART in a}
        good, bad = read_statuses(raw, peers=server.enrolled, federation_id=server.federation_id, round_=last)
        self.rejected.update(bad)
        self.kept = {n: s.kept for n, s in good.items()}
        t = self.tracker
        if t is None or t.best_round is None:
            return
        disagreeing = dict(t.disagreeing)
        disagreeing.update({n: -1 if k is None else k for n, k in self.kept.items() if k != t.best_round})
        server.audit.record("model_selected", {
            "round": int(t.best_round), "validation_loss": float(t.best_loss), "rounds_evaluated": len(t.rounds),
            "patience": int(t.rule.patience), "stopped_early": bool(stopped), "losses": [float(x) for x in t.losses],
            **({"noises": [float(x) for x in t.noises]} if any(t.noises) else {}),  # distributed DP only
            **({"disagreeing": dict(sorted(disagreeing.items()))} if disagreeing else {})})

    def to_dict(self) -> dict[str, Any]:
        return {"tracker": None if self.tracker is None else self.tracker.to_dict(), "first_round": self.first_round}

    def load(self, data: Mapping[str, Any]) -> None:
        if self.tracker is not None and data.get("tracker") is not None:
            self.tracker.load(data["tracker"])
        if data.get("first_round") is not None:
            self.first_round = int(data["first_round"])


@dataclass
class CandidateRun:
    """One candidate's run: its rounds' outcomes and what its selection kept."""

    name: str
    overrides: str
    run_id: str
    outcomes: list[RoundOutcome]
    control: SelectedRun
    #: hospitals that refused to train this candidate (name -> reason)
    refused: dict[str, str] = field(default_factory=dict)
    #: while the run is paused between rungs (:mod:`.elimination`): its server, transport and loop state
    server: FederationServer = field(default=None, repr=False)  # type: ignore[assignment]
    transport: Transport = field(default=None, repr=False)  # type: ignore[assignment]
    state: RunState = field(default_factory=RunState, repr=False)
    #: the run ended (all its rounds, the stop rule, or too few hospitals); else it is paused
    ended: bool = False
    #: the rung after which early elimination dropped it (None: it was not)
    eliminated_after: int | None = None

    @property
    def validation_loss(self) -> float | None:
        t = self.control.tracker
        return None if t is None or t.best_round is None else float(t.best_loss)

    @property
    def kept_round(self) -> int | None:
        t = self.control.tracker
        return None if t is None else t.best_round

    @property
    def rounds_run(self) -> int:
        """The training rounds it ran (evaluation-only rounds not counted)."""
        return self.state.trained

    def row(self) -> dict[str, Any]:
        """Its row of the ``model_chosen`` entry."""
        return {"name": self.name, "overrides": self.overrides, "validation_loss": self.validation_loss,
                "round": self.kept_round, "rounds_run": self.rounds_run,
                **({"eliminated_after_rung": self.eliminated_after} if self.eliminated_after is not None else {})}


def reachable(transport: Transport, enrolled: Mapping[str, Any]) -> tuple[str, ...]:
    """The enrolled hospitals the transport reaches, by name."""
    return tuple(sorted(set(transport.hospitals()) & set(enrolled)))


def open_candidate(cand: CandidateModel, *, index: int, count: int, side: Any, transport: Transport, rounds: int,
          rule: SelectionRule | None, liveness: Callable[[], Liveness | None] | None,
          event: EventSink) -> CandidateRun:
    """``run/start``, then the candidate's server and audit run."""
    rid = run_id(side.federation_id, cand.name, count=count)
    refused = start_candidate(cand, index=index, count=count, rid=rid, side=side, transport=transport, rounds=rounds,
                     event=event)
    left = [n for n in transport.hospitals() if n in side.enrolled and n not in refused]
    if len(left) < min(side.federation.min_clients, len(side.enrolled)):
        raise ProtocolError(
            f"Only {len(left)} hospital(s) accepted the run of candidate {cand.name!r} ({', '.join(left) or 'none'}); "
            f"the federation needs {side.federation.min_clients}. Refused: "
            + "; ".join(f"{n}: {why[:300]}" for n, why in sorted(refused.items())))
    server, narrowed = side.open_run(cand, run_id=rid, transport=Restricted(transport, [n for n in transport.hospitals() if n not in refused]), on_event=event)
    _record_refused(server, refused)
    control = SelectedRun(candidate=cand.name, rounds=rounds, rule=rule, on_event=event)
    # scoring: the run ends with the evaluation-only scoring round (a selection rule), for the ETA
    event("run_started", {"candidate": cand.name, "run_id": rid, "index": index, "count": count,
                          "scoring": rule is not None})
    return CandidateRun(name=cand.name, overrides=cand.overrides, run_id=rid, outcomes=[], control=control,
                        refused=refused, server=server, transport=narrowed,
                        state=RunState(liveness=liveness() if liveness is not None else None, control=control))


def _record_refused(server: FederationServer, refused: Mapping[str, str]) -> None:
    for name, why in sorted(refused.items()):
        server.audit.record("hospital_refused", {"stage": "setup", "client": name, "reason": f"run/start: {why}"[:4000],
                                                 "signed": False, "final": False})


def resume_candidate(run: CandidateRun, cand: CandidateModel, *, index: int, count: int, rung: int, side: Any,
            transport: Transport, rounds: int, event: EventSink) -> None:
    """A paused candidate goes on: ``run/start`` again (each hospital switches back to it), a new
    audit run (``manifest``, ``run_resumed``) for the same server."""
    server, state = run.server, run.state
    refused = start_candidate(cand, index=index, count=count, rid=run.run_id, side=side, transport=transport, rounds=rounds,
                     event=event)
    previous = getattr(server.audit, "run_id", None)
    server.audit = side.open_audit()
    server.record_manifest()
    _record_refused(server, refused)
    if refused:
        run.refused.update(refused)
        run.transport = Restricted(run.transport, [n for n in run.transport.hospitals() if n not in refused])
    payload = {"rung": rung, "previous_run_id": str(previous or "0" * 32), "next_round": server.round,
               "rounds_completed": state.trained}
    server.audit.record("run_resumed", payload)
    event("run_resumed", {**payload, "candidate": run.name})


def train_candidate(run: CandidateRun, *, rounds: int, pause_after: int | None, rung: int, side: Any,
           journal: Journal | None, event: EventSink,
           on_round: Callable[[CandidateRun, int, RoundOutcome], None] | None) -> None:
    """The candidate's rounds up to ``pause_after`` (None: to the end of its run); a paused run
    ends its audit run with ``run_paused``."""
    server, state = run.server, run.state
    paused = False
    try:
        run.outcomes += run_rounds(server, run.transport, rounds=rounds, on_event=event, journal=journal,
                                   liveness=state.liveness, control=run.control, state=state, pause_after=pause_after,
                                   on_round=None if on_round is None else (lambda r, o: on_round(run, r, o)))
        # the loop pauses only there: fewer rounds is an end (too few hospitals), a stop is the stop rule's
        paused = pause_after is not None and pause_after <= state.trained < rounds and not state.stopped
        if not paused:
            run.ended = True
            head = getattr(server.audit, "head", None)  # a failed run's last event stays what ended it
            if head is not None and head.kind == "run_ended":
                event("run_ended", {**head.payload, "candidate": run.name})
        else:
            payload = {"rung": rung, "next_round": server.round, "rounds_completed": state.trained,
                       "rounds_planned": rounds}
            server.audit.record("run_paused", payload)
            event("run_paused", {**payload, "candidate": run.name})
    finally:
        side.close_run(server)
        if not paused:
            run.server = run.transport = None  # type: ignore[assignment]


def start_candidate(cand: CandidateModel, *, index: int, count: int, rid: str, side: Any, transport: Transport,
           rounds: int, event: EventSink) -> dict[str, str]:
    """``run/start`` to every hospital; returns who refused, and why."""
    msg = seal(RunStart(federation_id=side.federation_id, run_id=rid, candidate=cand.name,
                        overrides_sha256=overrides_digest(cand.overrides), index=index, count=count, rounds=rounds),
               side.identity)
    names = reachable(transport, side.enrolled)
    answers, failed = transport.exchange("setup", {n: {"step": b"run/start", "data": msg} for n in names}, round_=0)
    refused = dict(failed)
    refused.update({n: "no acknowledgement" for n in names if n not in failed and "ok" not in answers.get(n, {})})
    for name, why in sorted(refused.items()):
        event("refused", {"round": 0, "hospital": name, "stage": "run/start", "reason": why[:300], "final": False})
    return refused
