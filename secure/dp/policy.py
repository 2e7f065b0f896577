"""Checks of the distributed-DP policy: at configuration time and for every hospital's share. Torch-free.

A federation in ``[privacy] mode = "distributed"`` promises (ε, δ)-DP per patient of every
honest hospital *for the aggregate mechanism*, under the trust assumption of docs/privacy.md:
at least ``min_honest`` (h) hospitals add their noise share honestly and survive the round.
Each hospital adds Sk(μ/h) with μ = (σ·C·s)², so h honest shares carry the whole noise; the
others' shares are over-noise. :func:`check_configuration` refuses, with every reason at once,
a configuration that cannot keep that promise; :func:`check_share` refuses a hospital whose
declared share (mechanism, σ, h, C, q, variance) differs from the policy.

The server runs :func:`share_problems` on every declared share through
:func:`clinograph.secure.dp_checks.share_problems`, with the declaration's scale replaced by the
scale the round's signed plan publishes (a mismatch is refused there); hospitals run
:func:`check_share` on their own declaration before releasing anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clinograph.core.errors import ConfigError, ProtocolError

from ..hazmat.fixedpoint import HALF
from .skellam import SkellamRound, epsilon

MECHANISMS = ("skellam",)
#: tail multiple for the ring check: P(|Sk| > 12·sqrt(μ)) < 1e-30 per coordinate (Gaussian-like tail)
TAIL_STDS = 12.0
#: relative tolerance of the share comparisons (floats travel as JSON numbers)
RTOL = 1e-9
#: largest δ a distributed-DP promise may carry: δ is the probability the ε bound may fail
#: outright, and must stay far below 1/patients (the usual δ is 1e-5)
MAX_DELTA = 1e-3


@dataclass(frozen=True)
class DistributedPolicy:
    """What the federation's ``[dp_policy]`` declares for distributed DP (see module docstring)."""

    mechanism: str
    noise_multiplier: float  # σ of the aggregate over the honest set, relative to C
    clip_norm: float  # C, every hospital's per-patient L2 clip
    sample_rate: float  # q, every hospital's Poisson rate
    min_honest: int  # h
    rounds: int  # rounds the ε promise covers
    max_epsilon: float
    delta: float

    def share_variance(self, scale: float) -> float:
        """The Skellam variance per coordinate each hospital adds at ring scale ``scale``: μ/h."""
        return (self.noise_multiplier * self.clip_norm * scale) ** 2 / self.min_honest

    def round_mechanism(self, *, scale: float, dim: int) -> SkellamRound:
        """The aggregate mechanism of one round (h honest shares)."""
        return SkellamRound(self.sample_rate, self.noise_multiplier, self.clip_norm, scale, dim)

    def epsilon(self, *, scale: float, dim: int, rounds: int | None = None) -> float:
        """ε at δ after ``rounds`` (default: all planned) rounds at ring scale ``scale``."""
        return epsilon([(self.round_mechanism(scale=scale, dim=dim), self.rounds if rounds is None else rounds)],
                       delta=self.delta)


@dataclass(frozen=True)
class ShareDeclaration:
    """What a hospital declares about the share it added in one round (signed with its report)."""

    mechanism: str
    noise_multiplier: float
    min_honest: int
    clip_norm: float
    sample_rate: float
    scale: float
    share_variance: float


def share_problems(policy: DistributedPolicy, share: ShareDeclaration) -> list[str]:
    """Every way ``share`` differs from ``policy`` (empty: it conforms)."""
    out = []

    def off(a: float, b: float) -> bool:
        return not math.isclose(a, b, rel_tol=RTOL, abs_tol=0.0)

    if share.mechanism != policy.mechanism:
        out.append(f"mechanism {share.mechanism!r} is not the federation's {policy.mechanism!r}")
    if share.min_honest != policy.min_honest:
        out.append(f"minimum honest set {share.min_honest} is not the federation's {policy.min_honest}")
    if off(share.noise_multiplier, policy.noise_multiplier):
        out.append(f"noise multiplier {share.noise_multiplier:g} is not the federation's {policy.noise_multiplier:g}")
    if off(share.clip_norm, policy.clip_norm):
        out.append(f"clip norm {share.clip_norm:g} is not the federation's {policy.clip_norm:g}")
    if off(share.sample_rate, policy.sample_rate):
        out.append(f"sample rate {share.sample_rate:g} is not the federation's {policy.sample_rate:g}")
    if not (share.scale > 0 and math.isfinite(share.scale)):
        out.append(f"ring scale {share.scale!r} is not a finite number > 0")
    else:
        want = policy.share_variance(share.scale)
        if off(share.share_variance, want):
            out.append(f"noise share variance {share.share_variance:.6g} is not μ/h = {want:.6g} at scale "
                       f"{share.scale:.6g}")
    return out


def check_share(policy: DistributedPolicy, share: ShareDeclaration) -> None:
    """Raise ProtocolError listing every way ``share`` differs from ``policy``."""
    problems = share_problems(policy, share)
    if problems:
        raise ProtocolError("Noise share breaks the distributed-DP policy: " + "; ".join(problems) + ".")


