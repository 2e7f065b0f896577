"""Server-side checks of the privacy ledgers hospitals sign into their reports (no torch).

What the server can check without trusting a hospital's arithmetic, per hospital across rounds:

* the declared budget is within the federation's policy, and ε within the declared budget;
* cumulative ε never decreases, δ never changes, ledger rounds advance, and ε rises only with
  steps (``steps > 0``);
* for the RDP accountant: ε is at least what the RDP bound gives for the (σ, q, steps) the
  hospital declared in *this* federation, recomputed here -- the Poisson-subsampled Gaussian
  mechanism of Mironov, Talwar & Zhang 2019 (sec. 3.3, integer and fractional orders), RDP
  summed over steps and rounds, converted with Balle et al. 2020 (Thm. 21), over Opacus's
  default orders. Steps taken elsewhere only raise the true ε, so this is a lower bound. The
  round's Gaussian releases outside DP-SGD (``releases``: model selection, issue 30) are
  composed into the same floor as full-batch (q = 1) Gaussian steps.

Does not check: that the declared σ, q and steps are what the hospital ran (a hospital can
lie about its noise). A local-DP ledger kept with the ``prv`` accountant (tighter than RDP, so no
RDP floor applies, and its ε is not recomputed here) is refused unless the policy names
``insecure_unchecked_prv``; any other accountant name is refused.

numpy and the standard library only: the server install has neither torch (Opacus) nor scipy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from .messages import DPPolicy, LedgerEntry

if TYPE_CHECKING:
    from .dp import DistributedPolicy

#: Opacus's RDPAccountant.DEFAULT_ALPHAS.
ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + [float(a) for a in range(12, 64)])
_REL_TOL = 1e-6


def _log_add(a: float, b: float) -> float:
    hi, lo = max(a, b), min(a, b)
    return hi if lo == -math.inf else math.log1p(math.exp(lo - hi)) + hi


def _log_sub(a: float, b: float) -> float:
    if b == -math.inf:
        return a
    if a <= b:
        return -math.inf  # numerically zero (Opacus raises for a < b; terms here are tiny)
    try:
        return math.log(math.expm1(a - b)) + b
    except OverflowError:
        return a


def _log_erfc(x: float) -> float:
    """log(erfc(x)), with the asymptotic series where erfc underflows."""
    if x < 25.0:
        return math.log(math.erfc(x))
    x2 = x * x
    return -x2 - math.log(x) - 0.5 * math.log(math.pi) + math.log1p(-1 / (2 * x2) + 3 / (4 * x2 * x2))


def _log_a_int(q: float, sigma: float, alpha: int) -> float:
    log_a = -math.inf
    for i in range(alpha + 1):
        log_coef = (math.lgamma(alpha + 1) - math.lgamma(i + 1) - math.lgamma(alpha - i + 1)
                    + i * math.log(q) + (alpha - i) * math.log1p(-q))
        log_a = _log_add(log_a, log_coef + (i * i - i) / (2 * sigma**2))
    return log_a


def _log_a_frac(q: float, sigma: float, alpha: float) -> float:
    log_a0 = log_a1 = -math.inf
    z0 = sigma**2 * math.log(1 / q - 1) + 0.5
    coef, i = 1.0, 0
    while True:
        j = alpha - i
        log_coef = math.log(abs(coef))
        log_t0 = log_coef + i * math.log(q) + j * math.log1p(-q)
        log_t1 = log_coef + j * math.log(q) + i * math.log1p(-q)
        log_e0 = math.log(0.5) + _log_erfc((i - z0) / (math.sqrt(2) * sigma))
        log_e1 = math.log(0.5) + _log_erfc((z0 - j) / (math.sqrt(2) * sigma))
        log_s0 = log_t0 + (i * i - i) / (2 * sigma**2) + log_e0
        log_s1 = log_t1 + (j * j - j) / (2 * sigma**2) + log_e1
        if coef > 0:
            log_a0, log_a1 = _log_add(log_a0, log_s0), _log_add(log_a1, log_s1)
        else:
            log_a0, log_a1 = _log_sub(log_a0, log_s0), _log_sub(log_a1, log_s1)
        coef *= (alpha - i) / (i + 1)
        i += 1
        if max(log_s0, log_s1) < -30 or i > 10_000:
            break
    return _log_add(log_a0, log_a1)


@lru_cache(maxsize=256)
def rdp_per_step(*, q: float, sigma: float) -> tuple[float, ...]:
    """RDP of one step of the Poisson-subsampled Gaussian mechanism at each of :data:`ORDERS`
    (Mironov, Talwar & Zhang 2019, sec. 3.3). Infinite without noise."""
    if q == 0:
        return tuple(0.0 for _ in ORDERS)
    if sigma == 0:
        return tuple(math.inf for _ in ORDERS)
    if q == 1.0:
        return tuple(a / (2 * sigma**2) for a in ORDERS)
    return tuple((_log_a_int(q, sigma, int(a)) if float(a).is_integer() else _log_a_frac(q, sigma, a)) / (a - 1)
                 for a in ORDERS)


def epsilon_from_rdp(rdp: np.ndarray, *, delta: float) -> float:
    """ε at ``delta`` from RDP values at :data:`ORDERS` (Balle et al. 2020, Thm. 21; as Opacus)."""
    orders = np.asarray(ORDERS)
    with np.errstate(invalid="ignore"):
        eps = rdp - (np.log(delta) + np.log(orders)) / (orders - 1) + np.log((orders - 1) / orders)
    return math.inf if np.isnan(eps).all() else float(np.nanmin(eps))


@dataclass(frozen=True)
class LedgerTrack:
    """The last accepted ledger entry of one hospital and the RDP of every step it declared here;
    under distributed DP also the Skellam RDP of its rounds here, relied on and alone
    (:mod:`clinograph.secure.dp.skellam` orders)."""

    last: LedgerEntry
    rdp: np.ndarray
    skellam: np.ndarray | None = None
    skellam_alone: np.ndarray | None = None


@dataclass(frozen=True)
class Published:
    """What the server itself fixes for a distributed-DP round, against which every declared share
    is checked: the ring scale the round's signed plan publishes (``masked.scale``; None: the plan
    publishes none) and the coordinates the model spec releases (its shared modules' sizes)."""

    scale: float | None
    dim: int


def distributed_policy(policy: DPPolicy) -> DistributedPolicy:
    """The federation's distributed-DP policy as :mod:`clinograph.secure.dp` reads it (C is the
    policy's ``max_clip_norm``). ValueError if the policy has no distributed DP."""
    from .dp import DistributedPolicy

    d = policy.distributed
    if d is None:
        raise ValueError("the policy has no distributed DP")
    return DistributedPolicy(mechanism=d.mechanism, noise_multiplier=d.noise_multiplier, clip_norm=policy.max_clip_norm,
                             sample_rate=d.sample_rate, min_honest=d.min_honest, rounds=d.rounds,
                             max_epsilon=policy.max_epsilon, delta=policy.delta)


def share_problems(entry: LedgerEntry, *, policy: DPPolicy, published: Published) -> list[str]:
    """Distributed DP: how the share declared in ``entry`` differs from the federation's
    (mechanism, σ, q, C, h, μ/h) **at the published scale** and from the released dimension.

    The declared scale and dimension are compared with the server's and then never used: μ/h is
    checked at ``published.scale`` (a share declared at a millionth of the scale is consistent
    with itself and adds almost no noise in the ring) and the floors of :func:`check_ledger` and
    the aggregate's noise test use the server's numbers. Empty: it conforms."""
    from .dp import ShareDeclaration
    from .dp import share_problems as policy_problems

    d, share = policy.distributed, entry.share
    if d is None:
        return []
    if share is None:
        return ["the federation runs distributed DP, but the ledger entry declares no noise share"]
    if published.scale is None:
        return ["the federation runs distributed DP, but this round's plan publishes no masked.scale (the server's "
                "secure mode must be 'masked')"]
    problems = []
    if not math.isclose(share.scale, published.scale, rel_tol=1e-12, abs_tol=0.0):
        problems.append(f"the share is declared at ring scale {share.scale:.9g}, but this round's signed plan publishes "
                        f"masked.scale = {published.scale:.9g}; compute the share at the plan's masked.scale (a "
                        "different value means a modified client or plan options altered before training)")
    if share.dim != published.dim:
        problems.append(f"the share is accounted over {share.dim} coordinates, but the model spec releases "
                        f"{published.dim} (its shared modules); account over the spec's shared coordinates")
    mine = distributed_policy(policy)
    declared = ShareDeclaration(mechanism=share.mechanism, noise_multiplier=entry.noise_multiplier,
                                min_honest=share.min_honest, clip_norm=entry.clip_norm, sample_rate=entry.sample_rate,
                                scale=published.scale, share_variance=share.share_variance)
    return problems + policy_problems(mine, declared)


def check_ledger(entry: LedgerEntry, *, previous: LedgerTrack | None, policy: DPPolicy,
                 published: Published | None = None) -> tuple[list[str], LedgerTrack]:
    """Problems with ``entry`` given the hospital's previous accepted one (see the module docstring).

    Args:
        published: under distributed DP, the server's own scale and dimension (the Skellam floors
            are computed at them, never at what the share declares).

    Returns:
        (problems, the track to keep if the report is accepted). Problems name numbers the
        hospital declared, never data.
    """
    problems: list[str] = []
    tol = 1e-9
    if entry.budget_epsilon > policy.max_epsilon:
        problems.append(f"declared budget ε = {entry.budget_epsilon:g} exceeds the federation's maximum "
                        f"{policy.max_epsilon:g}")
    if entry.epsilon > entry.budget_epsilon * (1 + _REL_TOL) + tol:
        problems.append(f"ε = {entry.epsilon:.4g} exceeds the hospital's own declared budget {entry.budget_epsilon:g}")
    if previous is not None:
        last = previous.last
        if entry.round <= last.round:
            problems.append(f"ledger entry is for round {entry.round}, not after the last accepted round {last.round}")
        if entry.delta != last.delta:
            problems.append(f"δ changed from {last.delta:g} to {entry.delta:g} (ε values are no longer comparable)")
        if entry.epsilon < last.epsilon * (1 - _REL_TOL) - tol:
            problems.append(f"cumulative ε went down from {last.epsilon:.4g} to {entry.epsilon:.4g}")
        elif entry.steps == 0 and not entry.releases and entry.epsilon > last.epsilon * (1 + _REL_TOL) + tol:
            problems.append(f"ε rose from {last.epsilon:.4g} to {entry.epsilon:.4g} with zero steps and no release")
    rdp = (previous.rdp if previous is not None else np.zeros(len(ORDERS)))
    if entry.steps:
        rdp = rdp + entry.steps * np.asarray(rdp_per_step(q=entry.sample_rate, sigma=entry.noise_multiplier))
    for release in entry.releases:  # Gaussian releases outside DP-SGD: the q = 1 step, composed the same way
        rdp = rdp + release.count * np.asarray(rdp_per_step(q=1.0, sigma=release.noise_multiplier))
    for part in (entry.epsilon_training, entry.epsilon_selection, entry.epsilon_setup):
        if part is not None and part > entry.epsilon * (1 + _REL_TOL) + tol:
            problems.append(f"a part of ε ({part:.4g}) exceeds the composed ε = {entry.epsilon:.4g}")
    if entry.share is None and entry.accountant != "rdp" and not (entry.accountant == "prv"
                                                                   and policy.insecure_unchecked_prv):
        problems.append(f"accountant {entry.accountant!r}: the server checks a local-DP ε against the RDP bound "
                        "only, so the federation accepts ledgers kept with 'rdp' (the operator may accept 'prv' by "
                        "name: [dp_policy] insecure_unchecked_prv = true)")
    if entry.accountant == "rdp" and bool(np.any(rdp > 0)):
        floor = epsilon_from_rdp(rdp, delta=entry.delta)
        if entry.epsilon < floor * (1 - _REL_TOL) - tol:
            problems.append(f"ε = {entry.epsilon:.4g} is below {floor:.4g}, the RDP bound (Mironov et al. 2019) for "
                            "the noise multipliers, sample rates and steps it declared in this federation")
    skellam, alone = _distributed_floors(entry, previous=previous, policy=policy, published=published,
                                         problems=problems, tol=tol)
    return problems, LedgerTrack(last=entry, rdp=rdp, skellam=skellam, skellam_alone=alone)


def _distributed_floors(entry: LedgerEntry, *, previous: LedgerTrack | None, policy: DPPolicy,
                        published: Published | None, problems: list[str],
                        tol: float) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Distributed DP: ε and ``epsilon_alone`` are at least what the Skellam accountant gives for
    the rounds the hospital took part in here, recomputed from the server's own numbers -- the
    policy's σ, q, C and h, the plan's published scale and the spec's released dimension -- never
    from what the share declares (rounds elsewhere only raise the true values). Alone, its share
    is σ/sqrt(h) of the aggregate's noise.

    Tolerance: a declared ε may fall short of the floor by at most 1e-6 relative (+1e-9). The
    hospital runs the same accountant (:mod:`clinograph.secure.dp.skellam`) on the same numbers,
    composing the same per-round RDP curves in the same order, and JSON carries floats exactly,
    so honest values differ only by summation rounding (~1e-16 per round, 1e-11 after 10⁵
    rounds); an understatement hidden under 1e-6 is 3e-6 at ε = 3, far below what the
    accountant itself can resolve."""
    share, dist = entry.share, policy.distributed
    if dist is None:
        if share is not None:
            problems.append("the ledger entry declares a distributed-DP noise share, but the federation's policy "
                            "has no distributed DP")
        return None, None
    if share is None or published is None or published.scale is None:
        return None, None  # refused by the share checks (no share; no published scale)
    if entry.steps != 1:
        problems.append(f"a distributed-DP round is one DP-SGD step; the entry declares steps = {entry.steps}")
    from .dp.skellam import ORDERS as SKELLAM_ORDERS
    from .dp.skellam import SkellamRound, rdp_to_epsilon

    zero = np.zeros(len(SKELLAM_ORDERS))
    relied = previous.skellam if previous is not None and previous.skellam is not None else zero
    alone = previous.skellam_alone if previous is not None and previous.skellam_alone is not None else zero
    q, sigma, clip = dist.sample_rate, dist.noise_multiplier, policy.max_clip_norm
    relied = relied + SkellamRound(q, sigma, clip, published.scale, published.dim).rdp()
    alone = alone + SkellamRound(q, sigma / math.sqrt(dist.min_honest), clip, published.scale, published.dim).rdp()
    floor = rdp_to_epsilon(relied, delta=entry.delta)
    if entry.epsilon < floor * (1 - _REL_TOL) - tol:
        problems.append(f"ε = {entry.epsilon:.4g} is below {floor:.4g}, the Skellam accountant's bound for its "
                        f"rounds here at the federation's σ, q, C, the published scales and the {published.dim} "
                        "coordinates the model releases")
    floor_alone = rdp_to_epsilon(alone, delta=entry.delta)
    if share.epsilon_alone < floor_alone * (1 - _REL_TOL) - tol:
        problems.append(f"epsilon_alone = {share.epsilon_alone:.4g} is below {floor_alone:.4g}, the Skellam "
                        "accountant's bound for its own share alone (σ/sqrt(h)) over its rounds here")
    return relied, alone
