"""Client views of a ground-truth DAG for the F-CMs benchmarks (appendix D.1).

A client's node set is the union of random ancestor paths of the task (walks upstream to
a root), plus, for a few random non-root concepts, their own ancestor paths. The task is
dropped at a fraction of clients. The client's graph is the ground-truth DAG induced on
its nodes, perturbed (edges flipped, removed or added, acyclicity kept) at a fraction of
clients. Late clients may see concepts the initial cohort never sees (``held_out``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Edge = tuple[str, str]


@dataclass(frozen=True)
class ClientView:
    """What one hospital supervises (``nodes``, task included if labelled) and its proposed DAG."""

    nodes: tuple[str, ...]
    edges: tuple[Edge, ...]
    has_task: bool
    perturbed: bool

    def adjacency(self) -> np.ndarray:
        """``A^(k)`` over ``nodes``."""
        idx = {v: i for i, v in enumerate(self.nodes)}
        a = np.zeros((len(self.nodes), len(self.nodes)))
        for u, v in self.edges:
            a[idx[u], idx[v]] = 1.0
        return a


def _parents(edges: Sequence[Edge]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for u, v in edges:
        out.setdefault(v, []).append(u)
    return {k: sorted(v) for k, v in out.items()}


def _walk_up(node: str, parents: dict[str, list[str]], allowed: set[str], rng: np.random.Generator) -> list[str]:
    path = [node]
    while True:
        ps = [p for p in parents.get(path[-1], []) if p in allowed]
        if not ps:
            return path
        path.append(ps[int(rng.integers(len(ps)))])


def _is_acyclic(nodes: Sequence[str], edges: set[Edge]) -> bool:
    indeg = {v: 0 for v in nodes}
    for _, v in edges:
        indeg[v] += 1
    todo = [v for v in nodes if indeg[v] == 0]
    seen = 0
    while todo:
        u = todo.pop()
        seen += 1
        for a, b in edges:
            if a == u:
                indeg[b] -= 1
                if indeg[b] == 0:
                    todo.append(b)
    return seen == len(nodes)


def perturb_edges(nodes: Sequence[str], edges: Sequence[Edge], *, fraction: float,
                  rng: np.random.Generator) -> list[Edge]:
    """Flip, remove or add ``round(fraction * |E|)`` edges, keeping the graph acyclic."""
    out = set(edges)
    todo = int(round(fraction * max(len(edges), 1)))
    tries = 0
    while todo > 0 and tries < 50 * (todo + 1):
        tries += 1
        op = rng.integers(3)
        if op < 2 and out:
            e = sorted(out)[int(rng.integers(len(out)))]
            cand = out - {e} if op == 0 else (out - {e}) | {(e[1], e[0])}
        elif len(nodes) >= 2:
            a, b = rng.choice(len(nodes), size=2, replace=False)
            e = (nodes[int(a)], nodes[int(b)])
            if e in out or (e[1], e[0]) in out:
                continue
            cand = out | {e}
        else:
            break
        if _is_acyclic(nodes, cand):
            out, todo = cand, todo - 1
    return sorted(out)


def make_client_views(*, nodes: Sequence[str], edges: Sequence[Edge], task: str, n_clients: int,
                      rng: np.random.Generator, held_out: Sequence[str] = (), n_initial: int = 0,
                      task_drop: float = 0.3, n_task_paths: int = 2, n_extra: int = 2,
                      perturb_clients: float = 0.0, perturb_edges_frac: float = 0.0) -> list[ClientView]:
    """Appendix D.1 client subgraphs. The first ``n_initial`` clients never see ``held_out``.

    Total coverage is ensured: every node is supervised by at least one client (late clients
    cover the held-out ones). At least one client keeps the task.
    """
    parents = _parents(edges)
    roots = {v for v in nodes if v not in parents}
    sets: list[set[str]] = []
    for k in range(n_clients):
        allowed = set(nodes) - (set(held_out) if k < n_initial else set())
        chosen: set[str] = set()
        for _ in range(int(rng.integers(1, n_task_paths + 1))):
            chosen.update(_walk_up(task, parents, allowed, rng))
        extra = sorted(v for v in allowed if v not in roots and v != task)
        for _ in range(int(rng.integers(0, n_extra + 1))):
            if extra:
                chosen.update(_walk_up(extra[int(rng.integers(len(extra)))], parents, allowed, rng))
        sets.append(chosen)
    for v in nodes:  # total coverage
        if not any(v in s for s in sets):
            lo = n_initial if v in held_out else 0
            k = int(rng.integers(lo, n_clients))
            sets[k].update(_walk_up(v, parents, set(nodes) - (set(held_out) if k < n_initial else set()), rng))
    drop = rng.random(n_clients) < task_drop
    if drop.all():
        drop[int(rng.integers(n_clients))] = False
    n_pert = int(round(perturb_clients * n_clients))
    pert = set(rng.choice(n_clients, size=n_pert, replace=False).tolist()) if n_pert else set()
    views = []
    order = list(nodes)
    for k, s in enumerate(sets):
        if drop[k]:
            s = s - {task}
        local = [v for v in order if v in s]
        local_edges = [(u, v) for u, v in edges if u in s and v in s]
        if k in pert:
            local_edges = perturb_edges(local, local_edges, fraction=perturb_edges_frac, rng=rng)
        views.append(ClientView(tuple(local), tuple(local_edges), task in s, k in pert))
    return views
