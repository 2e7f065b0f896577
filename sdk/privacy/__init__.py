"""Patient-level differential privacy for the NS-FL model (issue 4; docs/privacy.md).

The unit is one patient: DP-SGD (Poisson sampling, the per-patient engine of
:mod:`.per_patient`) on each patient's star, no ``similar_to``, and a persistent per-hospital ledger composing ε over every step of
every round. ``[privacy] mode = "distributed"`` (:mod:`.distributed`): one DP-SGD step a round
over all hospitals, each adding a Skellam share of the noise inside the masked sum.
"""

from clinograph.core.errors import PrivacyBudgetExceeded, PrivacyError

from .accountant import PrivacyLedger
from .calibration import calibrate_noise_multiplier, poisson_plan
from .distributed import DistributedLedger, distributed_step
from .guard import refuse_coupled_plan, refuse_coupled_training
from .noise import install_secure_noise, secure_gaussian
from .trainer import DPTrainer, dp_trainer_factory, star_loss, unused_star_parameters

__all__ = [
    "DPTrainer",
    "DistributedLedger",
    "PrivacyBudgetExceeded",
    "PrivacyError",
    "PrivacyLedger",
    "calibrate_noise_multiplier",
    "distributed_step",
    "dp_trainer_factory",
    "install_secure_noise",
    "poisson_plan",
    "refuse_coupled_plan",
    "refuse_coupled_training",
    "secure_gaussian",
    "star_loss",
    "unused_star_parameters",
]
