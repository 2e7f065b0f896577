"""The round loop -- the only one. Every deployment, simulation, benchmark and demo runs it.

One round (architecture.md, "One round, as data flows"):

1. ``plan``: the server signs the plan; each participant verifies it, trains, and answers with
   its signed report and the secure mode's first message. The previous round's global model
   rides along when the transport defers it (Flower).
2. ``stage`` (0..n times): the secure mode's later stages, each sent only to the hospitals it
   names; silence or a refusal drops the hospital, the mode recovers.
3. close: the server applies the strategy module-wise, audits, publishes the model.
4. ``end``: survivors load the new global model (or apply the aggregate they decrypted, in
   modes where the server never sees it) -- immediately, or with the next plan.

What the loop audits (:mod:`.participation`): a ``round_participation`` entry per round (who
was invited, answered, contributed, dropped where and why, refused and why), a
``hospital_refused`` entry per signed hospital refusal, and at the end of :func:`run_rounds`
the run's ``release`` and ``run_ended``. A refusal that is final for the run (a spent privacy
budget) takes the hospital out of later rounds; when fewer than ``min_clients`` hospitals can
take part the run ends as planned (``run_ended`` status ``too_few_hospitals``), not as a crash.
A round voided by what went into it starts group testing over the next rounds (:mod:`.attribution`:
``attribution_step`` entries; the hospital it names is retired, ``hospital_retired``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from clinograph.core.arguments import checked_arguments
from clinograph.core.errors import ConfigError, ProtocolError

from ..messages import RoundResult
from ..server import FederationServer
from ..state import state_digest
from .attribution import Attribution, aggregate_refusals
from .journal import Journal
from .liveness import Liveness
from .participation import RoundBook, end_run
from .resume import RunState, check_journalable, resume, save
from .selection import STATUS_PART
from .transport import Transport

EventSink = Callable[[str, Mapping[str, Any]], None]
#: ``on_boundary(stage, info)`` after each stage of a round: ``open`` (the plan is signed, not yet
#: sent), ``plan``, ``stage <k>``, ``close``
#: (info: ``result``, ``invited``, ``pending`` = the model owed to each survivor, ``final``),
#: ``aborted`` (info: ``final``) and, when the loop delivers the model itself, ``end``.
BoundarySink = Callable[[str, Mapping[str, Any]], None]


@dataclass(frozen=True)
class RoundOutcome:
    """The round's result, who was dropped where, and the model still owed to each survivor."""

    result: RoundResult
    dropped: dict[str, str]
    pending_model: dict[str, bytes] = field(default_factory=dict)
    #: hospitals whose signed refusal is final for the run (privacy budget spent) -> reason
    final_refusals: dict[str, str] = field(default_factory=dict)
    #: each hospital's signed answer to the model's delivery (:mod:`.selection`), when it sent one
    statuses: dict[str, bytes] = field(default_factory=dict)


class RoundAborted(ProtocolError):
    """The round aborted (audited as ``round_aborted`` and ``round_participation``).
    ``final_refusals``: hospitals whose refusal in it ends their part in the run; ``voided``: the
    round's sum was refused for what went into it, and these hospitals' inputs were in it
    (:mod:`.attribution`), else None."""

    def __init__(self, message: str, *, round_: int, final_refusals: Mapping[str, str],
                 voided: tuple[str, ...] | None = None):
        super().__init__(message)
        self.round = round_
        self.final_refusals = dict(final_refusals)
        self.voided = voided


def _quiet(kind: str, data: Mapping[str, Any]) -> None:
    return None


def stage_progress(event: EventSink, transport: Transport, *, round_: int, stage: str, asked: Mapping[str, Any],
                   answers: Mapping[str, Any]) -> None:
    """One ``stage_progress`` event (:mod:`.progress`): how many of ``asked`` answered, the slowest
    of them (seconds from the transport's ``last_timings``, when it keeps them) and who did not."""
    timings = {n: t for n, t in (getattr(transport, "last_timings", None) or {}).items() if n in answers}
    data: dict[str, Any] = {"round": round_, "stage": stage, "answered": len(answers), "asked": len(asked),
                            "missing": sorted(n for n in asked if n not in answers)}
    if timings:
        slowest = max(sorted(timings), key=lambda n: timings[n])
        data.update(slowest=slowest, slowest_s=round(float(timings[slowest]), 3))
    event("stage_progress", data)


