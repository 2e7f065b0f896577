"""One hospital's distributed-DP round, whatever the task trains: the checks on the signed plan, the
ledger's record, the noised integer sum and the exact local model the client turns back into it.

The pieces of :mod:`.distributed` (per-patient rows, clip, randomised rounding, Skellam share, the
ledger) put together for a task whose model is not the NS-FL star model -- concept models
(:mod:`clinograph.sdk.concepts.distributed_training`) -- with the same rules as NS-FL's
distributed task (NS-FL eq. 6: one DP-SGD step a round, FedSGD weights = expected batch q·n):

1. :func:`plan_ring`: the plan must carry the masked ring (``masked.scale``, ``masked.clip``), a
   threshold of at least ``min_honest``, no fixed weights (FedSGD), one local epoch, and allow the
   hospital's weight q·n.
2. :func:`round_record`: what the ledger checks before training and commits after it -- the
   aggregate mechanism (σ, q, C, h), the ring scale and the dimension it accounts over (every
   coordinate the model spec releases: the server's own number).
3. :func:`noised_sum`: Σ_p round(s·ḡ_p) + Sk(μ/h) on every coordinate of the rows given (zeros
   included: a module the hospital does not train still gets its share), the share declared and
   checked against the policy.
4. :class:`ExactLocal`: the task's module map whose released modules read θ − z/(s·w) in float64
   during the round, checked to give z back through the client's w·(θ − θ_local) and the masked
   encoder's rint(x·s), so the masked sum adds exactly the hospitals' z.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from clinograph.secure.dp import CsprngUniform, DistributedPolicy, ShareDeclaration, check_share

from clinograph.core.errors import ConfigError, PrivacyError

from ..model.modules import ModuleMap
from .distributed import DPStep, noisy_integer_sum


def privacy_policy(privacy: Any) -> DistributedPolicy:
    """The distributed-DP policy a hospital holds itself to, from its ``[privacy]`` section
    (:class:`clinograph.sdk.config.PrivacySection`): the server checks every round that its share
    matches the federation's ``[dp_policy]``.

    Raises:
        ConfigError: a value the mechanism needs is missing (names them).
    """
    missing = [k for k in ("noise_multiplier", "sample_rate", "min_honest", "planned_rounds")
               if getattr(privacy, k) is None]
    if missing:
        raise ConfigError(f"[privacy] mode = 'distributed' needs {missing} (copy the federation's [dp_policy]).")
    return DistributedPolicy(mechanism=privacy.mechanism, noise_multiplier=float(privacy.noise_multiplier),
                             clip_norm=float(privacy.clip_norm), sample_rate=float(privacy.sample_rate),
                             min_honest=int(privacy.min_honest), rounds=int(privacy.planned_rounds),
                             max_epsilon=float(privacy.epsilon_budget), delta=float(privacy.delta))


def plan_ring(plan_options: Mapping[str, float | int | str | bool], *, site: str, policy: DistributedPolicy,
              epochs: int, weight: float) -> tuple[float, float]:
    """(ring scale s, masked.clip) of a round's signed plan, or PrivacyError naming what the plan
    lacks for a distributed-DP round (step 1 of the module docstring)."""
    if epochs != 1:
        raise PrivacyError(f"Hospital {site!r}: a distributed-DP round is one DP-SGD step (NS-FL eq. 6); the "
                           f"plan asks for {epochs} local epochs. Set [federation] local_epochs = 1.")
    if "masked.scale" not in plan_options:
        raise PrivacyError(f"Hospital {site!r}: distributed DP needs secure_mode = 'masked' (the noise shares "
                           "add up only inside the masked sum).")
    if f"weight/{site}" in plan_options:
        raise PrivacyError(f"Hospital {site!r}: the strategy fixes weights; distributed DP needs FedSGD's "
                           "weights = expected batch. Use strategy = 'fedsgd'.")
    threshold = int(plan_options["masked.threshold"])  # type: ignore[arg-type]
    if threshold < policy.min_honest:
        raise PrivacyError(f"Hospital {site!r}: the round's masked threshold {threshold} is below min_honest "
                           f"{policy.min_honest}; it could release a sum with too few noise shares.")
    if weight > float(plan_options.get("weight.max", np.inf)):  # type: ignore[arg-type]
        raise PrivacyError(f"Hospital {site!r}: expected batch {weight:g} exceeds the plan's weight.max.")
    return float(plan_options["masked.scale"]), float(plan_options["masked.clip"])  # type: ignore[arg-type]


def round_record(policy: DistributedPolicy, *, round_: int, scale: float, dim: int) -> dict[str, Any]:
    """The :class:`~.distributed.DistributedLedger` record of one round (step 2)."""
    return {"round": round_, "mechanism": policy.mechanism, "noise_multiplier": policy.noise_multiplier,
            "noise_multiplier_alone": policy.noise_multiplier / np.sqrt(policy.min_honest),
            "sample_rate": policy.sample_rate, "clip_norm": policy.clip_norm, "scale": scale, "dim": int(dim),
            "min_honest": policy.min_honest, "share_variance": policy.share_variance(scale)}


def noised_sum(clipped: np.ndarray, *, policy: DistributedPolicy, scale: float, batch: int,
               source: CsprngUniform | None = None) -> DPStep:
    """Step 3 over ``clipped`` ([B, d] rows, each of L2 norm at most C: one patient, one row;
    B may be 0), the share declared and checked (PrivacyError on a row past C or a share off the
    policy). ``batch``: the training patients among the rows (local only)."""
    rows = np.asarray(clipped, dtype=np.float64)
    if rows.size and float(np.linalg.norm(rows, axis=1).max()) > policy.clip_norm * (1 + 1e-9):
        raise PrivacyError("A row of the distributed step exceeds the clip norm C; its patient's contribution "
                           "would be unbounded. Nothing is sent.")
    share = policy.share_variance(scale)
    z, _ = noisy_integer_sum(rows, scale=scale, share_variance=share, source=source)
    decl = ShareDeclaration(mechanism=policy.mechanism, noise_multiplier=policy.noise_multiplier,
                            min_honest=policy.min_honest, clip_norm=policy.clip_norm, sample_rate=policy.sample_rate,
                            scale=scale, share_variance=share)
    check_share(policy, decl)
    return DPStep(z=z, batch=int(batch), declaration=decl)


class ExactLocal(ModuleMap):
    """A task's module map whose released modules read as the exact float64 local model
    θ − z/(s·w) during a round (step 4; a float32 torch copy would not give z back in the ring).
    ``load`` (the client's global model) clears the round and keeps the float64 global."""

    def __init__(self, base: ModuleMap):
        super().__init__()
        self._modules = base._modules
        self.pending: dict[str, np.ndarray] = {}
        self.global64: dict[str, np.ndarray] = {}

    def get(self, name: str) -> np.ndarray:
        return self.pending[name].copy() if name in self.pending else super().get(name)

    def load(self, state: Mapping[str, np.ndarray]) -> None:
        self.pending = {}
        self.global64 = {n: np.asarray(v, dtype=np.float64).copy() for n, v in state.items()}
        super().load(state)

    def set_local(self, parts: Mapping[str, np.ndarray], *, scale: float, weight: float) -> None:
        """θ_local = θ − z/(s·w) for every module of ``parts`` (module -> its slice of z), or
        PrivacyError (nothing sent) if ``rint(s·w·(θ − θ_local))`` would not give z back."""
        pending = {}
        for name, zm in parts.items():
            glob = self.global64[name] if name in self.global64 else super().get(name)
            z = np.asarray(zm, dtype=np.float64)
            local = glob - z / (scale * weight)
            if not np.array_equal(np.rint((weight * (glob - local)) * scale), z):
                raise PrivacyError("The noisy sum does not survive the fixed-point encoding exactly (global model "
                                   "values too large for the ring scale); nothing is sent this round.")
            pending[name] = local
        self.pending = pending

    def clear(self) -> None:
        """The round is over: the modules read as the model's parameters again."""
        self.pending = {}
