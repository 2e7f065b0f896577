"""FedAvg and FedSGD with a server learning rate (NS-FL eq. 6), module-wise."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from clinograph.core.errors import ConfigError

from ..aggregation.base import ModuleSums
from .base import Strategy


class FedSGD(Strategy):
    """Implements NS-FL eq. (6): θ^(t+1) = θ^(t) − η · Σ_i (n_i / n_total) Δθ_i.

    Module-wise (F-CMs 4.2.3): for each module the sum runs over the hospitals that trained
    it and n_total over those hospitals only, so a hospital without a feature neither dilutes
    nor touches its embedding. A module nobody trained stays as it was.
    """

    name = "fedsgd"

    def __init__(self, server_lr: float = 1.0):
        if not server_lr > 0:
            raise ConfigError(f"server_lr must be > 0, got {server_lr}. Set [federation] server_lr.")
        self.server_lr = float(server_lr)

    def constructor_options(self) -> dict[str, float | int | str | bool]:
        return {"server_lr": self.server_lr}

    def apply(self, state: Mapping[str, np.ndarray], sums: ModuleSums) -> dict[str, np.ndarray]:
        out = {k: np.array(v, dtype=np.float64, copy=True) for k, v in state.items()}
        for name in sums.sums:
            if sums.weights.get(name, 0.0) <= 0:
                continue
            out[name] = out[name] - self.server_lr * sums.mean(name).reshape(out[name].shape)
        return out


class FedAvg(FedSGD):
    """FedAvg (McMahan et al. 2017): the weighted mean of local models = FedSGD with η = 1."""

    name = "fedavg"

    def __init__(self) -> None:
        super().__init__(server_lr=1.0)

    def constructor_options(self) -> dict[str, float | int | str | bool]:
        return {}
