"""Distributed differential privacy over the masked mode: the Skellam accountant and the policy
checks (docs/privacy.md, "Distributed DP"; SECURITY.md). Torch-free: the server runs them too."""

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
