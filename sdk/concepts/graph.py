"""ConceptGraph: the concept set ``M_t``, the task and the parent sets ``B_j(t)`` (F-CMs 4.1)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from clinograph.core.errors import ConfigError


@dataclass(frozen=True)
class ConceptGraph:
    """Which nodes the model predicts and what each node's module takes as input.

    ``nodes`` are the predicted variables (concepts and, when supervised somewhere, the task),
    ``cards`` their number of states, ``parents[v]`` the ordered input set ``B_v(t)``.
    Bipartite instantiations use :meth:`bipartite` (concepts have no parents; the task's
    parents are all concepts); graph-based ones use a voted DAG (:meth:`from_edges`).
    """

    nodes: tuple[str, ...]
    cards: Mapping[str, int]
    parents: Mapping[str, tuple[str, ...]]
    task: str

    def __post_init__(self) -> None:
        problems = [f"node {v!r} has no cardinality" for v in self.nodes if v not in self.cards]
        problems += [f"parent {p!r} of {v!r} is not a node" for v in self.nodes
                     for p in self.parents.get(v, ()) if p not in self.nodes]
        if problems:
            raise ConfigError("Invalid ConceptGraph: " + "; ".join(problems))
        self.order()  # raises on a cycle

    @property
    def concepts(self) -> tuple[str, ...]:
        """The predicted concepts (the task excluded)."""
        return tuple(v for v in self.nodes if v != self.task)

    @property
    def has_task(self) -> bool:
        """Whether the task node is predicted (some hospital supervises it)."""
        return self.task in self.nodes

    def parents_of(self, node: str) -> tuple[str, ...]:
        """``B_node(t)`` in a stable order."""
        return tuple(self.parents.get(node, ()))

    def order(self) -> list[str]:
        """Topological order of the nodes (ties in ``nodes`` order); raises on a cycle."""
        done: set[str] = set()
        out: list[str] = []
        while len(out) < len(self.nodes):
            ready = [v for v in self.nodes if v not in done and set(self.parents_of(v)) <= done]
            if not ready:
                raise ConfigError("ConceptGraph has a cycle; project the voted graph to a DAG first.")
            out.extend(ready)
            done.update(ready)
        return out

    def children(self, node: str) -> list[str]:
        """Nodes that take ``node`` as input."""
        return [v for v in self.nodes if node in self.parents_of(v)]

    def descendants(self, node: str) -> set[str]:
        """All nodes downstream of ``node``."""
        seen: set[str] = set()
        todo = [node]
        while todo:
            for c in self.children(todo.pop()):
                if c not in seen:
                    seen.add(c)
                    todo.append(c)
        return seen

    @classmethod
    def bipartite(cls, *, concepts: Sequence[str], task: str, cards: Mapping[str, int],
                  with_task: bool = True) -> ConceptGraph:
        """CBM/CEM graph: every concept is a root; the task reads all concepts."""
        nodes = tuple(c for c in concepts if c != task) + ((task,) if with_task else ())
        parents = {task: tuple(c for c in nodes if c != task)} if with_task else {}
        return cls(nodes=nodes, cards=dict(cards), parents=parents, task=task)

    @classmethod
    def from_edges(cls, *, nodes: Sequence[str], edges: Sequence[tuple[str, str]], task: str,
                   cards: Mapping[str, int]) -> ConceptGraph:
        """CGM/C2BM graph from a DAG's edges restricted to ``nodes`` (parents in ``nodes`` order)."""
        keep = set(nodes)
        parents: dict[str, tuple[str, ...]] = {}
        for v in nodes:
            ps = {a for a, b in edges if b == v and a in keep}
            parents[v] = tuple(p for p in nodes if p in ps)
        return cls(nodes=tuple(nodes), cards=dict(cards), parents=parents, task=task)
