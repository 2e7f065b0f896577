"""Distributed DP's DP-SGD schedule presets: rounds, server learning rate, clip C and q.

Implements NS-FL eq. (6) (FedSGD with a server learning rate) as full-batch DP-SGD
(``[privacy] mode = "distributed"``, :mod:`.distributed`): θ ← θ − η · (Σ clip_C(g_p) + noise) / n
for ``rounds`` rounds. The presets were chosen on VALIDATION AUROC only (mean over three seeds
of the demo federation, never a test split) by ``research/dp_trust_models/dp_trust_models.py`` at each target
ε (docs/privacy.md, "Three trust models, measured"); the σ that goes with a preset is
calibrated to the target ε over its rounds (:func:`.calibration.distributed_noise_multiplier`),
so a preset never changes what ε a run spends, only how the budget is used.

Why these shapes: at the demo's sizes (about 2,800 training patients) the schedule, not the
noise, limited the first pass (15 rounds, C = 1 scored the same at ε = 1, 3 and 10); the noise
on the mean gradient, σ·C/n per coordinate, stays small enough for 60 full-batch rounds at
ε = 3 and 30 at ε = 1. A clip C = 3 (about half the initial model's median per-patient gradient
norm, 6.6) keeps more of each patient's gradient than C = 1 at the same clip-relative step
η·C = 3. Server momentum (β 0.5, 0.9) and server Adam on the noisy aggregate (free in ε:
post-processing) scored lower on validation than plain FedSGD at 15 rounds and are not used
(``research/dp_trust_models/results/dp_trust_models_selection_eps3.json``, ``server_optimizers``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clinograph.core.errors import ConfigError


@dataclass(frozen=True)
class DistributedSchedule:
    """One distributed-DP schedule: ``rounds`` full-batch DP-SGD rounds (``sample_rate`` q = 1:
    no subsampling bound needed, the Skellam accountant equals the Gaussian's), the server's
    FedSGD learning rate η and the per-patient clip norm C."""

    rounds: int
    server_lr: float
    clip_norm: float
    sample_rate: float = 1.0


#: the schedule chosen on validation at each target ε (research/dp_trust_models/results/dp_trust_models.json,
#: ``hyperparameters``; a test pins the two together). Rounds were capped at 60 for cost: 100
#: full-batch rounds scored higher still on validation at ε = 3, with and without DP.
DISTRIBUTED_SCHEDULES: dict[float, DistributedSchedule] = {
    1.0: DistributedSchedule(rounds=30, server_lr=1.0, clip_norm=3.0),
    3.0: DistributedSchedule(rounds=60, server_lr=1.0, clip_norm=3.0),
}


#: the schedule of the SDK's DP default model (the wide path alone, ``[model] deep = false``:
#: ``clinograph.sdk.config.dp_default_model``) at every ε: the schedule of the grid entry chosen on
#: VALIDATION AUROC at ε = 3 on five real tables (research/private_selection/validation_choice.py,
#: results/validation_choice.json; a test pins the two together). σ is calibrated to the target ε
#: over its rounds, so one schedule serves every ε.
WIDE_DISTRIBUTED_SCHEDULE = DistributedSchedule(rounds=25, server_lr=1.0, clip_norm=1.0)


def distributed_schedule(epsilon: float, *, deep: bool = True) -> DistributedSchedule:
    """The preset for a target ε: with ``deep = False`` (the wide path alone, the SDK's DP default
    model) :data:`WIDE_DISTRIBUTED_SCHEDULE`; with the GNN the one chosen at the largest listed ε
    not above ``epsilon`` (a smaller budget means more noise, which favours the more cautious
    schedule); below the smallest listed ε, that one's (σ is calibrated to the target anyway: the
    ε spent is right, only the utility is unmeasured there).

    Raises:
        ConfigError: ``epsilon`` is not a finite positive number.
    """
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ConfigError(f"A distributed-DP schedule needs a finite target ε > 0, got {epsilon!r}. "
                          "Set [privacy] epsilon_budget.")
    if not deep:
        return WIDE_DISTRIBUTED_SCHEDULE
    fits = [e for e in DISTRIBUTED_SCHEDULES if e <= epsilon] or [min(DISTRIBUTED_SCHEDULES)]
    return DISTRIBUTED_SCHEDULES[max(fits)]
