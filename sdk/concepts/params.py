"""Modules of a ConceptModel under the house convention, as flat float64 vectors.

Names: the encoder's groups (``encoder/mlp``, or the wrapped module's own names),
``concept/<name>`` for every concept module, ``head/task`` for the task decoder. All are
``shared`` (aggregated module-wise over their contributors, F-CMs 4.2.3).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
import torch
from torch import nn

from clinograph.core.errors import ConfigError
from clinograph.core.spec import ModelSpec, ModuleKind, ModuleSpec

from .model import ConceptModel

TASK_MODULE = "head/task"


def node_module_name(model: ConceptModel, node: str) -> str:
    """``head/task`` for the task node, ``concept/<node>`` otherwise."""
    return TASK_MODULE if node == model.graph.task else f"concept/{node}"


def module_parameters(model: ConceptModel) -> dict[str, list[nn.Parameter]]:
    """Every module name -> its parameters, in a stable order (encoder first, then nodes)."""
    enc = model.encoder
    groups = getattr(enc, "clinograph_modules", None)
    out: dict[str, list[nn.Parameter]] = dict(groups()) if callable(groups) else {"encoder/main": list(enc.parameters())}
    for v in model.graph.nodes:
        out[node_module_name(model, v)] = list(model.module_of(v).parameters())
    return out


def list_modules(model: ConceptModel) -> list[tuple[str, tuple[int]]]:
    """``(name, (size,))`` for every module, in order."""
    return [(n, (sum(p.numel() for p in ps),)) for n, ps in module_parameters(model).items()]


def model_spec(model: ConceptModel, *, version: int, extra: Sequence[ModuleSpec] = ()) -> ModelSpec:
    """The :class:`ModelSpec` of the model (all modules shared), plus e.g. the DAG-vote module."""
    mods = tuple(ModuleSpec(name=n, shape=s, kind=ModuleKind.SHARED) for n, s in list_modules(model))
    return ModelSpec(version=version, modules=mods + tuple(extra))


def _params(model: ConceptModel, name: str) -> list[nn.Parameter]:
    groups = module_parameters(model)
    if name not in groups:
        raise ConfigError(f"Module {name!r} is not in this concept model (has: {', '.join(groups)}).")
    return groups[name]


def _flat(ps: list[nn.Parameter]) -> np.ndarray:
    return np.concatenate([p.detach().cpu().double().numpy().ravel() for p in ps]) if ps else np.zeros(0)


def get_module_vector(model: ConceptModel, name: str) -> np.ndarray:
    """The module's parameters concatenated into one float64 vector."""
    return _flat(_params(model, name))


@torch.no_grad()
def set_module_vector(model: ConceptModel, name: str, vec: np.ndarray) -> None:
    """Load a flat vector (as from :func:`get_module_vector`) into the module's parameters."""
    _load(_params(model, name), name, vec)


@torch.no_grad()
def _load(ps: list[nn.Parameter], name: str, vec: np.ndarray) -> None:
    v = np.asarray(vec, dtype=np.float64).ravel()
    total = sum(p.numel() for p in ps)
    if v.size != total:
        raise ConfigError(f"Module {name!r} has {total} parameters; got a vector of {v.size}.")
    at = 0
    for p in ps:
        p.copy_(torch.from_numpy(v[at:at + p.numel()]).view_as(p).to(p.dtype))
        at += p.numel()


def state_vectors(model: ConceptModel) -> dict[str, np.ndarray]:
    """All modules as vectors (a snapshot for deltas and the E.3 fraction-changed report)."""
    return {n: _flat(ps) for n, ps in module_parameters(model).items()}


def load_state_vectors(model: ConceptModel, vectors: dict[str, np.ndarray]) -> None:
    """Set every module named in ``vectors`` (one pass over the model)."""
    groups = module_parameters(model)
    for name, vec in vectors.items():
        if name not in groups:
            raise ConfigError(f"Module {name!r} is not in this concept model (has: {', '.join(groups)}).")
        _load(groups[name], name, vec)


def trainable_modules(model: ConceptModel, *, supervised: Collection[str], has_task: bool) -> list[str]:
    """Modules a hospital trains (4.2.3): the encoder, its supervised concepts, the task if labelled."""
    names = [n for n in module_parameters(model) if not (n.startswith("concept/") or n == TASK_MODULE)]
    names += [f"concept/{c}" for c in model.graph.concepts if c in supervised]
    if has_task and model.graph.has_task:
        names.append(TASK_MODULE)
    return names


def freeze_unsupervised(model: ConceptModel, *, supervised: Collection[str], has_task: bool) -> list[str]:
    """FreezeUnsup (Algorithm 1): ``requires_grad=False`` on every module without local
    supervision, so it gets no gradient (appendix D.3). Returns the trainable module names."""
    keep = set(trainable_modules(model, supervised=supervised, has_task=has_task))
    for name, ps in module_parameters(model).items():
        for p in ps:
            p.requires_grad_(name in keep)
    return [n for n in module_parameters(model) if n in keep]
