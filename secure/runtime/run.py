"""One federation run -- the only multi-round driver. ``simulate()`` runs it over the in-process
transport, the Flower ServerApp over Flower; nothing else differs.

A run, as data flows (architecture.md, "One round"; docs/architecture.md, "One run"):

0. **Set-up sums** (:attr:`~.models.RunModels.setup`, e.g. federated scaling, shared features):
   each announced (``setup/sum``), summed in one round, and its result agreed by every hospital
   (``setup/result``) in the first audit run (:mod:`.setup`); the candidates' rounds follow.
1. **Per candidate** of :class:`~.models.RunModels` (simplest first; one candidate: the model):
   a signed :class:`~.models.RunStart` tells every hospital which of *its own* candidates to
   train and for how many rounds (``setup`` step ``run/start``; a hospital under DP calibrates
   its noise for them, or refuses), then
   :meth:`ServerSide.open_run` builds the candidate's server with the secure mode's set-up (the
   CKKS key ceremony) and its own audit run.
2. **Rounds** under the stop rule (:func:`.loop.run_rounds` with a :class:`SelectedRun`): every
   plan carries ``run.phase``, ``run.candidate``, ``run.rounds`` and the selection rule; each
   delivered model is answered by the hospitals' signed :class:`~.selection.SelectionStatus`
   (the federated validation loss of the model they scored); ``patience`` rounds without
   improvement stop training.
3. **Scoring**: one evaluation-only round (``run.phase = "score"``) scores the last model.
4. **Finish**: ``setup`` step ``run/finish`` -- every hospital keeps the selected round's model
   (global + personal) and fits its calibration; ``model_selected`` is audited, then the run's
   ``release`` and ``run_ended``.
5. **Choice** (several candidates): the lowest kept-round federated validation loss wins (a later
   candidate only if lower by more than ``min_delta``); ``model_chosen`` is audited in a last,
   short audit run and a signed :class:`~.models.RunChosen` tells every hospital which model to
   keep (``setup`` step ``run/chosen``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from clinograph.core.errors import ConfigError, ProtocolError

from ..server import FederationServer
from ..wire import seal
from .elimination import ELIMINATION_RULE, Rung, Schedule, schedule, survivors
from .journal import Journal
from .liveness import Liveness
from .loop import EventSink, RoundOutcome, _quiet, run_rounds
from .models import (
    CandidateModel,
    RunChosen,
    RunFinish,
    RunModels,
    RunStart,
    overrides_digest,
    run_id,
)
from .resume import RunState
from .selection import STATUS_PART, SelectionRule, SelectionTracker, read_statuses
from .setup import check_setup, run_setup
from .transport import Restricted, Transport

CHOICE_RULE = ("lowest kept-round federated validation loss; ties (within min_delta) to the earlier, simpler "
               "candidate")


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
        """``run/finish`` to every hospital of the run, then ``model_selected`` (if a loss was seen)."""
        self.stopped = stopped
        last = server.history[-1].round if server.history else server.round
        names = _reachable(transport, server.enrolled)
        msg = seal(RunFinish(federation_id=server.federation_id, round=last), server.identity)
        answers, failed = transport.exchange("setup", {n: {"step": b"run/finish", "data": msg} for n in names},
                                             round_=last)
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


@dataclass
class FederationRun:
    """Every candidate's run and the index of the chosen one (None: one candidate, no choice)."""

    runs: list[CandidateRun]
    chosen: int | None = None

    @property
    def kept(self) -> CandidateRun:
        return self.runs[self.chosen or 0]


def _reachable(transport: Transport, enrolled: Mapping[str, Any]) -> tuple[str, ...]:
    """The enrolled hospitals the transport reaches, by name."""
    return tuple(sorted(set(transport.hospitals()) & set(enrolled)))


def choose(losses: Sequence[float | None], *, min_delta: float) -> int:
    """Index of the chosen candidate: the lowest validation loss, a later candidate only if lower
    by more than ``min_delta`` (ties to the simpler, earlier one); a candidate without a loss
    never wins.

    Raises:
        ConfigError: no candidate has a validation loss.
    """
    best: int | None = None
    for i, loss in enumerate(losses):
        if loss is None or loss != loss:  # None or NaN
            continue
        if best is None or loss < losses[best] - min_delta:  # type: ignore[operator]
            best = i
    if best is None:
        raise ConfigError("No candidate produced a federated validation loss: check [split] validation_fraction > 0 "
                          "and that [selection] is on.")
    return best


