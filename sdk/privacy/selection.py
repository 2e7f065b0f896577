"""Private model choice: the federated validation loss released under DP (issue 30, item 1).

Model selection (:mod:`clinograph.sdk.training.selection`) drives the kept round, early stopping,
restarts and the choice among candidates (:mod:`clinograph.sdk.federation.candidates`) from one
statistic a round: the federated validation loss Σ_k loss_k / Σ_k n_k, summed through the secure
mode. Without DP each hospital's term is exact. Under ``[privacy]`` it is released as the
Gaussian mechanism at the hospital:

    L̃_k = Σ_{i ∈ val_k} min(ℓ_i, B) + N(0, (σ_s · B)²)

with ℓ_i ≥ 0 patient i's loss (binary cross-entropy, or the survival head's per-patient hazard
negative log-likelihood) clipped to ``B = [privacy] selection_loss_clip``. Adding or removing
one patient moves the clipped sum by at most B (its sensitivity), so one release is the Gaussian
mechanism with noise multiplier σ_s: RDP α/(2σ_s²) at every order α (Mironov 2017, Prop. 7),
exactly a subsampled-Gaussian step at q = 1. The hospital's ledger composes every release with
its DP-SGD steps in one RDP sum (:class:`~clinograph.sdk.privacy.accountant.PrivacyLedger`,
purpose ``selection``) and refuses a release that would pass its budget before anything leaves.
Everything the run does with the released losses -- the kept round, the stop rule, restarts,
successive halving and the choice among candidates -- is post-processing of them: no further ε.

The count n_k is sent exact, as without DP: it is no more than what the aggregation weight
already shows (FedAvg's weight is the hospital's training count; the validation count follows
from it and the public split fractions, up to the class rounding of the stratified split).

Calibration (:func:`plan_noise`): a share ``[privacy] selection_share`` of the target ε goes to
the planned releases (σ_s such that the releases alone spend that share), and DP-SGD's σ is
calibrated so that steps and releases *together* stay within the target -- one budget, two
parts, the report shows both (``epsilon_training``, ``epsilon_selection``) and the composed ε.

What the noise costs, measured (research/private_selection/README.md): the standard deviation of
the federated validation loss is σ_s·B·√K / Σ_k n_k with K hospitals each adding its whole noise
(local DP). At a few hundred validation patients that is larger than the round-to-round
differences of the loss: the kept round is then close to a random late round, and only gross
differences between candidates (a model that fails) are seen reliably.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from clinograph.core.errors import PrivacyError

from .accountant import PrivacyLedger, rdp_epsilon, rdp_spent
from .noise import csprng_normal

PURPOSE = "selection"


def clipped_loss_sum(per_patient: np.ndarray, *, clip: float) -> float:
    """Σ_i min(max(ℓ_i, 0), B): the statistic whose sensitivity is B."""
    loss = np.asarray(per_patient, dtype=np.float64)
    if loss.size and not np.isfinite(loss).all():
        loss = np.where(np.isfinite(loss), loss, clip)  # a diverged prediction counts as the worst loss
    return float(np.clip(loss, 0.0, clip).sum())


def binary_losses(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-patient binary cross-entropy of probabilities ``p`` for labels ``y``."""
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-7, 1 - 1e-7)
    y = np.asarray(y, dtype=np.float64)
    return -(y * np.log(p) + (1 - y) * np.log(1 - p))


