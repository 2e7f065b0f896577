"""Shared builders for the masked-mode tests (plans, identities, realistic updates)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from clinograph.secure.aggregation import LocalUpdate
from clinograph.secure.masking import masked_plan_options
from clinograph.secure.messages import RoundPlan

from clinograph.core.identity import Identity
from clinograph.core.spec import ModelSpec, ModuleKind, ModuleSpec

SPEC = ModelSpec(version=3, modules=(
    ModuleSpec(name="feature_embedding/heart_rate", shape=(16,), kind=ModuleKind.SHARED),
    ModuleSpec(name="gnn/layer1/has_feature", shape=(16, 8), kind=ModuleKind.SHARED),
    ModuleSpec(name="concept/dysp", shape=(5,), kind=ModuleKind.SHARED),
    ModuleSpec(name="head/task", shape=(8,), kind=ModuleKind.PERSONAL),
))


@lru_cache(maxsize=None)
def identity(name: str) -> Identity:
    """One cached identity per name (key generation is the slow part of small tests)."""
    return Identity.generate(name)


def names(n: int) -> list[str]:
    return [f"hosp{i:02d}" for i in range(n)]


def make_plan(n: int, *, threshold: int, clip: float = 1.0, spec: ModelSpec = SPEC, round_: int = 7,
              min_clients: int = 2, mode: str = "masked", **kw) -> RoundPlan:
    opts = masked_plan_options(n_clients=n, threshold=threshold, clip=clip, **kw) if mode == "masked" else {}
    return RoundPlan(federation_id="fed-test", round=round_, participants=tuple(names(n)), spec=spec,
                     dictionary_hash="d" * 64, secure_mode=mode, strategy="fedavg", min_clients=min_clients,
                     local_epochs=1, global_state_digest="0" * 64, options=opts)


def make_updates(plan: RoundPlan, *, seed: int = 0, scale: float = 0.05) -> dict[str, LocalUpdate]:
    """Realistic weighted deltas: small Gaussian values, weights in (0, 1], uneven module coverage."""
    rng = np.random.default_rng(seed)
    shared = plan.spec.shared
    out = {}
    for i, c in enumerate(plan.participants):
        w = float(rng.uniform(0.2, 1.0))
        trained = [m for j, m in enumerate(shared) if j == 0 or (i + j) % 3 != 0]
        mods = {m.name: w * rng.normal(0.0, scale, m.size) for m in trained}
        out[c] = LocalUpdate(modules=mods, weight=w)
    return out


def identities(plan: RoundPlan) -> dict[str, Identity]:
    return {c: identity(c) for c in plan.participants}


def expected_sums(updates: dict[str, LocalUpdate], who) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for c in who:
        for name, v in updates[c].modules.items():
            out[name] = out.get(name, 0) + np.asarray(v, dtype=np.float64)
    return out


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))