def run_federation(models: RunModels, *, side: Any, transport: Transport, rounds: int,
                   on_event: EventSink | None = None,
                   on_round: Callable[[CandidateRun, int, RoundOutcome], None] | None = None,
                   on_run_end: Callable[[CandidateRun], None] | None = None,
                   liveness: Callable[[], Liveness | None] | None = None,
                   journal: Journal | None = None) -> FederationRun:
    """The whole run (module docstring): the set-up sums of ``models``, then every candidate for
    up to ``rounds`` training rounds each, then the choice. ``side`` is the :class:`~.assemble.ServerSide` that
    builds each candidate's server; ``on_round(candidate, r, outcome)`` after each training
    round and ``on_run_end(candidate)`` after each candidate's run (simulation metrics).

    Raises:
        ConfigError: a crash journal with several candidates (one journal holds one run); set-up
            sums under DP, CKKS or a journal (:func:`.setup.check_setup`).
        ProtocolError: a round aborted (audited; the run ends as ``failed``); hospitals derived
            different set-up results.
    """
    event = on_event or _quiet
    cands = models.candidates
    if journal is not None and len(cands) > 1:
        raise ConfigError(f"A crash journal holds one run, and this federation trains {len(cands)} candidates "
                          f"({', '.join(c.name for c in cands)}). Run without a journal, or write the initial model "
                          "with one candidate ([selection] candidates = [] in hospital.toml).")
    from ..strategies import linear_in_sums

    if models.selection is not None and not linear_in_sums(side.federation.strategy):
        raise ConfigError("Model selection decodes the federated validation loss from the summed module "
                          f"metric/validation, and {side.federation.strategy}'s adaptive step is not linear in the "
                          "sums. Write the initial "
                          "model with [selection] enabled = false (one candidate), or use fedavg / fedsgd.")
    check_setup(models, secure_mode=side.federation.secure_mode, dp=side.dp_policy is not None,
                journal=journal is not None)
    models = run_setup(models, side=side, transport=transport, event=event)
    cands = models.candidates
    plan = schedule(len(cands), rounds=rounds, rule=models.elimination) if models.elimination is not None else None
    rungs = plan.rungs if plan is not None else (Rung(rounds=rounds, keep=len(cands)),)
    runs: list[CandidateRun | None] = [None] * len(cands)
    alive = list(range(len(cands)))
    for level, rung in enumerate(rungs):
        last = level == len(rungs) - 1
        for index in alive:
            run = runs[index]
            if run is not None and run.ended:
                continue  # the stop rule ended it: it costs nothing more
            if run is None:
                run = runs[index] = _open(cands[index], index=index, count=len(cands), side=side, transport=transport,
                                          rounds=rounds, rule=models.selection, liveness=liveness, event=event)
            else:
                _resume(run, cands[index], index=index, count=len(cands), rung=level, side=side, transport=transport,
                        rounds=rounds, event=event)
            _train(run, rounds=rounds, pause_after=None if last else rung.rounds, rung=level, side=side,
                   journal=journal, event=event, on_round=on_round)
            if run.ended and on_run_end is not None:
                on_run_end(run)
        if not last:
            alive = _eliminate(runs, alive, rung=rung, level=level, plan=plan,  # type: ignore[arg-type]
                               min_delta=models.selection.min_delta, side=side, event=event)  # type: ignore[union-attr]
    out = FederationRun(runs=[r for r in runs if r is not None])
    if len(cands) > 1:
        pick = choose([out.runs[i].validation_loss for i in alive], min_delta=models.selection.min_delta)  # type: ignore[union-attr]
        out.chosen = alive[pick]
        _announce_choice(out, side=side, transport=transport, event=event)
    return out


