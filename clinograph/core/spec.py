"""ModelSpec: the model as the server sees it -- an ordered list of named modules.

A *module* is the unit of sharing, encryption, aggregation and audit (architecture.md,
"Module"). The server library is model-agnostic: it knows module names, shapes and kinds,
never the layers behind them. ``shared`` modules are aggregated; ``personal`` modules never
leave the hospital (NS-FL feature masks, fine-tuned heads).
"""

from __future__ import annotations

import hashlib
import json
from enum import Enum
from functools import lru_cache
from math import prod

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MODULE_NAME_PATTERN = r"^[a-z][a-z0-9_]*(/[A-Za-z0-9_.=+\-]+)*$"


class ModuleKind(str, Enum):
    """Whether a module is aggregated (``shared``) or stays at the hospital (``personal``)."""

    SHARED = "shared"
    PERSONAL = "personal"


class ModuleSpec(BaseModel):
    """One named slice of the model's parameters."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    name: str = Field(pattern=MODULE_NAME_PATTERN, max_length=200)
    shape: tuple[int, ...]
    kind: ModuleKind

    @field_validator("shape")
    @classmethod
    def _positive(cls, shape: tuple[int, ...]) -> tuple[int, ...]:
        if any(d <= 0 for d in shape):
            raise ValueError(f"every dimension must be positive, got {shape}")
        return shape

    @property
    def size(self) -> int:
        """Number of scalars in the module."""
        return prod(self.shape) if self.shape else 1


class ModelSpec(BaseModel):
    """The ordered module list at a version; it grows when the federation learns new concepts
    (F-CMs E1/E2), and its hash travels in every round plan."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    version: int = Field(ge=0)
    modules: tuple[ModuleSpec, ...]

    @model_validator(mode="after")
    def _unique(self) -> ModelSpec:
        names = [m.name for m in self.modules]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"module names must be unique; repeated: {dupes}")
        return self

    def module(self, name: str) -> ModuleSpec:
        """Look up a module by name; the error lists near names."""
        for m in self.modules:
            if m.name == name:
                return m
        from difflib import get_close_matches

        near = get_close_matches(name, [m.name for m in self.modules], n=3)
        raise KeyError(f"Module {name!r} is not in ModelSpec v{self.version} (nearest: {near}).")

    def names(self, kind: ModuleKind | None = None) -> list[str]:
        """Module names in order, optionally only of one kind."""
        return [m.name for m in self.modules if kind is None or m.kind == kind]

    @property
    def shared(self) -> list[ModuleSpec]:
        """The modules that are aggregated."""
        return [m for m in self.modules if m.kind == ModuleKind.SHARED]

    def digest(self) -> str:
        """SHA-256 over the canonical JSON of the spec (hex); memoised per equal spec (frozen)."""
        return _digest(self)


@lru_cache(maxsize=256)
def _digest(spec: ModelSpec) -> str:
    """Every message of a round checks the spec digest; a frozen spec hashes by value, so equal
    specs share one entry and a changed spec is a different key."""
    body = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()
