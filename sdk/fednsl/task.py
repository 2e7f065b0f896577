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

from clinograph.core.errors import ConfigError, ProtocolError
from clinograph.core.spec import ModuleKind

from ..federation.task import TaskBase
from ..model.modules import ModuleMap, Piece
from ..training.trainer import TrainOutcome
from .client import HospitalRules
from .rules import RuleSpace


def rule_modules(space: RuleSpace, prior: np.ndarray) -> ModuleMap:
    """The three rule modules over ``space`` (float64, never trained by an optimiser): the prior
    ``prior`` (n_heads, n_bodies), posterior and support zero. What a hospital's task holds and
    what ``clinograph model init`` writes, without a table."""
    flat = torch.as_tensor(np.asarray(prior, dtype=np.float64).ravel().copy())
    if flat.numel() != space.size:
        raise ConfigError(f"The prior has {flat.numel()} entries; the rule space needs {space.size} "
                          f"({len(space.heads)} heads × {space.n_bodies} bodies).")
    modules = ModuleMap()
    for name, value in ((PRIOR_MODULE, flat), (POSTERIOR_MODULE, torch.zeros(space.size, dtype=torch.float64)),
                        (SUPPORT_MODULE, torch.zeros(2 * space.size, dtype=torch.float64))):
        modules.add(name, ModuleKind.SHARED, [Piece(nn.Parameter(value, requires_grad=False))])
    return modules


class RulesTask(TaskBase):
    """A hospital's FedNSL task (see the module docstring).

    Args:
        rules: the hospital's graph, labels and split.
        prior: the federation's initial prior (n_heads, n_bodies), identical at every hospital.
        test: row indices :meth:`evaluate` uses.
        rule_space_sha256: the digest of the rule space this hospital derived itself; when given, a
            plan whose ``fednsl_rules`` strategy pins another space is refused (the server cannot
            make a hospital score rules it did not configure).
    """

    name = "fednsl"

    def __init__(self, *, rules: HospitalRules, prior: np.ndarray, test: np.ndarray, seed: int = 0,
                 rule_space_sha256: str | None = None):
        self.rules, self.test, self.seed = rules, np.asarray(test), int(seed)
        self.rule_space_sha256 = rule_space_sha256
        self.modules = rule_modules(rules.space, prior)
        self._prior, self._posterior, self._support = (self.modules.pieces(m)[0].param for m in
                                                       (PRIOR_MODULE, POSTERIOR_MODULE, SUPPORT_MODULE))

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
        pinned = plan_options.get("strategy.rule_space_sha256")
        if self.rule_space_sha256 is not None and pinned != self.rule_space_sha256:
            got = "no rule space (its strategy is not fednsl_rules)" if pinned is None else \
                f"rule space {str(pinned)[:12]}…"
            raise ProtocolError(f"The plan pins {got}, but this "
                                f"hospital's [fednsl] settings and dictionary give {self.rule_space_sha256[:12]}…. "
                                "Refused; nothing was computed. Fix: write rule_space.json with `clinograph model "
                                "init` from the same hospital.toml and dictionary every hospital uses, and pin it in "
                                "server.toml's [federation] strategy_options.")
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
