"""FedProx (Li et al. 2020): FedAvg on the server, a μ-proximal term in every local objective."""

from __future__ import annotations

from clinograph.core.errors import ConfigError

from .fedavg import FedAvg

DEFAULT_MU = 0.01


class FedProx(FedAvg):
    """Implements FedProx: each hospital minimises F_k(θ) + (μ/2)·||θ − θ^(t)||² locally.

    The server side is FedAvg (module-wise weighted mean of the deltas); μ reaches the
    hospitals in the signed round plan as ``options["fedprox.mu"]``, where the SDK's trainer
    adds the proximal term (``clinograph.sdk.training.local.train_epochs(proximal=...)``).
    μ = 0 is FedAvg. Default μ = 0.01 (one of the values Li et al. 2020 sweep; the PFGL-Net
    paper gives none).
    """

    name = "fedprox"

    def __init__(self, mu: float = DEFAULT_MU) -> None:
        super().__init__()
        mu = float(mu)
        if not mu >= 0:
            raise ConfigError(f"FedProx mu must be >= 0, got {mu}. Set [federation] strategy_options = {{mu = 0.01}}.")
        self.mu = mu

    def plan_options(self) -> dict[str, float | int | str | bool]:
        return {"fedprox.mu": self.mu}

    def constructor_options(self) -> dict[str, float | int | str | bool]:
        return {"mu": self.mu}
