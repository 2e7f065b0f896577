"""FedOpt (Reddi et al. 2020, "Adaptive Federated Optimization", Algorithm 2): FedAdam and
FedYogi, a server-side adaptive optimizer on the aggregated delta, module-wise.

In ``ckks`` mode every hospital applies the strategy to the decrypted sums itself, so the
update is a deterministic function of (state, sums, the strategy's own moments): no
randomness, float64 throughout, modules in sorted order.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from clinograph.core.errors import ConfigError

from ..aggregation.base import ModuleSums
from .base import Strategy


class FedOpt(Strategy):
    """Implements Reddi et al. 2020, Algorithm 2 (no bias correction, as in the paper).

    With the NS-FL sign convention Δθ_i = θ^(t) − θ'_i, the paper's pseudo-gradient is
    Δ_t = −mean_i Δθ_i (module-wise, over each module's contributors), and per module::

        m_t = β1 m_{t−1} + (1 − β1) Δ_t
        v_t = β2 v_{t−1} + (1 − β2) Δ_t²                         (FedAdam)
        v_t = v_{t−1} − (1 − β2) Δ_t² sign(v_{t−1} − Δ_t²)        (FedYogi)
        θ^(t+1) = θ^(t) + η m_t / (√v_t + τ)

    m starts at 0 and v at τ² (the paper's v_{−1} ≥ τ²). A module nobody trained this round
    keeps its value and its moments. Defaults: η = 0.01, β1 = 0.9, β2 = 0.99, τ = 1e-3 (the
    values Reddi et al. report using for β1, β2 and τ; η is tuned per task there).
    """

    linear_in_sums = False

    name = "fedopt"
    variant = "adam"

    def __init__(self, server_lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3):
        problems = []
        if not server_lr > 0:
            problems.append(f"server_lr must be > 0, got {server_lr}")
        if not 0 <= beta1 < 1:
            problems.append(f"beta1 must be in [0, 1), got {beta1}")
        if not 0 <= beta2 < 1:
            problems.append(f"beta2 must be in [0, 1), got {beta2}")
        if not tau > 0:
            problems.append(f"tau must be > 0, got {tau}")
        if problems:
            raise ConfigError(f"{type(self).__name__}: " + "; ".join(problems) + ". Fix [federation] strategy_options.")
        self.server_lr, self.beta1, self.beta2, self.tau = float(server_lr), float(beta1), float(beta2), float(tau)
        self.m: dict[str, np.ndarray] = {}
        self.v: dict[str, np.ndarray] = {}

    def constructor_options(self) -> dict[str, float | int | str | bool]:
        return {"server_lr": self.server_lr, "beta1": self.beta1, "beta2": self.beta2, "tau": self.tau}

    def _second_moment(self, v: np.ndarray, g2: np.ndarray) -> np.ndarray:
        return self.beta2 * v + (1.0 - self.beta2) * g2

    def apply(self, state: Mapping[str, np.ndarray], sums: ModuleSums) -> dict[str, np.ndarray]:
        out = {k: np.array(v, dtype=np.float64, copy=True) for k, v in state.items()}
        for name in sorted(sums.sums):
            if sums.weights.get(name, 0.0) <= 0:
                continue
            shape = out[name].shape
            g = -np.asarray(sums.mean(name), dtype=np.float64).reshape(shape)  # Reddi's Δ_t
            m = self.m.get(name, np.zeros(shape))
            v = self.v.get(name, np.full(shape, self.tau ** 2))
            m = self.beta1 * m + (1.0 - self.beta1) * g
            v = self._second_moment(v, g * g)
            self.m[name], self.v[name] = m, v
            out[name] = out[name] + self.server_lr * m / (np.sqrt(v) + self.tau)
        return out


class FedAdam(FedOpt):
    """FedOpt with the Adam second moment (Reddi et al. 2020)."""

    name = "fedadam"
    variant = "adam"


class FedYogi(FedOpt):
    """FedOpt with the Yogi second moment (Zaheer et al. 2018; Reddi et al. 2020)."""

    name = "fedyogi"
    variant = "yogi"

    def _second_moment(self, v: np.ndarray, g2: np.ndarray) -> np.ndarray:
        return v - (1.0 - self.beta2) * g2 * np.sign(v - g2)
