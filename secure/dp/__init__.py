"""Distributed differential privacy over the masked mode: the Skellam accountant and the policy
checks (docs/privacy.md, "Distributed DP"; SECURITY.md). Torch-free: the server runs them too.

Also the SDK's one door to the noise primitives of :mod:`clinograph.secure.hazmat`: the CSPRNG
and the exact discrete samplers a hospital draws its DP noise with, and the masked ring's
wrap-free test its noisy shares must pass (the SDK imports no ``hazmat`` module itself: the
``sdk-secure-face`` import contract).
"""

from ..hazmat.discrete_noise import CsprngUniform, RoundedRowSums, bernoulli
from ..hazmat.discrete_noise import skellam as skellam_noise
from ..hazmat.fixedpoint import wrap_free
from .policy import (
    MECHANISMS,
    DistributedPolicy,
    ShareDeclaration,
    check_configuration,
    check_share,
    ring_headroom,
    share_problems,
)
from .skellam import (
    ORDERS,
    SkellamRound,
    calibrate_noise_multiplier,
    epsilon,
    gaussian_rdp,
    rdp_to_epsilon,
    sensitivities,
    skellam_rdp,
    subsampled_rdp,
)

__all__ = [
    "CsprngUniform",
    "RoundedRowSums",
    "bernoulli",
    "skellam_noise",
    "wrap_free",
    "MECHANISMS",
    "ORDERS",
    "DistributedPolicy",
    "ShareDeclaration",
    "SkellamRound",
    "calibrate_noise_multiplier",
    "check_configuration",
    "check_share",
    "epsilon",
    "gaussian_rdp",
    "rdp_to_epsilon",
    "ring_headroom",
    "sensitivities",
    "share_problems",
    "skellam_rdp",
    "subsampled_rdp",
]
