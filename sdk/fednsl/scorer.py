"""The hospital's E-step for one rule head: score candidates, learn w_i under the KL constraint,
form the posterior (FedNSL eqs. 2, 7-11; Algorithm 1 lines 5-8).

Given the prior ``T_θ(· | head)`` restricted to this round's J candidate bodies and the fuzzy
body values ``F[p, j] = max_{G_i} ∏_k x(r_kj)`` of every candidate for every training
patient (eq. 8's inner term, :class:`~.graph.HospitalGraph`):

- score (eq. 9, the per-rule term of its appendix form eq. 19):
  ``H_j = ½ · w_j · ē_j + log T_θ(b_j | head)`` with ``ē_j = Σ_p y_p F[p, j] / Σ_p F[p, j]`` the
  rule's signed evidence here (``y = ±1``, class-balanced weights; in [−1, 1], 0 when the body
  never holds here); the paper's ``1/J`` factor is a constant absorbed into ``w``;
- posterior (eq. 10): ``p_w(b_j) = softmax_j(H_j)`` over the candidates (the multinomial's
  probabilities; its ``N!/∏ n_j!`` factor does not depend on ``w``);
- likelihood (eqs. 7-8): ``log σ(y_p · (s · E_{j ~ p_w}[F[p, j]] + b))`` -- the expectation over the
  variational posterior of eq. 7 taken explicitly, with a positive scale ``s`` and an
  intercept ``b`` learned beside ``w`` (the paper's rule weights alone cannot express "no
  rule fires, so the head is false"). We use ``log σ`` itself, not its Taylor form ``½(·)``;
- objective (eq. 2): ``−Σ_p likelihood_p + λ · D_KL(p_w ‖ T_θ)`` -- the likelihood summed over the
  hospital's labelled patients, the KL once (eq. 3's ELBO; computed as their ratio to N) -- minimised
  over ``(w, s, b)`` by Adam; ``ScorerSettings.kl_direction`` switches to eq. (11)'s prior-weighted
  ``D_KL(T_θ ‖ p_w)``.

What the KL does and does not do here. The prior already enters the posterior through eq. (9)'s
``log T_θ`` term, so even without the KL (``λ = 0``, the paper's "W/O. KL" ablation) a rule that no
local patient fires keeps its prior share up to normalisation (its ``ē_j`` is 0, so ``w_j`` gets no
gradient); what the ablation loses is the pull that stops the rules this hospital's patients
support from crowding it out. With the KL the posterior stays nearer the prior (measured on the
clinical benchmark, docs/fednsl.md: north keeps 0.41 of the prior's PE-rule share without KL,
0.55-0.60 with λ = 1-10 in the eq.-2 direction).

Shapes:
    F: (n_patients, J); y: (n_patients,) in {0, 1}; log_prior: (J,)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from clinograph.core.errors import ConfigError


@dataclass(frozen=True)
class ScorerSettings:
    """E-step settings. ``kl_weight`` is λ of eq. (2) (0 = the no-KL ablation), weighed against the
    hospital's *total* log-likelihood (the sum of eq. 8 over its N labelled training patients, as in
    eq. 3's ``log p(a_{1:n} | ...)``: the KL counts once per hospital, not once per patient), so
    λ = 1 is the ELBO's own weight. (Before this was fixed, λ multiplied the KL against the
    per-patient *mean*, i.e. an effective λ·N ≈ 500 at the clinical benchmark's hospitals.)

    ``kl_direction``: ``"posterior_prior"`` is eq. (2)'s and section 3.4.3's
    ``D_KL(p_w ‖ p_θ)`` (mode-seeking: dropping a prior rule costs little);
    ``"prior_posterior"`` follows eq. (11) as printed, which weights by the prior
    (``Mu_θ log(Mu_w / Mu_θ)``, the negative of ``D_KL(p_θ ‖ p_w)``; we penalise
    ``D_KL(p_θ ‖ p_w)``) (mass-covering: a rule the prior holds cannot lose its posterior mass
    cheaply, which is what keeps the rules of a subgroup this hospital never saw).
    """

    kl_weight: float = 1.0
    kl_direction: Literal["posterior_prior", "prior_posterior"] = "posterior_prior"
    steps: int = 150
    lr: float = 0.1
    class_balance: bool = True

    def __post_init__(self) -> None:
        if self.kl_direction not in ("posterior_prior", "prior_posterior"):
            raise ConfigError(f"ScorerSettings.kl_direction is {self.kl_direction!r}; expected 'posterior_prior' "
                              "(eq. 2, the default) or 'prior_posterior' (eq. 11 as printed).")
        if not self.kl_weight >= 0:
            raise ConfigError(f"ScorerSettings.kl_weight (λ of eq. 2) is {self.kl_weight}; expected λ ≥ 0 "
                              "(0 is the no-KL ablation).")


@dataclass(frozen=True, repr=False)
class HeadPosterior:
    """One head's fitted E-step: candidates (body indices), rule weights, posterior, predictor."""

    candidates: np.ndarray
    w: np.ndarray
    posterior: np.ndarray
    scale: float
    bias: float
    kl: float

    def __repr__(self) -> str:
        return f"HeadPosterior(candidates={len(self.candidates)}, kl={self.kl:.3g})"

    def predict(self, values: np.ndarray) -> np.ndarray:
        """P(head) for patients whose candidate body values are ``values`` (n, J)."""
        z = self.scale * (np.asarray(values) @ self.posterior) + self.bias
        return 1.0 / (1.0 + np.exp(-np.clip(z, -60, 60)))