def survival_losses(logits: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Per-patient hazard negative log-likelihood (the terms of
    :func:`clinograph.sdk.training.survival.hazard_nll_sum`)."""
    z = np.asarray(logits, dtype=np.float64)
    return np.sum(s * np.logaddexp(0.0, z) + e * np.logaddexp(0.0, -z), axis=-1)


def _bisect(f, lo: float, hi: float, *, iters: int = 60) -> float:  # noqa: ANN001 - f: float -> bool (ok)
    """The smallest x in [lo, hi] with f(x) true (f monotone: false below, true above)."""
    if not f(hi):
        raise ValueError("no noise multiplier in range meets the target")
    for _ in range(iters):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if f(mid) else (mid, hi)
        if hi / lo < 1 + 1e-4:
            break
    return hi


@dataclass(frozen=True)
class NoisePlan:
    """σ for DP-SGD, σ_s for the selection releases and σ_set for the set-up releases, calibrated together."""

    noise_multiplier: float
    selection_noise_multiplier: float | None
    releases: int
    steps: int
    epsilon: float
    setup_noise_multiplier: float | None = None
    setup_releases: int = 0


def _share_sigma(count: int, *, alpha: float, budget: float, share: float) -> float:
    """σ at which ``count`` Gaussian releases take ``share`` of ``budget``, the Rényi divergence
    at order α: count · α / (2σ²) = share · budget."""
    return math.sqrt(count * alpha / (2.0 * share * budget))


def plan_noise(*, target_epsilon: float, delta: float, sample_rate: float, steps: int, releases: int,
               selection_share: float, selection_noise_multiplier: float | None = None, setup_releases: int = 0,
               setup_share: float = 0.05, setup_noise_multiplier: float | None = None) -> NoisePlan:
    """σ_s for ``releases`` selection releases taking ``selection_share`` of the Rényi budget (or
    the given ``selection_noise_multiplier``), σ_set likewise for ``setup_releases``, then DP-SGD's
    σ for ``steps`` steps at ``sample_rate`` such that steps and releases composed give
    ε ≤ ``target_epsilon`` at ``delta`` (RDP accountant; the PRV accountant is at least as tight,
    so the plan holds for it too).

    The share is of the Rényi divergence, not of ε: DP-SGD alone at the target has RDP r* at the
    order α* that gives the target ε; the releases are given ``share`` · r* at α* (each costs
    α*/(2σ_s²) there). A share of ε itself cannot be met for small targets (ε of any release at
    δ = 1e-5 is at least log(1/δ)/(α_max − 1) ≈ 0.19 with Opacus's orders up to 63).

    Raises:
        PrivacyError: the target cannot be met (the message says what to change).
    """
    if releases < 0 or setup_releases < 0 or steps < 1 or releases + setup_releases < 1:
        raise PrivacyError(f"A DP release plan needs at least one step and one release (got {steps} steps, "
                           f"{releases} selection and {setup_releases} set-up releases).")
    for name, share in (("selection_share", selection_share), ("setup_share", setup_share)):
        if not 0 < share < 1:
            raise PrivacyError(f"[privacy] {name} = {share!r} must be in (0, 1).")
    try:
        sigma0 = _bisect(lambda s: rdp_epsilon([(s, sample_rate, steps)], delta) <= target_epsilon, 1e-2, 1e4)
        _, alpha, budget = rdp_spent([(sigma0, sample_rate, steps)], delta)
        sigma_s = sigma_set = None
        extra: list[tuple[float, float, int]] = []
        if releases:
            sigma_s = float(selection_noise_multiplier or _share_sigma(releases, alpha=alpha, budget=budget,
                                                                       share=selection_share))
            extra.append((sigma_s, 1.0, releases))
        if setup_releases:
            sigma_set = float(setup_noise_multiplier or _share_sigma(setup_releases, alpha=alpha, budget=budget,
                                                                     share=setup_share))
            extra.append((sigma_set, 1.0, setup_releases))
        if rdp_epsilon(extra, delta) >= target_epsilon:
            raise PrivacyError(f"The planned releases alone (σ_s = {sigma_s}, σ_set = {sigma_set}) spend the target "
                               f"ε = {target_epsilon:g}. Fix: raise [privacy] selection_noise_multiplier / "
                               "setup_noise_multiplier, or lower the shares.")
        sigma = _bisect(lambda s: rdp_epsilon([(s, sample_rate, steps), *extra], delta) <= target_epsilon, 1e-2, 1e4)
    except ValueError:
        raise PrivacyError(f"Cannot calibrate σ for ε = {target_epsilon:g}, δ = {delta:g} over {steps} steps at "
                           f"q = {sample_rate:.4g} with {releases} selection and {setup_releases} set-up releases. "
                           "Fix: raise the target ε or plan fewer rounds or candidates.") from None
    eps = rdp_epsilon([(sigma, sample_rate, steps), *extra], delta)
    return NoisePlan(noise_multiplier=sigma, selection_noise_multiplier=sigma_s, releases=releases, steps=steps,
                     epsilon=eps, setup_noise_multiplier=sigma_set, setup_releases=setup_releases)


class PrivateValidation:
    """A hospital's DP release of its validation loss sum, accounted in its ledger.

    Args:
        ledger: the hospital's :class:`PrivacyLedger` (the DP-SGD trainer's).
        noise_multiplier: σ_s. clip: B, the per-patient loss bound.
    """

    def __init__(self, ledger: PrivacyLedger, *, noise_multiplier: float, clip: float):
        if not (math.isfinite(noise_multiplier) and noise_multiplier > 0 and math.isfinite(clip) and clip > 0):
            raise PrivacyError(f"Hospital {ledger.site!r}: a private validation release needs σ_s > 0 and a loss clip "
                               f"B > 0 (got σ_s = {noise_multiplier!r}, B = {clip!r}).")
        self.ledger, self.noise_multiplier, self.clip = ledger, float(noise_multiplier), float(clip)

    def release(self, per_patient: np.ndarray, *, round_: int) -> float:
        """The noisy clipped loss sum L̃_k of this round, recorded in the ledger; refused
        (:class:`~clinograph.core.errors.PrivacyBudgetExceeded`) before anything is computed from
        the noise when it would pass the budget."""
        self.ledger.check_release(round_=round_, noise_multiplier=self.noise_multiplier, purpose=PURPOSE)
        total = clipped_loss_sum(per_patient, clip=self.clip)
        noisy = total + self.noise_multiplier * self.clip * float(csprng_normal(1)[0])
        self.ledger.commit_release(round_=round_, noise_multiplier=self.noise_multiplier, purpose=PURPOSE)
        return noisy

    def __repr__(self) -> str:
        return f"PrivateValidation(site={self.ledger.site!r}, sigma_s={self.noise_multiplier:g}, clip={self.clip:g})"


def selection_plan(privacy, *, n_train: int) -> NoisePlan | None:  # noqa: ANN001 - a PrivacySection
    """The joint plan of a hospital whose selection or set-up releases are planned
    (``[privacy] planned_selection_releases`` / ``planned_setup_releases`` > 0), else None: DP-SGD's
    σ as configured or calibrated to what the releases leave of the target, σ_s and σ_set as
    configured or calibrated to their shares.

    Raises:
        PrivacyError: σ must be calibrated but ``planned_rounds`` is unset; or the target cannot be met.
    """
    from .calibration import poisson_plan

    releases, setup = privacy.planned_selection_releases or 0, privacy.planned_setup_releases or 0
    if not releases and not setup:
        return None
    q, steps_epoch = poisson_plan(n_train=n_train, batch_size=privacy.batch_size)
    target = privacy.target_epsilon or privacy.epsilon_budget
    if privacy.planned_rounds is None:
        if privacy.noise_multiplier is not None and (privacy.selection_noise_multiplier or not releases) \
                and (privacy.setup_noise_multiplier or not setup):
            return NoisePlan(noise_multiplier=float(privacy.noise_multiplier),
                             selection_noise_multiplier=privacy.selection_noise_multiplier, releases=releases, steps=0,
                             epsilon=math.nan, setup_noise_multiplier=privacy.setup_noise_multiplier,
                             setup_releases=setup)
        raise PrivacyError("[privacy] needs planned_rounds to calibrate σ and the release noise to the ε budget over the "
                           "run (or noise_multiplier with selection_noise_multiplier / setup_noise_multiplier for the "
                           "releases planned). Set them in the hospital config.")
    steps = privacy.planned_rounds * (privacy.planned_local_epochs or 1) * steps_epoch
    if privacy.noise_multiplier is not None:  # σ fixed: the releases take their shares of its Rényi divergence
        _, alpha, budget = rdp_spent([(float(privacy.noise_multiplier), q, steps)], privacy.delta)
        return NoisePlan(
            noise_multiplier=float(privacy.noise_multiplier), releases=releases, steps=steps, epsilon=math.nan,
            selection_noise_multiplier=(privacy.selection_noise_multiplier or _share_sigma(
                releases, alpha=alpha, budget=budget, share=privacy.selection_share)) if releases else None,
            setup_noise_multiplier=(privacy.setup_noise_multiplier or _share_sigma(
                setup, alpha=alpha, budget=budget, share=privacy.setup_share)) if setup else None,
            setup_releases=setup)
    return plan_noise(target_epsilon=target, delta=privacy.delta, sample_rate=q, steps=steps, releases=releases,
                      selection_share=privacy.selection_share,
                      selection_noise_multiplier=privacy.selection_noise_multiplier, setup_releases=setup,
                      setup_share=privacy.setup_share, setup_noise_multiplier=privacy.setup_noise_multiplier)
