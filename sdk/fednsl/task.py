"""FedNSL at one hospital as a runtime task: posteriors travel as a summed module.

Implements :class:`~clinograph.sdk.federation.task.Task`, so the one
:class:`~clinograph.sdk.federation.client.HospitalClient` runs it under the round's secure
mode. Its module map holds the three rule modules of
:mod:`clinograph.secure.strategies.rules` (float64, never touched by an optimiser):

- ``rules/prior`` -- read only: the generator's prior from the signed global model;
- ``rules/posterior`` -- each round the task sets its local value to ``global − p_i`` with
  ``p_i`` its posterior (eq. 10), so the client's ``w_i · (global − local)`` is exactly
  ``w_i · p_i``: the masked mode sums these and the server learns only the mixture;
- ``rules/support`` -- the same trick for the pooled support statistics of the rules artefact.

Everything else -- the graph, the labels, the rule weights ``w_i``, the personalised predictor
-- stays here (:class:`~.client.HospitalRules`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from clinograph.secure.strategies.rules import POSTERIOR_MODULE, PRIOR_MODULE, SUPPORT_MODULE
from torch import nn

from clinograph.core.errors import ConfigError
from clinograph.core.spec import ModuleKind

from ..federation.task import TaskBase
from ..model.modules import ModuleMap, Piece
from ..training.trainer import TrainOutcome
from .client import HospitalRules


class RulesTask(TaskBase):
    """A hospital's FedNSL task (see the module docstring).

    Args:
        rules: the hospital's graph, labels and split.
        prior: the federation's initial prior (n_heads, n_bodies), identical at every hospital.
        test: row indices :meth:`evaluate` uses.
    """

    name = "fednsl"

    def __init__(self, *, rules: HospitalRules, prior: np.ndarray, test: np.ndarray, seed: int = 0):
        self.rules, self.test, self.seed = rules, np.asarray(test), int(seed)
        space = rules.space
        self._prior = nn.Parameter(torch.as_tensor(np.asarray(prior, dtype=np.float64).ravel().copy()),
                                   requires_grad=False)
        if self._prior.numel() != space.size:
            raise ConfigError(f"The prior has {self._prior.numel()} entries; the rule space needs {space.size} "
                              f"({len(space.heads)} heads × {space.n_bodies} bodies).")
        self._posterior = nn.Parameter(torch.zeros(space.size, dtype=torch.float64), requires_grad=False)
        self._support = nn.Parameter(torch.zeros(2 * space.size, dtype=torch.float64), requires_grad=False)
        self.modules = ModuleMap()
        for name, p in ((PRIOR_MODULE, self._prior), (POSTERIOR_MODULE, self._posterior),
                        (SUPPORT_MODULE, self._support)):
            self.modules.add(name, ModuleKind.SHARED, [Piece(p)])

    def __repr__(self) -> str:
        return f"RulesTask({self.rules!r})"

    @property
    def num_samples(self) -> int:
        return self.rules.num_samples

    def prior(self) -> np.ndarray:
        """The prior this hospital holds (from the last global model), (n_heads, n_bodies)."""
        return self.modules.get(PRIOR_MODULE).reshape(len(self.rules.space.heads), -1)

    def train(self, *, round_: int, epochs: int, plan_options: Mapping[str, float | int | str | bool]) -> TrainOutcome:
        """The E-step on the prior just loaded; then local = global − vector for the two sent modules."""
        seed = int(plan_options.get("strategy.seed", self.seed))
        posterior = self.rules.e_step(self.prior(), round_=round_, seed=seed)
        support = self.rules.support()
        with torch.no_grad():
            self._posterior.sub_(torch.from_numpy(posterior.ravel()))
            self._support.sub_(torch.from_numpy(support.ravel()))
        kl = [f.kl for f in self.rules.fits.values()]
        return TrainOutcome(loss=float(np.mean(kl)) if kl else 0.0, used_similar_to=True)

    def trained_modules(self, outcome: TrainOutcome) -> list[str]:
        """The posterior and the support (the prior is the server's)."""
        return [POSTERIOR_MODULE, SUPPORT_MODULE]

    def after_round(self) -> None:
        return None

    def evaluate(self, split: str) -> dict[str, float]:
        """Accuracy per head on this hospital's test rows (labels stay here)."""
        if split != "test":
            raise ConfigError(f"Unknown split {split!r} for a FedNSL task; it keeps a 'test' split only.")
        out = {}
        for head in self.rules.fits:
            rows, y = self.rules._rows(head, self.test)
            if len(rows):
                out[f"acc_{head}"] = float(((self.rules.predict(head, rows) >= 0.5) == (y == 1)).mean())
        return out

    def quality(self) -> dict[str, float]:
        raise ConfigError("DQ weighting is not defined for FedNSL; use [release] metrics = 'none'.")

    def feature_relevance(self) -> dict[str, float]:
        return {}

    def predict(self) -> np.ndarray:
        """P(first head) for every patient of the graph."""
        head = self.rules.space.heads[0]
        return self.rules.predict(head, np.arange(self.rules.graph.x.shape[0]))
