"""Named modules over a torch model: the unit of sharing, aggregation and audit.

A module is a list of parameter pieces (a whole tensor or one row of it); its vector is the
concatenation of the pieces, flattened, as float64. The same mechanism serves every model
(NS-FL, concept models): they declare their pieces, the federation sees names and vectors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from clinograph.core.spec import ModelSpec, ModuleKind, ModuleSpec


@dataclass(frozen=True)
class Piece:
    """A whole parameter (``row is None``) or one row of it."""

    param: nn.Parameter
    row: int | None = None

    def tensor(self) -> torch.Tensor:
        return self.param if self.row is None else self.param[self.row]

    @property
    def numel(self) -> int:
        return self.tensor().numel()


class ModuleMap:
    """Ordered name -> (kind, pieces) over one model's parameters."""

    def __init__(self) -> None:
        self._modules: dict[str, tuple[ModuleKind, list[Piece]]] = {}

    def add(self, name: str, kind: ModuleKind, pieces: Iterable[Piece]) -> None:
        """Declare module ``name``."""
        if name in self._modules:
            raise ValueError(f"module {name!r} declared twice")
        self._modules[name] = (kind, list(pieces))

    def add_submodule(self, name: str, kind: ModuleKind, module: nn.Module) -> None:
        """Declare every parameter of ``module`` (in name order) as module ``name``."""
        self.add(name, kind, [Piece(p) for _, p in sorted(module.named_parameters())])

    def names(self, kind: ModuleKind | None = None) -> list[str]:
        """Module names in declaration order, optionally of one kind."""
        return [n for n, (k, _) in self._modules.items() if kind is None or k == kind]

    def kind(self, name: str) -> ModuleKind:
        """Shared or personal."""
        return self._modules[name][0]

    def pieces(self, name: str) -> list[Piece]:
        """The parameter pieces of module ``name`` (a copy of the list)."""
        return list(self._modules[name][1])

    def with_kinds(self, kind_of: Callable[[str, ModuleKind], ModuleKind]) -> ModuleMap:
        """A new map over the same pieces, each module's kind given by ``kind_of(name, kind)``."""
        out = ModuleMap()
        for n, (k, ps) in self._modules.items():
            out.add(n, kind_of(n, k), ps)
        return out

    def spec(self, version: int = 0) -> ModelSpec:
        """The ModelSpec the server holds (names, shapes, kinds)."""
        return ModelSpec(version=version, modules=tuple(
            ModuleSpec(name=n, shape=(sum(p.numel for p in ps),), kind=k) for n, (k, ps) in self._modules.items()))

    def get(self, name: str) -> np.ndarray:
        """Module ``name`` as a flat float64 vector (a copy)."""
        _, pieces = self._modules[name]
        with torch.no_grad():
            return torch.cat([p.tensor().detach().reshape(-1) for p in pieces]).double().numpy().copy()

    def set(self, name: str, vector: np.ndarray) -> None:
        """Write a flat vector into module ``name``'s parameters."""
        _, pieces = self._modules[name]
        vec = torch.as_tensor(np.asarray(vector, dtype=np.float64).reshape(-1))
        total = sum(p.numel for p in pieces)
        if vec.numel() != total:
            raise ValueError(f"module {name!r} has {total} values, got {vec.numel()}")
        off = 0
        with torch.no_grad():
            for p in pieces:
                t = p.tensor()
                t.copy_(vec[off:off + t.numel()].reshape(t.shape).to(t.dtype))
                off += t.numel()

    def state(self, kind: ModuleKind | None = ModuleKind.SHARED) -> dict[str, np.ndarray]:
        """name -> vector for every module of ``kind`` (None: all)."""
        return {n: self.get(n) for n in self.names(kind)}

    def load(self, state: Mapping[str, np.ndarray]) -> None:
        """Write every module in ``state``."""
        for n, v in state.items():
            self.set(n, v)

    def grad_norm(self, name: str) -> float:
        """L2 norm of module ``name``'s current gradient (0 if none)."""
        _, pieces = self._modules[name]
        total = 0.0
        for p in pieces:
            g = p.param.grad
            if g is not None:
                gg = g if p.row is None else g[p.row]
                total += float((gg.double() ** 2).sum())
        return total ** 0.5