def relay_stages(next_stage: Callable[[], Mapping[str, bytes] | None], receive: Callable[[bytes, str], object],
                 transport: Transport, *, round_: int, dropped: dict[str, str],
                 book: RoundBook | None = None, on_stage: Callable[[int], None] | None = None,
                 on_event: EventSink | None = None) -> None:
    """The secure mode's later stages: each stage's messages to the hospitals it names, their
    replies back to ``receive(data, channel)``; silence or refusal adds to ``dropped`` (and,
    with a ``book``, signed refusals are checked and audited). ``on_event`` gets a
    ``stage_progress`` event after each stage."""
    stage = 1
    while (messages := next_stage()) is not None:
        live = {n: {"data": d} for n, d in sorted(messages.items()) if n not in dropped}
        answers, failed = transport.exchange("stage", live, round_=round_)
        if on_event is not None:
            stage_progress(on_event, transport, round_=round_, stage=f"stage {stage}", asked=live, answers=answers)
        if book is not None:
            book.screen("stage", f"stage {stage}", answers, failed, live)
        for name, reason in failed.items():
            dropped.setdefault(name, f"stage {stage}: {reason}")
        for name, parts in answers.items():
            if "reply" in parts:
                receive(parts["reply"], name)
        if on_stage is not None:
            on_stage(stage)
        stage += 1


@checked_arguments
def run_round(server: FederationServer, transport: Transport, *, participants: tuple[str, ...] | None = None,
              pending_model: Mapping[str, bytes] | None = None, on_event: EventSink | None = None,
              on_boundary: BoundarySink | None = None, deliver: bool = False) -> RoundOutcome:
    """Run one round with ``participants`` (default: every enrolled hospital the transport reaches).

    ``on_boundary`` is called after each stage (see :data:`BoundarySink`); :func:`run_rounds`
    journals the server there. ``deliver``: send the new model at once even when the transport
    would let it ride with the next plan (the run's stop rule needs the hospitals' answers now).

    Raises:
        ProtocolError: the round aborted (too few survivors for the secure mode); it is audited
            as ``round_aborted`` and nothing of it is published.
    """
    event = on_event or _quiet
    boundary = on_boundary or _quiet
    if participants is None:
        participants = tuple(sorted(set(transport.hospitals()) & set(server.enrolled)))
    round_ = server.round
    plan = server.open_round(participants)
    boundary("open", {})  # before any hospital sees the plan: a crash from here on aborts this round
    event("round_opened", {"round": round_, "participants": list(participants), "secure_mode": server.mode.name})
    dropped: dict[str, str] = {}
    book = RoundBook(server=server, round=round_, invited=tuple(participants), event=event, legacy=dropped)
    carried = dict(pending_model or {})
    behind = _behind(server, participants, carried)
    if behind:  # hospitals that missed rounds get the current model with the plan, which binds it (its digest)
        model_now = server.global_model_bytes(as_published=True)
        carried.update({n: model_now for n in behind})
        server.audit.record("model_caught_up", {"round": round_, "hospitals": list(behind),  # who loads what, audited
                                                "global_state_digest": state_digest(server.state)})
        event("model_caught_up", {"round": round_, "hospitals": list(behind)})
    outgoing = {n: {"data": plan, **({"model": carried[n]} if n in carried else {})} for n in participants}
    answers, failed = transport.exchange("plan", outgoing, round_=round_)
    stage_progress(event, transport, round_=round_, stage="plan", asked=outgoing, answers=answers)
    book.screen("plan", "plan", answers, failed, outgoing)
    for name in participants:
        if name in dropped:
            continue
        parts = answers[name]
        if "report" not in parts or "first" not in parts:
            book.drop(name, "plan", "answer to the plan lacks the report or the first message")
            continue
        book.answered.append(name)
        if server.receive_report(parts["report"], channel=name):
            server.receive(parts["first"], channel=name)
    boundary("plan", {})
    relay_stages(server.next_stage, lambda data, name: server.receive(data, channel=name), transport,
                 round_=round_, dropped=dropped, book=book, on_stage=lambda k: boundary(f"stage {k}", {}),
                 on_event=event)
    for name, reason in sorted(dropped.items()):
        if name not in book.refused:
            event("dropped", {"round": round_, "hospital": name, "reason": reason})
    refusing = aggregate_refusals(server, book)
    if refusing:  # ckks: hospitals refused the aggregate they decrypted -- applied nowhere, voided
        server.void_round(book.refused[refusing[0]]["reason"][:300], refused_by=refusing)
    rnd = server.current
    epsilon = {n: {"epsilon": r.ledger.epsilon, "budget": r.ledger.budget_epsilon}
               for n, r in sorted(rnd.reports.items()) if r.ledger is not None}
    try:
        result = server.close_round()
    except ProtocolError as exc:
        book.record(contributed=(), rejected=rnd.rejected, abort=str(exc))
        boundary("aborted", {"final": dict(book.final)})
        raise RoundAborted(str(exc), round_=round_, final_refusals=book.final,
                           voided=getattr(exc, "inputs", None)) from exc
    book.record(contributed=result.contributors, rejected=result.rejected, abort=None)
    # Empty bytes = "apply the aggregate you decrypted" (the server holds no plaintext model).
    model = server.global_model_bytes() if server.state is not None else b""
    survivors = [n for n in participants if n not in dropped]
    # counted (and journalled) before the event: an interrupt in an event sink (Ctrl-C) must not leave
    # an aggregated round out of run_ended's rounds_completed
    boundary("close", {"result": result, "invited": tuple(participants), "pending": {n: model for n in survivors},
                       "final": dict(book.final)})
    event("round_closed", {"round": round_, "contributors": list(result.contributors), "dropped": sorted(dropped),
                           "refused": sorted(book.refused), "epsilon": epsilon,
                           "scoring": server.run_options.get("run.phase") == "score"})  # evaluates, trains nothing
    if transport.defers_model and not deliver:
        return RoundOutcome(result=result, dropped=dropped, pending_model={n: model for n in survivors},
                            final_refusals=book.final)
    end_out = {n: {"model": model} for n in survivors}
    end_answers, end_failed = transport.exchange("end", end_out, round_=round_)
    statuses = {}
    for name in sorted(end_answers):
        if "refusal" in end_answers[name]:  # audited like any refusal; the round itself is closed
            book.screen("end", "end", {name: end_answers[name]}, {}, end_out)
        elif STATUS_PART in end_answers[name]:
            statuses[name] = end_answers[name][STATUS_PART]
    for name, reason in end_failed.items():
        event("end_not_delivered", {"round": round_, "hospital": name, "reason": reason})
    boundary("end", {})
    return RoundOutcome(result=result, dropped=dropped, final_refusals=book.final, statuses=statuses)


