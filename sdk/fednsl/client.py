"""A hospital's side of FedNSL (Algorithm 1 lines 4-9; Algorithm 2 lines 4-15).

:class:`HospitalRules` holds what never leaves the hospital -- its knowledge graph, its labels
per head, its split -- and turns the federation's prior into its posterior over the whole
rule space (zeros outside this round's candidates), plus the aggregate support statistics the
rules artefact reports. Both are fixed-length vectors over the public
:class:`~.rules.RuleSpace`, so they can be summed by secure aggregation (:mod:`.task`).

Shapes:
    prior, posterior: (n_heads, n_bodies); support: (2, n_heads, n_bodies) =
    (mean fuzzy value of body ∧ head, mean fuzzy value of body) over labelled training patients
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from .graph import HospitalGraph
from .rules import RuleSpace
from .scorer import HeadPosterior, ScorerSettings, fit_head, sample_candidates


@dataclass(frozen=True)
class EStepSettings:
    """Per-round client settings: the scorer, J's draw count, Fast-FedNSL's switch round ``I``."""

    scorer: ScorerSettings = field(default_factory=ScorerSettings)
    draws: int = 256
    fast_after: int | None = None  # Algorithm 2's I; None runs Algorithm 1 throughout


@dataclass(repr=False)
class HospitalRules:
    """One hospital's graph and labels, and its latest E-step per head.

    Args:
        space: the federation's public rule space.
        graph: this hospital's knowledge graph (all its patients).
        labels: head -> (n_patients,) in {0, 1}, ``-1`` where unknown; heads it lacks are absent.
        train: row indices the E-step learns from.
    """

    space: RuleSpace
    graph: HospitalGraph
    labels: Mapping[str, np.ndarray]
    train: np.ndarray
    settings: EStepSettings = field(default_factory=EStepSettings)
    fits: dict[str, HeadPosterior] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"HospitalRules(heads={sorted(self.labels)}, train={len(self.train)})"

    @property
    def num_samples(self) -> int:
        return int(len(self.train))

    def _rows(self, head: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        y = np.asarray(self.labels[head])[rows]
        keep = y >= 0
        return np.asarray(rows)[keep], y[keep]

    def e_step(self, prior: np.ndarray, *, round_: int, seed: int) -> np.ndarray:
        """Score, fit and return the posterior over the whole space (Algorithm 1 lines 5-8).

        Heads this hospital has no labels for get a zero row (it sends no posterior for them).
        """
        prior = np.asarray(prior, dtype=np.float64).reshape(len(self.space.heads), self.space.n_bodies)
        graph_search = self.settings.fast_after is None or round_ < self.settings.fast_after
        out = np.zeros_like(prior)
        for h, head in enumerate(self.space.heads):
            if head not in self.labels:
                continue
            rows, y = self._rows(head, self.train)
            if len(rows) == 0:
                continue
            cand = sample_candidates(prior[h], draws=self.settings.draws, seed=seed * 1_000_003 + round_ * 101 + h)
            bodies = [self.space.bodies[j] for j in cand]
            values = self.graph.body_values(bodies, graph_search=graph_search, rows=rows)
            fit = fit_head(values, y, np.log(prior[h, cand] + 1e-300), candidates=cand, settings=self.settings.scorer)
            self.fits[head] = fit
            out[h, cand] = fit.posterior
        return out

    def support(self, *, chunk: int = 2048) -> np.ndarray:
        """Mean fuzzy value of ``body ∧ head`` and of ``body`` over labelled training patients, for
        every rule of the space (what the rules artefact reports, summed across hospitals)."""
        out = np.zeros((2, len(self.space.heads), self.space.n_bodies))
        for h, head in enumerate(self.space.heads):
            if head not in self.labels:
                continue
            rows, y = self._rows(head, self.train)
            if len(rows) == 0:
                continue
            for s in range(0, self.space.n_bodies, chunk):
                vals = self.graph.body_values(self.space.bodies[s:s + chunk], graph_search=False, rows=rows)
                out[0, h, s:s + chunk] = (vals * y[:, None]).mean(0)
                out[1, h, s:s + chunk] = vals.mean(0)
        return out

    def predict(self, head: str, rows: np.ndarray) -> np.ndarray:
        """P(head) for ``rows`` from this hospital's latest posterior (its personalised rule model)."""
        fit = self.fits.get(head)
        if fit is None:
            raise KeyError(f"No E-step has run for head {head!r} at this hospital (it has labels for "
                           f"{sorted(self.labels)}); run a round first.")
        graph_search = self.settings.fast_after is None
        values = self.graph.body_values([self.space.bodies[j] for j in fit.candidates], graph_search=graph_search,
                                        rows=np.asarray(rows))
        return fit.predict(values)
