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
**Early elimination** (several candidates, :attr:`~.models.RunModels.elimination`; :mod:`.elimination`):
   steps 1-2 run in rungs -- every candidate still in trains up to the rung's budget of rounds
   (one after another), its run *paused* at the budget (``run_paused`` ends its audit run; its
   server keeps its state; a later rung resumes it with ``run/start`` and a new audit run,
   ``run_resumed``), then the best ⌈n/η⌉ on the federated validation loss go on
   (``candidates_eliminated``, its own short audit run); the last rung's candidates run to the
   end (3-4). At most ``max_cost`` × one model's training rounds in all.
5. **Choice** (several candidates): among those not eliminated, the lowest kept-round federated validation loss wins (a later
   candidate only if lower by more than ``min_delta``); ``model_chosen`` is audited in a last,
   short audit run and a signed :class:`~.models.RunChosen` tells every hospital which model to
   keep (``setup`` step ``run/chosen``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from clinograph.core.errors import ConfigError

from ..wire import seal
from .candidate import (
    CandidateRun,
    SelectedRun,
    open_candidate,
    reachable,
    resume_candidate,
    train_candidate,
)
from .elimination import ELIMINATION_RULE, Rung, Schedule, schedule, survivors
from .journal import Journal
from .liveness import Liveness
from .loop import EventSink, RoundOutcome, _quiet
from .models import RunChosen, RunModels
from .setup import check_setup, run_setup
from .transport import Transport

__all__ = ["CHOICE_RULE", "CandidateRun", "FederationRun", "SelectedRun", "choose", "run_federation"]

CHOICE_RULE = ("lowest kept-round federated validation loss; ties (within min_delta) to the earlier, simpler "
               "candidate")


@dataclass
class FederationRun:
    """Every candidate's run and the index of the chosen one (None: one candidate, no choice)."""

    runs: list[CandidateRun]
    chosen: int | None = None

    @property
    def kept(self) -> CandidateRun:
        return self.runs[self.chosen or 0]


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
    check_setup(models, secure_mode=side.federation.secure_mode,
                distributed_dp=side.dp_policy is not None and side.dp_policy.distributed is not None,
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
                run = runs[index] = open_candidate(cands[index], index=index, count=len(cands), side=side, transport=transport,
                                          rounds=rounds, rule=models.selection, liveness=liveness, event=event)
            else:
                resume_candidate(run, cands[index], index=index, count=len(cands), rung=level, side=side, transport=transport,
                        rounds=rounds, event=event)
            train_candidate(run, rounds=rounds, pause_after=None if last else rung.rounds, rung=level, side=side,
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
    names = reachable(transport, side.enrolled)
    _, failed = transport.exchange("setup", {n: {"step": b"run/chosen", "data": msg} for n in names}, round_=0)
    for name, why in sorted(failed.items()):
        event("choice_not_delivered", {"hospital": name, "reason": why[:300]})
    event("model_chosen", {"chosen": kept.name, "candidates": [r["name"] for r in rows]})

