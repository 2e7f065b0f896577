"""Dynamic architecture adaptation (F-CMs 4.2.2, E1/E2) with warm start, and the E.3 report.

``adapt_model(model, graph)`` builds the model for the new graph: the encoder is kept;
a node whose module interface (kind, states, inputs) is unchanged keeps its parameters
bit-exactly; a node whose inputs changed is warm-started (kept inputs copied, new inputs'
weights zero, removed inputs dropped); a new node gets a freshly initialised module.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch

from .graph import ConceptGraph
from .layers import BlockLinear
from .model import ConceptModel
from .params import state_vectors


@dataclass
class AdaptReport:
    """What changed: per-node outcome and the fraction of parameters not carried over exactly."""

    added: list[str] = field(default_factory=list)
    rewired: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    params_total: int = 0
    params_changed: int = 0

    @property
    def fraction_changed(self) -> float:
        """Share of the new model's parameters that differ from (or are absent in) the old one."""
        return self.params_changed / self.params_total if self.params_total else 0.0

    @property
    def changed(self) -> bool:
        """Whether the architecture changed at all."""
        return bool(self.added or self.rewired or self.removed)


@torch.no_grad()
def _warm_start(new: torch.nn.Module, old: torch.nn.Module) -> None:
    old_children = dict(old.named_modules())
    for name, sub in new.named_modules():
        prev = old_children.get(name)
        if isinstance(sub, BlockLinear) and isinstance(prev, BlockLinear):
            sub.warm_start_from(prev)
        elif isinstance(sub, BlockLinear):  # a layer that only exists for the new inputs
            sub.weight.zero_()
            sub.bias.zero_()
        elif prev is not None and not isinstance(sub, BlockLinear):
            for pname, p in sub.named_parameters(recurse=False):
                q = getattr(prev, pname, None)
                if q is not None and q.shape == p.shape:
                    p.copy_(q)


def adapt_model(model: ConceptModel, graph: ConceptGraph) -> tuple[ConceptModel, AdaptReport]:
    """Implements F-CMs E1 (new concept -> new module) and E2 (edge change -> rewired inputs).

    Returns a new model (the input model is left untouched) and the report.
    """
    new = ConceptModel(kind=model.kind, encoder=copy.deepcopy(model.encoder), graph=graph,
                       z_dim=model.z_dim, hp=model.hp)
    report = AdaptReport(removed=[v for v in model.graph.nodes if v not in graph.nodes])
    for v in graph.nodes:
        mod = new.module_of(v)
        if v not in model.graph.nodes:
            report.added.append(v)
            continue
        old = model.module_of(v)
        if old.interface() == mod.interface():
            mod.load_state_dict(old.state_dict())
            report.kept.append(v)
        else:
            _warm_start(mod, old)
            report.rewired.append(v)
    report.params_total, report.params_changed = count_changed(state_vectors(model), state_vectors(new))
    return new, report


def count_changed(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> tuple[int, int]:
    """``(total, changed)`` scalars of ``after`` that differ from ``before`` (absent = changed)."""
    total = changed = 0
    for name, vec in after.items():
        total += vec.size
        old = before.get(name)
        if old is None or old.shape != vec.shape:
            changed += vec.size
        else:
            changed += int(np.count_nonzero(old != vec))
    return total, changed


def fraction_changed(before: dict[str, np.ndarray], after: dict[str, np.ndarray], *,
                     prefixes: tuple[str, ...] | None = None) -> float:
    """Appendix E.3: fraction of ``after``'s parameters whose value differs from ``before``.

    ``prefixes`` restricts the count to modules whose name starts with one of them
    (e.g. ``("concept/", "head/")`` to leave the always-trained encoder out).
    """
    keep = (lambda n: True) if prefixes is None else (lambda n: n.startswith(prefixes))
    total, changed = count_changed({k: v for k, v in before.items() if keep(k)},
                                   {k: v for k, v in after.items() if keep(k)})
    return changed / total if total else 0.0
