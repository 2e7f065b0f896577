"""The strategy interface."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

import numpy as np

from ..aggregation.base import ModuleSums


class Strategy(ABC):
    """Turns aggregated module deltas into the next global state.

    Deltas follow NS-FL's sign convention: Δθ_i = θ^(t) − θ'_i (eq. 7).
    """

    name: str = ""
    #: True when client_weights() fixes weights that sum to 1 (the masked mode's weight bound is 1).
    normalised_weights: bool = False
    #: True when the next global state is linear in the summed modules, so a hospital can decode
    #: a summed statistic (the federated validation loss of model selection) from the delivered
    #: model; False for adaptive server optimisers (FedOpt, FedAdam, FedYogi).
    linear_in_sums: bool = True
    #: True when the server itself must read the sum (an M-step, a vote it decides and audits):
    #: refused under a secure mode in which the server never sees the sum (ckks).
    server_reads_sum: bool = False

    def constructor_options(self) -> dict[str, float | int | str | bool]:
        """The options this strategy was built with; they travel in the plan as ``strategy.<k>``
        so that hospitals can apply the same rule themselves when the server is blind (ckks)."""
        return {}

    def client_weights(self, *, round_: int, participants: tuple[str, ...], min_clients: int = 2) -> dict[str, float]:
        """Per-client aggregation weights fixed before upload (empty: each uses its sample count);
        ``min_clients``: the smallest round the server may close with them (the plan's)."""
        return {}

    def plan_options(self) -> dict[str, float | int | str | bool]:
        """Options the clients need (e.g. FedProx's μ), carried in the round plan."""
        return {}

    def observe(self, *, round_: int, metrics: Mapping[str, Mapping[str, float]]) -> None:  # noqa: B027 - optional hook
        """Metrics the clients reported this round (used by quality-weighted strategies)."""

    @abstractmethod
    def apply(self, state: Mapping[str, np.ndarray], sums: ModuleSums) -> dict[str, np.ndarray]:
        """The next global state; modules nobody trained are returned unchanged."""
