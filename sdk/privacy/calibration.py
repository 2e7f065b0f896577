"""The noise multiplier σ from a target (ε, δ) over the planned rounds.

The plan is ``planned_rounds × epochs × ⌈n/B⌉`` Poisson-subsampled Gaussian steps at
q = 1/⌈n/B⌉ (what Opacus's ``DPDataLoader`` does with a batch size B). Opacus's
``get_noise_multiplier`` bisects σ until the accountant's ε over those steps is within
``epsilon_tolerance`` below the target. The calibration uses only public quantities (n, B,
the plan), so it releases nothing.
"""

from __future__ import annotations

import math

from clinograph.secure.errors import PrivacyError


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
    from opacus.accountants.utils import get_noise_multiplier

    try:
        return float(get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta, sample_rate=sample_rate,
                                          steps=steps, accountant=accountant, epsilon_tolerance=0.01))
    except ValueError as exc:
        raise PrivacyError(f"Cannot calibrate σ for ε = {target_epsilon:g}, δ = {delta:g} over {steps} steps "
                           f"at q = {sample_rate:.4g}: {exc}. Fix: raise the target ε or plan fewer rounds.") from None