def ring_headroom(*, policy: DistributedPolicy, scale: float, hospital_bound: float, max_batch: float) -> float:
    """How much of one hospital's masked range (``hospital_bound`` = masked.clip, float units) its
    noisy sum can use: (max_batch·(C + 1/s) + TAIL_STDS·sqrt(μ/h)/s) / hospital_bound. Must be <= 1.

    Within the bound, the masked mode's eq. (1) (:mod:`clinograph.secure.hazmat.fixedpoint`)
    makes every sum of the round's hospitals wrap-free; a value outside it is refused by the
    masked client (never wrapped), so the ring can only fail loudly, with probability below
    d·1e-30 a round from the noise tail."""
    signal = max_batch * (policy.clip_norm + 1.0 / scale)
    noise = TAIL_STDS * math.sqrt(policy.share_variance(scale)) / scale
    return (signal + noise) / hospital_bound


def check_configuration(policy: DistributedPolicy, *, n_hospitals: int, masked_threshold: int, scale: float,
                        hospital_bound: float, max_batch: float, dim: int, planned_rounds: int | None = None) -> float:
    """Refuse (ConfigError, every reason at once) a configuration that cannot give the promised
    guarantee; return the promised ε over ``policy.rounds`` rounds.

    Args:
        n_hospitals: hospitals in the federation. masked_threshold: the masked mode's t.
        scale: the masked ring's fixed-point scale for a round with all hospitals (the smallest).
        hospital_bound: masked.clip, the bound on one hospital's weighted values (float units).
        max_batch: a public bound on any hospital's Poisson batch (e.g. the weight cap).
        dim: coordinates released per round.
        planned_rounds: the rounds the federation will run ([federation] rounds), if known; more
            than ``policy.rounds`` would outrun the ε promise.
    """
    problems = []
    if not (math.isfinite(policy.max_epsilon) and policy.max_epsilon > 0):
        problems.append(f"max_epsilon = {policy.max_epsilon!r} must be a finite number > 0")
    if not 0 < policy.delta <= MAX_DELTA:
        problems.append(f"δ = {policy.delta:g} must be in (0, {MAX_DELTA:g}]: δ is the probability that the ε bound "
                        "fails outright and must stay far below 1/patients (use 1e-5 or less)")
    if policy.rounds < 1:
        problems.append(f"rounds = {policy.rounds} must be >= 1")
    if planned_rounds is not None and planned_rounds > policy.rounds:
        problems.append(f"the federation plans {planned_rounds} rounds but the ε promise covers [dp_policy] rounds = "
                        f"{policy.rounds}; set rounds >= {planned_rounds} there (and recheck ε) or plan fewer rounds")
    if policy.mechanism not in MECHANISMS:
        problems.append(f"mechanism {policy.mechanism!r} is not implemented (registered: {', '.join(MECHANISMS)})")
    if not 1 <= policy.min_honest <= n_hospitals:
        problems.append(f"min_honest = {policy.min_honest} must be between 1 and the {n_hospitals} hospitals")
    if policy.min_honest == 1:
        problems.append("min_honest = 1 trusts any single surviving hospital with the whole noise: that is local "
                        "DP's noise at every hospital's cost; use min_honest >= 2 or mode = 'local'")
    if masked_threshold < policy.min_honest:
        problems.append(f"the masked threshold t = {masked_threshold} is below min_honest = {policy.min_honest}: a "
                        f"round with {masked_threshold} survivors would release a sum with fewer than h honest "
                        "noise shares. Set [federation] masked_threshold >= min_honest")
    if not (0 < policy.sample_rate <= 1):
        problems.append(f"sample rate {policy.sample_rate} must be in (0, 1]")
    if not policy.noise_multiplier > 0:
        problems.append("noise multiplier must be > 0")
    eps = math.inf
    if not problems:
        eps = policy.epsilon(scale=scale, dim=dim)
        if eps > policy.max_epsilon:
            problems.append(f"{policy.rounds} rounds at σ = {policy.noise_multiplier:g}, q = {policy.sample_rate:g} "
                            f"give ε = {eps:.3f} > max_epsilon = {policy.max_epsilon:g} at δ = {policy.delta:g}")
        use = ring_headroom(policy=policy, scale=scale, hospital_bound=hospital_bound, max_batch=max_batch)
        if use > 1:
            problems.append(f"the 2^32 ring is too small: a hospital's noisy sum may reach {use:.2f}x its masked "
                            f"range (masked.clip = {hospital_bound:g}); raise [federation] masked_clip or lower "
                            "max_weight")
        inflation = math.sqrt(dim) / (policy.clip_norm * scale)
        if inflation > 0.1:
            problems.append(f"the ring's scale s = {scale:.4g} is too coarse for C = {policy.clip_norm:g} over {dim} "
                            f"coordinates: rounding adds {100 * inflation:.0f}% to the sensitivity (sqrt(d)/(C·s) "
                            "must be <= 0.1); lower [federation] masked_clip or max_weight, or raise the clip")
        if scale * hospital_bound * n_hospitals >= HALF:
            problems.append("the masked scale lets the hospitals' sum wrap the ring")
    if problems:
        raise ConfigError("The distributed-DP policy cannot give its guarantee: " + "; ".join(problems) + ".")
    return eps
