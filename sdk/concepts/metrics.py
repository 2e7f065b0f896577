"""Evaluation of a concept model against full ground truth (F-CMs 5.1, 5.2, E.1).

Variables the model does not predict count as random guesses (accuracy ``1/card``), as in
the paper, so models with different coverage compare fairly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from .model import ConceptModel


def depth_levels(nodes: Sequence[str], edges: Sequence[tuple[str, str]]) -> dict[str, int]:
    """Longest-path depth of every node from the roots of the ground-truth DAG."""
    parents: dict[str, list[str]] = {v: [] for v in nodes}
    for u, v in edges:
        parents[v].append(u)
    depth: dict[str, int] = {}

    def d(v: str) -> int:
        if v not in depth:
            depth[v] = 0 if not parents[v] else 1 + max(d(p) for p in parents[v])
        return depth[v]

    for v in nodes:
        d(v)
    return depth


def ancestors(node: str, edges: Sequence[tuple[str, str]]) -> set[str]:
    """Every node with a directed path to ``node``."""
    out: set[str] = set()
    todo = [node]
    while todo:
        v = todo.pop()
        for a, b in edges:
            if b == v and a not in out:
                out.add(a)
                todo.append(a)
    return out


def _accuracies(model: ConceptModel, x: torch.Tensor, labels: Mapping[str, torch.Tensor],
                cards: Mapping[str, int], interventions: Mapping[str, torch.Tensor] | None = None
                ) -> dict[str, float]:
    with torch.no_grad():
        out = model(x, interventions=interventions) if model.graph.nodes else None
    acc = {}
    for v, y in labels.items():
        if out is not None and v in out.logits:
            acc[v] = float((out.logits[v].argmax(1) == y).float().mean())
        else:
            acc[v] = 1.0 / cards[v]
    return acc


def evaluate(model: ConceptModel, x: torch.Tensor, labels: Mapping[str, torch.Tensor], *, task: str,
             cards: Mapping[str, int], gt_edges: Sequence[tuple[str, str]]) -> dict:
    """Task accuracy, concept accuracy (all concepts), coverage of task-relevant concepts, and
    the intervention curve over ground-truth depth levels.

    Intervention curve: at level ``L`` every *predicted* concept of depth ``<= L`` is set to its
    true value; ``task_acc`` is the task accuracy and ``label_acc`` the mean accuracy over the
    variables not intervened (concepts and task), as in Figure 2.
    """
    nodes = list(labels)
    concepts = [v for v in nodes if v != task]
    acc = _accuracies(model, x, labels, cards)
    relevant = ancestors(task, gt_edges)
    predicted = set(model.graph.nodes)
    coverage = len(relevant & predicted) / len(relevant) if relevant else 1.0
    depth = depth_levels(nodes, gt_edges)
    curve = [{"level": -1, "intervened": 0, "task_acc": acc[task],
              "label_acc": float(np.mean([acc[v] for v in nodes]))}]
    for level in range(max(depth[c] for c in concepts) + 1):
        chosen = [c for c in concepts if depth[c] <= level and c in predicted]
        iv = {c: labels[c] for c in chosen}
        a = _accuracies(model, x, labels, cards, iv)
        rest = [v for v in nodes if v not in chosen]
        curve.append({"level": level, "intervened": len(chosen), "task_acc": a[task],
                      "label_acc": float(np.mean([a[v] for v in rest])) if rest else 1.0})
    return {"task_acc": acc[task], "concept_acc": float(np.mean([acc[c] for c in concepts])),
            "coverage": coverage, "n_predicted": len(predicted), "intervention_curve": curve}