def _behind(server: FederationServer, participants: tuple[str, ...], carried: Mapping[str, bytes]) -> tuple[str, ...]:
    """The invited hospitals that may not hold the current global model: not among the last closed
    round's contributors (who were sent it) and not owed it with this plan already. They were dropped,
    suspended or restarted since; a hospital that has it ignores the copy (``on_round_end``). None
    before a round has closed (every hospital starts from the initial model) or when the server holds
    no plaintext model (ckks: the hospitals decrypt each round's aggregate; one that missed a round
    cannot rejoin)."""
    if not server.history or server.state is None:
        return ()
    sent = set(server.history[-1].contributors)
    return tuple(n for n in participants if n not in sent and n not in carried)


class RunControl(Protocol):
    """What a whole run adds to the rounds (:class:`.run.SelectedRun` is the one implementation):
    the options every plan carries, the stop rule, the evaluation-only scoring round and the
    run's last step before its ``release`` and ``run_ended`` entries."""

    #: deliver every round's model at once (the stop rule reads the hospitals' answers to it)
    deliver: bool

    def begin(self, *, first_round: int) -> None:
        """The run starts (or resumes) at round ``first_round`` (kept from the first call)."""

    def options(self, *, scoring: bool) -> dict[str, float | int | str | bool]:
        """The run's options for the next plan (``scoring``: the evaluation-only round)."""

    def after(self, server: FederationServer, outcome: RoundOutcome) -> bool:
        """Read the round's answers; True: stop training now."""

    def wants_score(self) -> bool:
        """Whether the run ends with an evaluation-only round that scores the last model."""

    def finish(self, server: FederationServer, transport: Transport, *, stopped: bool) -> None:
        """The run's last step (every hospital keeps its model; ``model_selected``)."""

    def to_dict(self) -> dict[str, Any]:
        """Journal form."""

    def load(self, data: Mapping[str, Any]) -> None:
        """Restore from :meth:`to_dict`."""


