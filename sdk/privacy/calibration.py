"""The noise multiplier σ from a target (ε, δ) over the planned rounds.

The plan is ``planned_rounds × epochs × ⌈n/B⌉`` Poisson-subsampled Gaussian steps at
q = 1/⌈n/B⌉ (what Opacus's ``DPDataLoader`` does with a batch size B). Opacus's
``get_noise_multiplier`` bisects σ until the accountant's ε over those steps is within
``epsilon_tolerance`` below the target. The calibration uses only public quantities (n, B,
the plan), so it releases nothing.
"""

from __future__ import annotations

import math

from clinograph.core.errors import PrivacyError


def poisson_plan(*, n_train: int, batch_size: int) -> tuple[float, int]:
    """(sample rate q, steps per epoch) for ``n_train`` patients and expected batch size B."""
    if n_train <= 0:
        raise PrivacyError("DP training needs at least one training patient at this hospital.")
    steps = max(math.ceil(n_train / batch_size), 1)
    return 1.0 / steps, steps


def calibrate_noise_multiplier(*, target_epsilon: float, delta: float, sample_rate: float, steps: int,
                               accountant: str = "rdp") -> float:
    """σ such that ``steps`` steps at rate ``sample_rate`` give ε ≤ ``target_epsilon`` at ``delta``.

    Raises:
        PrivacyError: the target cannot be met (Opacus gives up below its σ search range).
    """
    from .opacus_import import import_opacus

    import_opacus()  # Opacus's import-time logging.basicConfig: not on the host's root logger
    from opacus.accountants.utils import get_noise_multiplier

    try:
        return float(get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta, sample_rate=sample_rate,
                                          steps=steps, accountant=accountant, epsilon_tolerance=0.01))
    except ValueError as exc:
        raise PrivacyError(f"Cannot calibrate σ for ε = {target_epsilon:g}, δ = {delta:g} over {steps} steps "
                           f"at q = {sample_rate:.4g}: {exc}. Fix: raise the target ε or plan fewer rounds.") from None


def distributed_noise_multiplier(config, *, dim: int, n_hospitals: int, target_epsilon: float,  # noqa: ANN001
                                 rounds: int | None = None) -> float:
    """σ of the aggregate Skellam mechanism (over the honest set) whose ``rounds`` (default
    ``[federation] rounds``; with private selection, :func:`clinograph.sdk.federation.candidates.distributed_rounds`)
    rounds give ε ≤ ``target_epsilon`` at ``[privacy] delta`` (:mod:`clinograph.secure.dp`).

    ``config`` is a :class:`~clinograph.sdk.config.SimulationConfig` in distributed mode (its σ is
    ignored). Calibrated exactly as the server checks it (``build_server``): the masked ring's
    scale for ``n_hospitals``; ``dim`` should be what build_server uses, the size of every shared
    module of the spec (``sum(m.size for m in initial.spec.shared)``; the hospitals release
    fewer, so their ledgers read the same ε or less). Only public quantities.

    Raises:
        PrivacyError: the target cannot be met.
    """
    from clinograph.secure.dp import calibrate_noise_multiplier as skellam_sigma
    from clinograph.secure.runtime.build import build_strategy, masked_options, weight_bound

    fed, priv = config.federation, config.privacy
    if priv.sample_rate is None:
        raise PrivacyError("Distributed DP needs [privacy] sample_rate to calibrate σ.")
    opts = masked_options(fed, n=n_hospitals, max_weight=weight_bound(build_strategy(fed), fed))
    try:
        return skellam_sigma(target_epsilon=target_epsilon, delta=priv.delta, rounds=rounds or fed.rounds,
                             sample_rate=priv.sample_rate, clip=priv.clip_norm, scale=float(opts["masked.scale"]),
                             dim=dim)
    except ValueError as exc:
        raise PrivacyError(f"Cannot calibrate the distributed σ for ε = {target_epsilon:g}: {exc}. Fix: raise the "
                           "target ε or plan fewer rounds.") from None

