"""Early elimination of candidates on the federated validation loss: successive halving.

Successive halving (Jamieson & Talwalkar 2016; the inner loop of Hyperband, Li et al. 2018) over
a run's candidates (``[selection] candidates`` × ``restarts``): every candidate trains a first
budget of rounds, the best ⌈n/η⌉ on the federated validation loss go on to the next budget, and
so on, until one trains the run's full length. The budgets grow by η from rung to rung and end
at the run's ``rounds``, so a run of k candidates costs about ``rounds`` × (1 + log_η(k)·(η−1)/η)
training rounds instead of k × ``rounds``; :func:`schedule` picks the smallest η ≥
:attr:`EliminationRule.eta` that keeps it within :attr:`EliminationRule.max_cost` × one model's
rounds (4 candidates: η = 2, 2× one model).

The comparison is the one ``model_chosen`` makes (:func:`.run.choose`), applied at each rung to
the candidates still in: each one's lowest federated validation loss so far (the same public
sums as ``model_selected``; a later candidate beats an earlier one only by more than
``min_delta``); a candidate without a loss ranks last. Deterministic given those sums, so a
simulation and a deployment over Flower eliminate the same candidates; each elimination is
audited (``candidates_eliminated``). A candidate the stop rule ended early stays in the
comparison and costs nothing more. The rounds an eliminated candidate ran stay in its own audit
run (its last entry ``run_paused``).

Torch-free; the pure functions here are what the run (:mod:`.run`) calls.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

ELIMINATION_RULE = ("successive halving: after each rung's budget the best ceil(n/eta) candidates on their lowest "
                    "federated validation loss so far go on (ranked as model_chosen ranks: a later candidate beats an "
                    "earlier one only by more than min_delta; no loss ranks last)")


#: fewest training rounds before the first cut
MIN_RUNG_ROUNDS = 2


class EliminationRule(BaseModel):
    """How a run of several candidates eliminates them early: keep the best ⌈n/η⌉ after each rung
    (η at least ``eta``, raised until the run costs at most ``max_cost`` × one model's rounds)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    eta: int = Field(default=2, ge=2, le=16)
    max_cost: float = Field(default=2.0, ge=1.0, le=16.0, allow_inf_nan=False)


@dataclass(frozen=True)
class Rung:
    """One rung: every candidate still in trains until it has ``rounds`` training rounds (or the
    stop rule ends it), then the best ``keep`` go on."""

    rounds: int
    keep: int


@dataclass(frozen=True)
class Schedule:
    """The rungs of a run and the η that gave them; ``cost``: the most training rounds the run's
    candidates train in all (fewer when the stop rule ends some early)."""

    count: int
    eta: int
    rungs: tuple[Rung, ...]
    #: the bound the schedule was chosen for (× one model's rounds)
    max_cost: float = 2.0

    @property
    def cost(self) -> int:
        alive, done, total = self.count, 0, 0
        for rung in self.rungs:
            total += (rung.rounds - done) * alive
            alive, done = rung.keep, rung.rounds
        return total


def _rungs(count: int, rounds: int, eta: int) -> tuple[Rung, ...]:
    alive = [count]
    while alive[-1] > 1:
        alive.append(math.ceil(alive[-1] / eta))
    halvings = len(alive) - 1
    # at least 2 rounds before a cut: the first round scores the initial model only (a status names
    # the model a hospital received, so a rung of r rounds compares the models of rounds 0..r-1)
    budgets = [min(rounds, max(MIN_RUNG_ROUNDS, rounds // eta ** (halvings - i))) for i in range(halvings + 1)]
    out: list[Rung] = []
    for i, budget in enumerate(budgets):
        keep = alive[i + 1] if i < halvings else alive[i]
        if out and budget <= out[-1].rounds:  # a short run: rungs of equal budget merge (the later cut applies)
            out[-1] = Rung(rounds=out[-1].rounds, keep=keep)
            continue
        out.append(Rung(rounds=budget, keep=keep))
    if out[-1].rounds < rounds:  # pragma: no cover - the last budget is ``rounds``
        out.append(Rung(rounds=rounds, keep=out[-1].keep))
    return tuple(out)


def schedule(count: int, *, rounds: int, rule: EliminationRule) -> Schedule:
    """The rungs for ``count`` candidates of up to ``rounds`` training rounds each: η from
    ``rule.eta`` up to ``count``, the first whose cost is within ``rule.max_cost`` × ``rounds``
    (else the cheapest found: a run too short for the bound, e.g. fewer rounds than candidates).
    One candidate: one rung of ``rounds``.
    """
    if count <= 1:
        return Schedule(count=1, eta=rule.eta, rungs=(Rung(rounds=rounds, keep=1),), max_cost=rule.max_cost)
    tried = []
    for eta in range(rule.eta, max(rule.eta, count) + 1):
        s = Schedule(count=count, eta=eta, rungs=_rungs(count, rounds, eta), max_cost=rule.max_cost)
        if s.cost <= rule.max_cost * rounds:
            return s
        tried.append(s)
    return min(tried, key=lambda s: (s.cost, s.eta))


def rank(losses: Sequence[float | None], *, min_delta: float) -> list[int]:
    """Indices of ``losses`` best first, by the choice's rule (:func:`.run.choose` picks the first,
    then the first of the rest, ...): lowest loss, a later one ahead of an earlier one only if
    lower by more than ``min_delta``; None or NaN last, in order."""
    left = list(range(len(losses)))
    out: list[int] = []
    while left:
        best: int | None = None
        for i in left:
            loss = losses[i]
            if loss is None or loss != loss:
                continue
            if best is None or loss < losses[best] - min_delta:  # type: ignore[operator]
                best = i
        if best is None:
            return out + left
        out.append(best)
        left.remove(best)
    return out


def survivors(losses: Sequence[float | None], *, keep: int, min_delta: float) -> list[int]:
    """The indices of the ``keep`` best of ``losses`` (:func:`rank`), in their original order."""
    return sorted(rank(losses, min_delta=min_delta)[:max(1, keep)])