@checked_arguments
def run_rounds(server: FederationServer, transport: Transport, *, rounds: int,
               participants: tuple[str, ...] | None = None,
               on_round: Callable[[int, RoundOutcome], None] | None = None,
               on_event: EventSink | None = None, liveness: Liveness | None = None,
               journal: Journal | None = None, control: RunControl | None = None,
               state: RunState | None = None, pause_after: int | None = None) -> list[RoundOutcome]:
    """Run ``rounds`` rounds; the last global model is delivered before returning.

    With ``liveness``, hospitals that keep missing rounds are suspended and retried
    (:mod:`.liveness`); suspensions and rejoins are audited. A hospital whose signed refusal is
    final (privacy budget spent) is not invited again; when fewer than ``min_clients`` remain
    the run stops early as planned. An aborted round (:class:`RoundAborted`, a ProtocolError)
    is audited and re-raised after the models owed to hospitals are delivered. Whatever
    happens, the run's ``release`` (if a round aggregated) and ``run_ended`` entries are
    written last. A round voided by what went into it (an out-of-bounds masked vector, a ckks
    ciphertext under another key) instead starts group testing (:mod:`.attribution`): the next
    rounds run over subsets until the hospital whose input voids them is named and retired.

    With a ``control`` (:class:`RunControl`), every plan carries the run's options, the run
    stops early when the control says so, then (if the control wants it) one evaluation-only
    round scores the last model (it is not counted in ``rounds``), and the control's ``finish``
    runs before ``release`` and ``run_ended``.

    With a ``journal`` (:mod:`.journal`), the server and the loop are journalled after every
    stage, and a journal that already holds boundaries is resumed first: the run goes on where
    it stopped (``rounds`` counts the whole run's completed rounds, before and after the
    restart; the returned outcomes are this call's). A round open when the server stopped is
    aborted and audited (reason ``server restart``) and re-run under a new round number.

    ``pause_after``: return once the run has trained that many rounds (of ``rounds``) without the
    scoring round, the control's ``finish``, ``release`` and ``run_ended`` -- the run is paused, not
    ended (:mod:`.elimination`); a later call with the same ``state`` (its :class:`RunState`) goes
    on. A run the stop rule ends before it pauses ends as usual. Not with a journal.
    """
    event = on_event or _quiet
    outcomes: list[RoundOutcome] = []
    run = state if state is not None else RunState(liveness=liveness, control=control)
    if journal is not None and pause_after is not None:
        raise ConfigError("A journalled run cannot pause: one journal holds one run.")
    if journal is not None:
        check_journalable(server)
        resume(journal, server, run, event=event, rounds=rounds)
    status, reason = "completed", f"all {rounds} planned round(s) ran"
    failure: BaseException | None = None
    invited: tuple[str, ...] = ()
    scoring_now = False  # the round in progress is the evaluation-only scoring round
    if run.attribution is None:  # a paused run's search goes on when it resumes
        run.attribution = Attribution.for_server(server)
    attribution = run.attribution

    def on_boundary(stage: str, info: Mapping[str, Any]) -> None:
        open_round: int | None = server.round
        if stage == "plan":
            run.pending = {}  # delivered with the plan (deferring transports) or not owed any more
        elif stage == "close":
            result: RoundResult = info["result"]
            run.completed += 1
            if scoring_now:  # counted with the close it belongs to: a crash or Ctrl-C right after it must not
                run.scored += 1  # leave the scoring round counted as a training round (rounds_completed 2 of 1)
            run.pending = dict(info["pending"])
            run.retired.update(info["final"])
            if liveness is not None:
                for kind, payload in liveness.observe(result.round, info["invited"], result.contributors):
                    server.audit.record(kind, payload)
                    event(kind, payload)
            open_round = None
        elif stage == "aborted":
            run.retired.update(info["final"])
            open_round = None
        elif stage == "end":
            run.pending = {}
            open_round = None
        if journal is not None and not (stage == "end" and control is not None):  # then saved after control.after
            save(journal, server, run, stage=stage, open_round=open_round)

    def one_round(*, scoring: bool) -> RoundOutcome | None:
        while (outcome := attempt(scoring=scoring)) == "voided":
            pass  # a voided round: group testing goes on with the next one
        return outcome  # type: ignore[return-value]

    def attempt(*, scoring: bool) -> RoundOutcome | None | str:
        nonlocal status, reason, invited, scoring_now
        scoring_now = scoring
        pool = participants or tuple(sorted(set(transport.hospitals()) & set(server.enrolled)))
        pool = tuple(n for n in pool if n not in run.retired)
        if run.retired and len(pool) < server.min_clients:
            status, reason = "too_few_hospitals", _too_few(server, pool, run.retired)
            return None
        invited = attribution.invite(pool if liveness is None else liveness.invited(server.round, pool))
        if control is not None:
            server.run_options = control.options(scoring=scoring)
        try:
            outcome = run_round(server, transport, participants=invited, pending_model=run.pending,
                                on_event=event, on_boundary=on_boundary,
                                deliver=control is not None and control.deliver)
        except RoundAborted as exc:
            left = [n for n in pool if n not in run.retired]
            planned = bool(exc.final_refusals) and len(left) < server.min_clients
            # planned: the hospitals' final refusals (budgets spent) end the run -- not an error
            event("round_aborted", {"round": exc.round, "reason": str(exc)[:500], "planned_end": planned,
                                    "voided": bool(exc.voided)})
            if planned:
                status, reason = "too_few_hospitals", _too_few(server, tuple(left), run.retired)
                return None
            if exc.voided and attribution.voided(server, round_=exc.round, inputs=exc.voided,
                                                 retired=run.retired, event=event):
                if journal is not None:  # a hospital it named stays retired across a restart
                    save(journal, server, run, stage="aborted", open_round=None)
                return "voided"
            status, reason = "failed", f"round {exc.round} aborted: {exc}"
            raise
        attribution.aggregated(server, round_=outcome.result.round, contributors=outcome.result.contributors,
                               event=event)
        outcomes.append(outcome)
        return outcome

    stopped = paused = False
    limit = rounds if pause_after is None else min(rounds, pause_after)
    try:
        if control is not None:
            control.begin(first_round=server.round)
        while run.trained < limit and not run.stopped:
            r = run.trained
            outcome = one_round(scoring=False)
            if outcome is None:
                break
            if on_round is not None:
                on_round(r, outcome)
            if control is not None:
                run.stopped = control.after(server, outcome)
                if journal is not None:
                    save(journal, server, run, stage="end", open_round=None)
        stopped = run.stopped
        paused = status == "completed" and not stopped and run.trained < rounds
        if paused:
            return outcomes
        if stopped:
            reason = f"stopped early after {run.trained} round(s): validation loss, patience"
        if status == "completed" and control is not None:
            if control.wants_score() and not run.score_done:
                outcome = one_round(scoring=True)
                if outcome is not None:  # run.scored was counted at its close (on_boundary)
                    run.score_done = True
                    control.after(server, outcome)
                    if journal is not None:
                        save(journal, server, run, stage="end", open_round=None)
            if status == "completed":
                _deliver_pending(server, transport, run, event)
                control.finish(server, transport, stopped=stopped)
    except BaseException as exc:
        failure = exc
        if status == "completed":
            status, reason = "failed", failure_reason(exc, round_=server.round)
        raise
    finally:
        _deliver_pending(server, transport, run, event)
        try:
            if not paused:
                end_run(server, status=status, reason=reason, rounds_completed=run.trained,
                        rounds_planned=rounds)
        except Exception:
            if failure is None:
                raise  # else the run's own failure is the error to report
        if journal is not None and failure is None:
            save(journal, server, run, stage="run_ended", open_round=None, run_ended=True)
    return outcomes


