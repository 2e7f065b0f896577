"""Naming the hospital whose input voids rounds: adaptive group testing over ordinary rounds.

A round is *voided* when its sum is refused for what went into it
(:class:`~clinograph.secure.aggregation.AggregateVoided`): the masked bound check, the
distributed-DP noise test, or, in ckks, a contributor refusing the aggregate it decrypted (a
ciphertext under another key makes every hospital's tag check fail). Nobody sees one hospital's
input, so the sum cannot say whose it was. :class:`Attribution` finds it by binary splitting
(adaptive group testing) in which every test is an *ordinary round* over a subset of the
hospitals: a fresh plan, fresh training, fresh masks or ciphertexts, at least ``min_size``
participants, and never a round the secure mode refuses to plan (:func:`round_fits`: a configured
masked threshold above a small round's size). A test round that aggregates is a real training round (it counts in the run's
rounds); one that voids is lost like the round that started the search.

The search (one at a time; state in :class:`Search`):

* ``suspects`` I: the intersection of the input sets of the search's voided rounds (at first, the
  voided round's); the proof. ``candidates`` C, a subset of I: where a hospital that voids every
  round it is in must be, given the rounds that aggregated; it only steers. ``vouched`` V: the
  hospitals that contributed to a round of this search that aggregated.
* Each test round invites half of C plus every vouched hospital outside I (*fillers*, which make
  up ``min_size``). When C is one hospital not yet proven, it is invited with the fillers (the
  confirmation). When a half and the fillers fall short of ``min_size``, the hospitals outside I
  are tested alone first (a round that vouches for them).
* Voided: I and C shrink to the round's inputs. Aggregated: its contributors are vouched and
  leave C (an emptied C restarts from I). I down to one hospital: it is named, retired from the
  run and audited (``hospital_retired``); every step is audited (``attribution_step``).

Why an honest hospital is never named. An honest input is within every bound and under the
federation's key, so every voided round holds a hostile hospital's input. *One hostile
hospital*, however it behaves, is in every voided round's inputs, hence always in I; fillers
come from outside I and are honest; so I = {u} means u is the hostile one. Rounds that aggregate
steer the search but never enter the proof: a hostile hospital that behaves in some rounds
delays its own naming, it cannot get another named. *Several hospitals that each void every
round they are in*: fillers are vouched (they contributed to a round that aggregated), so they
are none of them; each voided test's hostile input is in its half of C, and I keeps one. What is
**not** covered: two or more hostile hospitals of which one behaves in some rounds (it gets
vouched) and voids others as a filler, with an honest hospital's half -- they can get that
honest hospital named. SECURITY.md ("Voided rounds: who is named") has the limits.

Cost (measured, ``benchmarks/attribution_cost.py``): at most ``ceil(log2 n) + 2`` test rounds per
culprit, of which at most ``ceil(log2 n) + 1`` void; none while no round is voided.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from clinograph.core.errors import ClinographError

from ..server import FederationServer
from .participation import RoundBook

EventSink = Callable[[str, Mapping[str, Any]], None]
METHOD = "group_testing"


def aggregate_refusals(server: FederationServer, book: RoundBook) -> tuple[str, ...]:
    """Hospitals that refused a later stage in a mode where only the hospitals see the sum (ckks:
    the aggregate they decrypted). Such a round is voided (:meth:`FederationServer.void_round`):
    hospitals would otherwise hold different models."""
    if server.mode.server_sees_sum:
        return ()
    return tuple(sorted(n for n, r in book.refused.items() if r["stage"] != "plan"))


def min_test_size(server: FederationServer) -> int:
    """The fewest hospitals a test round may have: ``min_clients`` (every round's floor), and under
    distributed DP the ``min_honest`` hospitals whose noise shares the guarantee needs."""
    policy = server.dp_policy
    honest = policy.distributed.min_honest if policy is not None and policy.distributed is not None else 1
    return max(server.min_clients, honest, 1)


def round_fits(server: FederationServer, participants: tuple[str, ...]) -> bool:
    """Whether the secure mode can run a round with exactly ``participants``: its plan options
    build, and there are at least as many as its threshold (masked: ``masked.threshold``, which a
    configuration may fix above a small round's size)."""
    try:
        threshold = server.mode_options(participants).get("masked.threshold", 1)
    except ClinographError:
        return False
    return not isinstance(threshold, int) or len(participants) >= threshold


@dataclass
class Search:
    """One open search (see the module docstring): the round that opened it and what is known."""

    opened_by: int
    suspects: frozenset[str]
    candidates: frozenset[str]
    vouched: frozenset[str] = frozenset()
    evidence: list[int] = field(default_factory=list)  # voided rounds, the opening one first
    tests: int = 0
    max_tests: int = 0
    stuck: bool = False  # the suspects cannot be split into rounds of min_size


@dataclass
class Attribution:
    """The run's group testing (see the module docstring). ``min_size``: :func:`min_test_size`."""

    min_size: int
    #: whether the secure mode can run a round with exactly these participants (:func:`round_fits`)
    fits: Callable[[tuple[str, ...]], bool] | None = None
    search: Search | None = None

    @classmethod
    def for_server(cls, server: FederationServer) -> Attribution:
        """The run's group testing, with the server's floor and secure mode."""
        return cls(min_size=min_test_size(server), fits=lambda p: round_fits(server, p))

    def _ok(self, group: set[str] | frozenset[str]) -> bool:
        return len(group) >= self.min_size and (self.fits is None or self.fits(tuple(sorted(group))))

    def invite(self, pool: tuple[str, ...]) -> tuple[str, ...]:
        """Who the next round invites: ``pool`` itself, or during a search the next test set."""
        s = self.search
        if s is None:
            return pool
        available = set(pool)
        suspects = s.suspects & available
        fillers = (s.vouched & available) - s.suspects
        cands = sorted((s.candidates & available) or suspects)
        if not cands:
            return pool  # the suspects are out of reach; the next void ends the search
        core = set(cands if len(cands) == 1 else cands[:math.ceil(len(cands) / 2)])
        outside = available - s.suspects
        if not self._ok(core | fillers) and self._ok(outside) and outside - s.vouched:
            return tuple(sorted(outside))  # vouch for the non-suspects first
        for name in cands + sorted(suspects):  # still short: widen the core (fewer narrowed)
            if self._ok(core | fillers):
                break
            core.add(name)
        if suspects <= core or not self._ok(core | fillers):  # nothing can narrow the suspects: an ordinary round
            s.stuck = True  # and, if it voids, the search ends inconclusive
            return pool
        return tuple(sorted(core | fillers))

    def voided(self, server: FederationServer, *, round_: int, inputs: tuple[str, ...],
               retired: MutableMapping[str, str], event: EventSink) -> bool:
        """A round voided with ``inputs`` in its sum: open or advance the search, name and retire
        the culprit when the proof is complete. False: the search cannot go on (the run fails as
        for any aborted round)."""
        s = self.search
        if s is None:
            s = self.search = Search(opened_by=round_, suspects=frozenset(inputs), candidates=frozenset(inputs),
                                     max_tests=2 * math.ceil(math.log2(max(len(inputs), 2))) + 2)
        else:
            s.tests += 1
            s.suspects &= frozenset(inputs)
            s.candidates = (s.candidates & frozenset(inputs)) or s.suspects
        s.evidence.append(round_)
        end = None
        if len(s.suspects) == 1:
            end = "named"
        elif not s.suspects or s.tests >= s.max_tests or s.stuck:
            end = "inconclusive"
        _audit(server, s, round_=round_, outcome="voided", hospitals=inputs, end=end, event=event)
        if end == "named":
            (culprit,) = s.suspects
            reason = (f"its input voided round(s) {', '.join(map(str, s.evidence))}: the only hospital whose input "
                      f"was in every one (group testing, {s.tests} test round(s))")
            retired[culprit] = reason
            payload = {"round": round_, "client": culprit, "reason": reason, "evidence": list(s.evidence),
                       "method": METHOD}
            server.audit.record("hospital_retired", payload)
            event("hospital_retired", payload)
        if end is not None:
            self.search = None
        return end != "inconclusive"

    def aggregated(self, server: FederationServer, *, round_: int, contributors: tuple[str, ...],
                   event: EventSink) -> None:
        """A round aggregated: during a search its contributors are vouched for."""
        s = self.search
        if s is None:
            return
        s.tests += 1
        s.stuck = False
        s.vouched |= frozenset(contributors)
        s.candidates = (s.candidates - s.vouched) or (s.suspects - s.vouched) or s.suspects
        end = "inconclusive" if s.tests >= s.max_tests else None
        _audit(server, s, round_=round_, outcome="aggregated", hospitals=contributors, end=end, event=event)
        if end is not None:
            self.search = None


def _audit(server: FederationServer, s: Search, *, round_: int, outcome: str, hospitals: tuple[str, ...],
           end: str | None, event: EventSink) -> None:
    """One ``attribution_step`` entry (and event) for a round of search ``s``."""
    payload = {"round": round_, "opened_by": s.opened_by, "test": s.tests, "outcome": outcome,
                   "hospitals": sorted(hospitals), "suspects": sorted(s.suspects),
               "candidates": sorted(s.candidates), "vouched": sorted(s.vouched), "end": end, "method": METHOD}
    server.audit.record("attribution_step", payload)
    event("attribution_step", payload)