def sample_candidates(prior: np.ndarray, *, draws: int, seed: int) -> np.ndarray:
    """Algorithm 1 line 5: the J unique bodies among ``draws`` samples of the prior (sorted).

    ``seed`` is public (the federation's seed and the round), so every hospital scores the same
    candidates and their posteriors share one support.
    """
    p = np.asarray(prior, dtype=np.float64).clip(0)
    # numpy.random is fine here: the seed is public by design and the draws are not secret (style 13)
    rng = np.random.default_rng(seed)
    return np.unique(rng.choice(len(p), size=draws, p=p / p.sum()))


def _kl(pi: torch.Tensor, log_prior: torch.Tensor, direction: str) -> torch.Tensor:
    """``D_KL(p_w ‖ p_θ)`` (eq. 2) or ``D_KL(p_θ ‖ p_w)`` (eq. 11 as printed) over the candidates."""
    log_pi = torch.log(pi + 1e-300)
    if direction == "posterior_prior":
        return (pi * (log_pi - log_prior)).sum()
    return (torch.exp(log_prior) * (log_prior - log_pi)).sum()


def fit_head(values: np.ndarray, y: np.ndarray, log_prior: np.ndarray, *, candidates: np.ndarray,
             settings: ScorerSettings) -> HeadPosterior:
    """The E-step for one head (module docstring). ``log_prior`` is over the candidates and
    need not be normalised; it is renormalised here. It draws nothing: w starts at 0, the scale
    and bias at fixed values, and Adam is deterministic."""
    F = torch.as_tensor(np.asarray(values), dtype=torch.float64)
    yy = torch.as_tensor(2.0 * np.asarray(y, dtype=np.float64) - 1.0)
    lp = torch.as_tensor(np.asarray(log_prior, dtype=np.float64))
    lp = lp - torch.logsumexp(lp, 0)
    pos = float((yy > 0).double().mean()) if len(yy) else 0.5
    if settings.class_balance and 0 < pos < 1:
        weight = torch.where(yy > 0, 0.5 / pos, 0.5 / (1 - pos)).double()
    else:
        weight = torch.ones_like(yy)
    fired = weight @ F if len(yy) else torch.zeros(F.shape[1], dtype=torch.float64)
    evidence = torch.where(fired > 1e-9, (weight * yy) @ F / fired.clamp_min(1e-9), torch.zeros_like(fired))
    w = torch.zeros(F.shape[1], dtype=torch.float64, requires_grad=True)
    raw_s = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    b = torch.tensor(0.0, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([w, raw_s, b], lr=settings.lr)

    def posterior() -> torch.Tensor:
        return torch.softmax(0.5 * w * evidence + lp, 0)  # eqs. (9)-(10)

    for _ in range(settings.steps if len(yy) else 0):
        pi = posterior()
        z = torch.nn.functional.softplus(raw_s) * (F @ pi) + b
        nll = -(weight * torch.nn.functional.logsigmoid(yy * z)).sum() / weight.sum()  # eq. (8)
        kl = _kl(pi, lp, settings.kl_direction)  # eqs. (2), (11)
        loss = nll + settings.kl_weight * kl / len(yy)  # = (Σ_p NLL_p + λ KL) / N: λ against the sum (eq. 3)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        pi = posterior()
        kl = float(_kl(pi, lp, settings.kl_direction))
        return HeadPosterior(candidates=np.asarray(candidates), w=w.detach().numpy().copy(),
                             posterior=pi.numpy().copy(), scale=float(torch.nn.functional.softplus(raw_s)),
                             bias=float(b), kl=kl)
