"""One hospital's distributed-DP round, whatever the task trains: the policy, the checks on the
signed plan, the ledger's record and the exact local model the client turns back into the sum.

The round around :mod:`.distributed`'s noisy integer sum (per-patient rows, clip, randomised
rounding, Skellam share: :func:`~.distributed.noised_sum`), shared by NS-FL's
:class:`~.distributed_trainer.DistributedTrainer` and the concept models'
(:mod:`clinograph.sdk.concepts.distributed_training`), NS-FL eq. 6 for both (one DP-SGD step a
round, FedSGD weights = expected batch q·n):

1. :func:`privacy_policy`: the mechanism a hospital holds itself to, from its ``[privacy]``.
2. :func:`open_round` (before anything is scored or trained): no similar_to or FedProx in the
   plan (:func:`~.guard.refuse_coupled_plan`, as local DP); :func:`plan_ring` -- the plan must
   carry the masked ring (``masked.scale``, ``masked.clip``), a threshold of at least
   ``min_honest``, no fixed weights (FedSGD), one local epoch, and allow the hospital's weight
   q·n -- then the ledger checks the round's record (the aggregate mechanism (σ, q, C, h), the
   ring scale and the dimension it accounts over: every coordinate the model spec releases, the
   server's own number) against the budget.
3. :func:`check_in_ring`: the noisy sum z stays inside the masked range.
4. :class:`ExactLocal`: the task's module map whose released modules read θ − z/(s·w) in float64
   during the round, checked to give z back through the client's w·(θ − θ_local) and the masked
   encoder's rint(x·s), so the masked sum adds exactly the hospitals' z.
5. :func:`commit_round`: the ledger commits the record; the round's outcome carries its entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from clinograph.secure.dp import DistributedPolicy

from clinograph.core.errors import ConfigError, PrivacyError

from ..model.modules import ModuleMap
from ..training.trainer import TrainOutcome
from .distributed import DistributedLedger
from .guard import refuse_coupled_plan


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
    lacks for a distributed-DP round (step 2 of the module docstring)."""
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


def open_round(ledger: DistributedLedger, policy: DistributedPolicy,
               plan_options: Mapping[str, float | int | str | bool], *, round_: int, epochs: int, weight: float,
               dim: int) -> tuple[dict[str, Any], float, float]:
    """(the :class:`~.distributed.DistributedLedger` record, ring scale s, masked.clip) of a round
    the plan allows and the budget covers (step 2), or PrivacyError / PrivacyBudgetExceeded before
    anything is scored or trained."""
    refuse_coupled_plan(plan_options, site=ledger.site)
    scale, bound = plan_ring(plan_options, site=ledger.site, policy=policy, epochs=epochs, weight=weight)
    record = {"round": round_, "mechanism": policy.mechanism, "noise_multiplier": policy.noise_multiplier,
              "noise_multiplier_alone": policy.noise_multiplier / np.sqrt(policy.min_honest),
              "sample_rate": policy.sample_rate, "clip_norm": policy.clip_norm, "scale": scale, "dim": int(dim),
              "min_honest": policy.min_honest, "share_variance": policy.share_variance(scale)}
    ledger.check_round(record)
    return record, scale, bound


def check_in_ring(z: np.ndarray, *, scale: float, bound: float, site: str) -> None:
    """PrivacyError (nothing sent) if the noisy sum z leaves the masked range (step 3)."""
    if np.abs(z).max(initial=0) / scale > bound:
        raise PrivacyError(f"Hospital {site!r}: its noisy sum leaves the masked range (masked.clip = {bound:g}); "
                           "nothing is sent this round. Raise [federation] masked_clip.")


def commit_round(ledger: DistributedLedger, record: dict[str, Any]) -> TrainOutcome:
    """The round's record committed to the ledger (step 5) and the trainer's outcome."""
    entry = ledger.commit(record)
    return TrainOutcome(loss=0.0, used_similar_to=False, ledger=entry, extras={"epsilon": entry.epsilon})


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
