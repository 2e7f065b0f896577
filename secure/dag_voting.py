"""DAG voting over the hospitals' concept graphs (F-CMs section 4.2.1), as sums.

Each hospital encodes its proposal -- a binary adjacency ``A^(k)`` or an edge-confidence
matrix ``S^(k)`` over the concepts it supervises, ``I^(k)`` -- into one flat vector over the
federation's global concept list, already multiplied by its weight ``alpha_k``.  Per
unordered pair ``{i, j}`` (``i < j`` in list order) the vector holds four slots::

    alpha_k S_ij,  alpha_k S_ji,  alpha_k (1 - S_ij - S_ji),  alpha_k      (only if i, j in I^(k))

and per node one slot ``alpha_k 1[j in I^(k)]``.  A hospital that does not observe both nodes
of a pair writes zeros there, so the *sum* of the vectors is exactly the paper's tally
``[S_bar]_ij = sum_{k: i,j in I^(k)} alpha_k S_ij`` (and ``S_bar(none)``), together with the
weight of the clients that observed the pair and the supervised-concept set ``M_t``.

Because the tally is a sum, votes travel as one more shared module (:data:`VOTE_MODULE`)
through whatever secure-aggregation mode the round uses: under ``masked`` the server learns
the tally and nothing about any single hospital's vote; under ``ckks`` it learns nothing and
the hospitals decrypt the tally.  What the tally does reveal (by design): the weighted
number of hospitals that supervise each concept and that observe each pair.

The decision (:func:`decide_dag`) is public post-processing of the tally: argmax over the
three outcomes with a seeded random tie-break, projection to a DAG by repeatedly dropping
the weakest edge of a cycle, and at least one parent for the task.  The tie-break seed is
not secret; the draws come from the public SHAKE-256 stream of
:mod:`clinograph.secure.public_random` (domain :data:`PUBLIC_TIE_BREAK`), which an auditor can
recompute with any library -- not from numpy's generators, whose streams may change.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from clinograph.core.errors import ProtocolError, SchemaError
from clinograph.core.fields import RoundNumber
from clinograph.core.spec import ModuleKind, ModuleSpec

from .public_random import public_index

#: Name of the vote module in the ModelSpec (summed like any shared module).
VOTE_MODULE = "vote/dag"
_SLOTS = 4  # S_ij, S_ji, S_none, observed-both
#: Domain label of the public tie-break stream (not a secret: the seed and the tally are public).
PUBLIC_TIE_BREAK = b"clinograph/v1/dag-voting/public-tie-break"
_TOL = 1e-9


def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.triu_indices(n, k=1)


def vote_length(n_concepts: int) -> int:
    """Length of a vote vector over ``n_concepts`` global concepts: ``n + 4 n(n-1)/2``."""
    return n_concepts + _SLOTS * (n_concepts * (n_concepts - 1) // 2)


def vote_module_spec(concepts: Sequence[str]) -> ModuleSpec:
    """The :class:`ModuleSpec` of the vote module for this concept list (shared, summed)."""
    return ModuleSpec(name=VOTE_MODULE, shape=(vote_length(len(concepts)),), kind=ModuleKind.SHARED)


def encode_vote(*, concepts: Sequence[str], local_nodes: Sequence[str], scores: np.ndarray,
                weight: float) -> np.ndarray:
    """One hospital's weighted vote vector (float64) over the global ``concepts``.

    Args:
        concepts: the federation's global concept list (task included), in plan order.
        local_nodes: the nodes this hospital supervises, ``I^(k)`` (plus the task if it has it).
        scores: ``(m, m)`` matrix over ``local_nodes``: ``A^(k)`` (0/1) or ``S^(k)`` (confidences),
            entry ``[a, b]`` for the edge ``a -> b``; ``S_ab + S_ba <= 1``, zero diagonal.
        weight: ``alpha_k`` (for instance the hospital's sample count), positive.

    Raises:
        SchemaError: every problem with the inputs at once (unknown nodes, bad shape or values).
    """
    index = {c: i for i, c in enumerate(concepts)}
    problems: list[str] = []
    if len(index) != len(concepts):
        problems.append("the global concept list repeats a name")
    unknown = [c for c in local_nodes if c not in index]
    if unknown:
        problems.append(f"{len(unknown)} local node(s) are not in the global concept list "
                        f"(first: {unknown[:3]}); add them to the plan's concept list")
    if len(set(local_nodes)) != len(local_nodes):
        problems.append("local_nodes repeats a name")
    s = np.asarray(scores, dtype=np.float64)
    m = len(local_nodes)
    if s.shape != (m, m):
        problems.append(f"scores has shape {s.shape}, expected ({m}, {m}) to match local_nodes")
    elif m:
        if not np.all(np.isfinite(s)) or s.min() < 0 or s.max() > 1:
            problems.append("scores must be finite and within [0, 1]")
        if np.any(np.abs(np.diag(s)) > _TOL):
            problems.append("scores has a non-zero diagonal (self-loop)")
        if np.any(s + s.T > 1 + _TOL):
            problems.append("S_ab + S_ba exceeds 1 for some pair (both directions claimed)")
    if not (np.isfinite(weight) and weight > 0):
        problems.append("weight must be a positive finite number")
    if problems:
        raise SchemaError(problems, title="DAG vote rejected")
    n = len(concepts)
    full = np.zeros((n, n))
    observed = np.zeros(n, dtype=bool)
    pos = np.array([index[c] for c in local_nodes], dtype=np.int64)
    if m:
        full[np.ix_(pos, pos)] = s
        observed[pos] = True
    iu, ju = _pairs(n)
    both = observed[iu] & observed[ju]
    slots = np.zeros((len(iu), _SLOTS))
    slots[:, 0] = full[iu, ju]
    slots[:, 1] = full[ju, iu]
    slots[:, 2] = 1.0 - full[iu, ju] - full[ju, iu]
    slots[:, 3] = 1.0
    slots[~both] = 0.0
    return float(weight) * np.concatenate([observed.astype(np.float64), slots.ravel()])


class DagTally:
    """The aggregated tally, as matrices over the global concept list.

    ``strength[i, j]`` is ``[S_bar]_ij``; ``none[i, j] == none[j, i]`` is ``S_bar(none)_ij``;
    ``observers[i, j]`` the total weight of hospitals observing both; ``support[j]`` the total
    weight of hospitals supervising ``j`` (``j in M_t`` iff ``support[j] > 0``).
    """

    def __init__(self, concepts: Sequence[str], support: np.ndarray, strength: np.ndarray,
                 none: np.ndarray, observers: np.ndarray) -> None:
        self.concepts = tuple(concepts)
        self.support, self.strength, self.none, self.observers = support, strength, none, observers

    def __add__(self, other: DagTally) -> DagTally:
        """Accumulate tallies across rounds (monotone federation, section 4.2.2)."""
        if other.concepts != self.concepts:
            raise ProtocolError("Cannot add DAG tallies over different concept lists.")
        return DagTally(self.concepts, self.support + other.support, self.strength + other.strength,
                        self.none + other.none, self.observers + other.observers)


def tally_from_sum(*, concepts: Sequence[str], summed: np.ndarray) -> DagTally:
    """Unpack the summed vote vectors (the aggregate of :data:`VOTE_MODULE`) into a tally.

    Raises:
        ProtocolError: the vector does not have :func:`vote_length` entries or is not finite.
    """
    n = len(concepts)
    v = np.asarray(summed, dtype=np.float64).ravel()
    if v.shape != (vote_length(n),) or not np.all(np.isfinite(v)):
        raise ProtocolError(f"The summed DAG vote has {v.size} entries; expected {vote_length(n)} finite "
                            f"values for {n} concepts. Check that every hospital voted over the plan's list.")
    support = v[:n].copy()
    slots = v[n:].reshape(-1, _SLOTS)
    iu, ju = _pairs(n)
    strength, none, observers = np.zeros((n, n)), np.zeros((n, n)), np.zeros((n, n))
    strength[iu, ju], strength[ju, iu] = slots[:, 0], slots[:, 1]
    none[iu, ju] = none[ju, iu] = slots[:, 2]
    observers[iu, ju] = observers[ju, iu] = slots[:, 3]
    return DagTally(concepts, support, strength, none, observers)


class DagOutcome(BaseModel):
    """The voted DAG and the tally it came from (audit log entry, kind ``dag_outcome``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    kind: Literal["dag_outcome"] = "dag_outcome"
    round: RoundNumber
    concepts: tuple[str, ...]
    task: str | None
    active: tuple[bool, ...]
    adjacency: tuple[tuple[int, ...], ...]
    dropped_cycle_edges: tuple[tuple[str, str], ...]
    added_task_parent: tuple[str, str] | None
    tallies: dict[str, tuple[tuple[float, ...], ...]]

    def edges(self) -> list[tuple[str, str]]:
        """Directed edges ``(parent, child)`` of the voted DAG."""
        c = self.concepts
        return [(c[i], c[j]) for i, row in enumerate(self.adjacency) for j, a in enumerate(row) if a]

    def parents(self) -> dict[str, list[str]]:
        """Parents of every active node (in global list order)."""
        out = {c: [] for c, a in zip(self.concepts, self.active, strict=True) if a}
        for a, b in self.edges():
            out[b].append(a)
        return out


def _find_cycle(adj: np.ndarray) -> list[int] | None:
    n = len(adj)
    color = [0] * n
    for root in range(n):
        if color[root]:
            continue
        stack = [(root, iter(np.flatnonzero(adj[root])))]
        path = [root]
        color[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                path.pop()
                color[node] = 2
            elif color[nxt] == 1:
                return path[path.index(int(nxt)):]
            elif color[nxt] == 0:
                color[nxt] = 1
                path.append(int(nxt))
                stack.append((int(nxt), iter(np.flatnonzero(adj[nxt]))))
    return None


def _descendants(adj: np.ndarray, src: int) -> set[int]:
    seen, todo = set(), [src]
    while todo:
        for k in np.flatnonzero(adj[todo.pop()]):
            if int(k) not in seen:
                seen.add(int(k))
                todo.append(int(k))
    return seen


def decide_dag(tally: DagTally, *, task: str | None, seed: int, round_: int = 0,
               known: Collection[str] = (), tie_tolerance: float = 1e-6) -> DagOutcome:
    """Implements F-CMs section 4.2.1: argmax over {i->j, j->i, none}, then projection to a DAG.

    Nodes are the concepts with positive support plus ``known`` (concepts retained from
    earlier rounds).  Pairs no hospital observed get no edge (the paper's tally is all zeros
    there; we do not draw a random edge between never co-observed nodes).  Ties among the
    maximal outcomes are broken uniformly by :func:`public_index` on the public stream
    (``seed``, labelled by the pair or by ``parent``; deterministic per seed, reproducible on any
    machine).  Cycles are resolved by repeatedly removing the
    cycle edge with the smallest strength ``[S_bar]_ij`` (ties: the first in list order).
    If the task is active and ends with no parent, the non-descendant with the highest
    ``[S_bar]_{c,task}`` becomes its parent (ties seeded), so ``y`` is always predicted from a concept.

    ``tie_tolerance`` treats outcomes within it as tied: the masked mode's fixed-point sums
    carry errors around 1e-7, so exact ties in the votes stay ties after secure aggregation.
    """
    names = tally.concepts
    n = len(names)
    active = (tally.support > 0) | np.array([c in set(known) for c in names], dtype=bool)
    adj = np.zeros((n, n), dtype=np.int64)
    for i, j in zip(*_pairs(n), strict=True):
        if not (active[i] and active[j]) or tally.observers[i, j] <= 0:
            continue
        options = np.array([tally.strength[i, j], tally.strength[j, i], tally.none[i, j]])
        best = np.flatnonzero(options >= options.max() - tie_tolerance)
        choice = int(best[0]) if len(best) == 1 else int(best[public_index(
            PUBLIC_TIE_BREAK, seed, label=f"pair:{names[i]}:{names[j]}", k=len(best))])
        if choice == 0:
            adj[i, j] = 1
        elif choice == 1:
            adj[j, i] = 1
    dropped: list[tuple[str, str]] = []
    while (cycle := _find_cycle(adj)) is not None:
        cyc_edges = list(zip(cycle, cycle[1:] + cycle[:1], strict=True))
        weakest = min(cyc_edges, key=lambda e: (tally.strength[e[0], e[1]], e))
        adj[weakest] = 0
        dropped.append((names[weakest[0]], names[weakest[1]]))
    added = None
    if task is not None:
        if task not in names:
            raise ProtocolError(f"Task {task!r} is not in the concept list of the vote.")
        t = names.index(task)
        others = [k for k in range(n) if active[k] and k != t]
        if active[t] and others and not adj[:, t].any():
            desc = _descendants(adj, t)
            cands = [k for k in others if k not in desc] or others
            if not [k for k in others if k not in desc]:
                adj[t, :] = 0  # every concept hangs below the task: cut its outgoing edges
            scores = np.array([tally.strength[k, t] for k in cands])
            best = [cands[i] for i in np.flatnonzero(scores >= scores.max() - tie_tolerance)]
            parent = best[0] if len(best) == 1 else best[public_index(
                PUBLIC_TIE_BREAK, seed, label=f"parent:{task}", k=len(best))]
            adj[parent, t] = 1
            added = (names[parent], task)
    def mat(a: np.ndarray) -> tuple[tuple[float, ...], ...]:
        return tuple(tuple(float(x) for x in row) for row in a)
    return DagOutcome(
        round=round_, concepts=names, task=task, active=tuple(bool(a) for a in active),
        adjacency=tuple(tuple(int(x) for x in row) for row in adj),
        dropped_cycle_edges=tuple(dropped), added_task_parent=added,
        tallies={"strength": mat(tally.strength), "none": mat(tally.none),
                 "observers": mat(tally.observers), "support": (tuple(float(x) for x in tally.support),)},
    )


def ancestor_matrix(adj: np.ndarray) -> np.ndarray:
    """``anc[i, j]`` is True iff there is a directed path ``i -> ... -> j`` (transitive closure)."""
    reach = np.asarray(adj, dtype=bool).copy()
    for k in range(len(reach)):
        reach |= reach[:, [k]] & reach[[k], :]
    return reach


def diff_pairs(adj: np.ndarray, reference: np.ndarray) -> int:
    """DiffPairs (F-CMs appendix E.6): node pairs whose relative order differs between two DAGs.

    The order of ``{i, j}`` is one of: ``i`` ancestor of ``j``, ``j`` ancestor of ``i``, or
    unordered. Both matrices index the same node list.
    """
    a, r = ancestor_matrix(adj), ancestor_matrix(reference)
    iu, ju = _pairs(len(a))
    rel_a = np.where(a[iu, ju], 1, np.where(a[ju, iu], 2, 0))
    rel_r = np.where(r[iu, ju], 1, np.where(r[ju, iu], 2, 0))
    return int(np.sum(rel_a != rel_r))


#: Grid the ``dag_voting`` strategy rounds a tally to before deciding. Votes are sums of
#: integer sample-count weights, so exact ties and exact orders are integers apart; the masked
#: mode's fixed-point sums are within ~1e-4 of them at the default bounds (n/(2·scale) with
#: scale = 2^31/(n·max_weight·clip)). Rounding to this grid makes the decision under masking
#: identical to the plaintext one.
TALLY_RESOLUTION = 1e-3


def decide_from_sum(*, concepts: Sequence[str], summed: np.ndarray, task: str | None, seed: int, round_: int,
                    resolution: float = TALLY_RESOLUTION) -> DagOutcome:
    """The decision of round ``round_`` of a ``dag_voting`` federation on the accumulated tally
    ``summed`` (rounded to multiples of ``resolution``), with tie-break seed ``seed·100003 + round_``.

    The server's strategy and every hospital (from the tally in the signed global model) call
    this, so both reach the same DAG.
    """
    v = np.asarray(summed, dtype=np.float64)
    if resolution > 0:
        v = np.round(v / resolution) * resolution
    return decide_dag(tally_from_sum(concepts=concepts, summed=v), task=task, seed=seed * 100_003 + round_,
                      round_=round_)