def _open(cand: CandidateModel, *, index: int, count: int, side: Any, transport: Transport, rounds: int,
          rule: SelectionRule | None, liveness: Callable[[], Liveness | None] | None,
          event: EventSink) -> CandidateRun:
    """``run/start``, then the candidate's server and audit run."""
    rid = run_id(side.federation_id, cand.name, count=count)
    refused = _start(cand, index=index, count=count, rid=rid, side=side, transport=transport, rounds=rounds,
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
    event("run_started", {"candidate": cand.name, "run_id": rid, "index": index, "count": count})
    return CandidateRun(name=cand.name, overrides=cand.overrides, run_id=rid, outcomes=[], control=control,
                        refused=refused, server=server, transport=narrowed,
                        state=RunState(liveness=liveness() if liveness is not None else None, control=control))


def _record_refused(server: FederationServer, refused: Mapping[str, str]) -> None:
    for name, why in sorted(refused.items()):
        server.audit.record("hospital_refused", {"stage": "setup", "client": name, "reason": f"run/start: {why}"[:4000],
                                                 "signed": False, "final": False})


def _resume(run: CandidateRun, cand: CandidateModel, *, index: int, count: int, rung: int, side: Any,
            transport: Transport, rounds: int, event: EventSink) -> None:
    """A paused candidate goes on: ``run/start`` again (each hospital switches back to it), a new
    audit run (``manifest``, ``run_resumed``) for the same server."""
    server, state = run.server, run.state
    refused = _start(cand, index=index, count=count, rid=run.run_id, side=side, transport=transport, rounds=rounds,
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


def _train(run: CandidateRun, *, rounds: int, pause_after: int | None, rung: int, side: Any,
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


def _start(cand: CandidateModel, *, index: int, count: int, rid: str, side: Any, transport: Transport,
           rounds: int, event: EventSink) -> dict[str, str]:
    """``run/start`` to every hospital; returns who refused, and why."""
    msg = seal(RunStart(federation_id=side.federation_id, run_id=rid, candidate=cand.name,
                        overrides_sha256=overrides_digest(cand.overrides), index=index, count=count, rounds=rounds),
               side.identity)
    names = _reachable(transport, side.enrolled)
    answers, failed = transport.exchange("setup", {n: {"step": b"run/start", "data": msg} for n in names}, round_=0)
    refused = dict(failed)
    refused.update({n: "no acknowledgement" for n in names if n not in failed and "ok" not in answers.get(n, {})})
    for name, why in sorted(refused.items()):
        event("refused", {"round": 0, "hospital": name, "stage": "run/start", "reason": why[:300], "final": False})
    return refused


def _eliminate(runs: list[CandidateRun], alive: list[int], *, rung: Rung, level: int, plan: Schedule,
               min_delta: float, side: Any, event: EventSink) -> list[int]:
    """After rung ``level``: the best ``rung.keep`` of the candidates still in go on (:func:`.elimination.survivors`);
    ``candidates_eliminated`` is audited in a short audit run of its own."""
    keep = [alive[i] for i in survivors([runs[i].validation_loss for i in alive], keep=rung.keep, min_delta=min_delta)]
    dropped = [i for i in alive if i not in keep]
    for i in dropped:
        runs[i].eliminated_after = level
    payload = {"rung": level, "rounds": rung.rounds,
               "candidates": [{"name": runs[i].name, "validation_loss": runs[i].validation_loss,
                               "round": runs[i].kept_round, "rounds_run": runs[i].rounds_run,
                               "stopped_early": bool(runs[i].control.stopped)} for i in alive],
               "kept": [runs[i].name for i in keep], "eliminated": [runs[i].name for i in dropped],
               "rule": ELIMINATION_RULE, "min_delta": float(min_delta), "eta": plan.eta,
               "max_cost": float(plan.max_cost), "schedule": [[r.rounds, r.keep] for r in plan.rungs],
               "cost": plan.cost}
    audit = side.open_audit()
    try:
        audit.record("candidates_eliminated", payload)
    finally:
        audit.close()
    event("candidates_eliminated", {"rung": level, "rounds": rung.rounds, "kept": payload["kept"],
                                    "eliminated": payload["eliminated"]})
    return keep


def _announce_choice(out: FederationRun, *, side: Any, transport: Transport, event: EventSink) -> None:
    """Audit ``model_chosen`` (its own short audit run) and tell every hospital to keep it."""
    kept = out.kept
    rows = [r.row() for r in out.runs]
    audit = side.open_audit()
    try:
        audit.record("model_chosen", {"chosen": kept.name, "candidates": rows, "rule": CHOICE_RULE,
                                      "min_delta": float(kept.control.rule.min_delta)})  # type: ignore[union-attr]
    finally:
        audit.close()
    msg = seal(RunChosen(federation_id=side.federation_id, run_id=kept.run_id, candidate=kept.name), side.identity)
    names = _reachable(transport, side.enrolled)
    _, failed = transport.exchange("setup", {n: {"step": b"run/chosen", "data": msg} for n in names}, round_=0)
    for name, why in sorted(failed.items()):
        event("choice_not_delivered", {"hospital": name, "reason": why[:300]})
    event("model_chosen", {"chosen": kept.name, "candidates": [r["name"] for r in rows]})