def failure_reason(exc: BaseException, *, round_: int) -> str:
    """``run_ended``'s reason for a run an exception ended: an operator's interrupt in words (a
    ``KeyboardInterrupt`` carries no message), else the exception's type and its message."""
    if isinstance(exc, KeyboardInterrupt):
        return (f"interrupted by the operator (Ctrl-C / SIGINT) before round {round_} closed: the rounds "
                "before it stand, nothing of that round was applied")
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _deliver_pending(server: FederationServer, transport: Transport, run: RunState, event: EventSink) -> None:
    """The models still owed to hospitals (deferring transports), in one ``end`` exchange."""
    if not run.pending:
        return
    closed = server.history[-1].round if server.history else max(server.round - 1, 0)  # the model's round
    _, failed = transport.exchange("end", {n: {"model": m} for n, m in run.pending.items()}, round_=closed)
    for name, why in failed.items():
        event("end_not_delivered", {"round": closed, "hospital": name, "reason": why})
    run.pending = {}


def _too_few(server: FederationServer, pool: tuple[str, ...], retired: Mapping[str, str]) -> str:
    out = "; ".join(f"{n}: {why}" for n, why in sorted(retired.items()))
    return (f"{len(pool)} hospital(s) can still take part ({', '.join(pool) or 'none'}), fewer than min_clients = "
            f"{server.min_clients}. Out of the run: {out}")
