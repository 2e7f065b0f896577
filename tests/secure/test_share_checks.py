"""The server's checks of a hospital's declared distributed-DP share (secure/dp_checks.py):
every number is the server's own -- the plan's published scale, the spec's released dimension,
the policy's σ, q, C and h -- never the share's declaration of it.

Before: the Skellam floors of ε and epsilon_alone were computed at the declared scale and
dimension (a share accounted over one coordinate understated ε by up to 15 % at the coarsest
allowed ring and went through), a share in a federation without distributed DP was never
looked at, and a distributed round declaring zero steps never raised the floors."""

from __future__ import annotations

import pytest
from clinograph.secure.dp import SkellamRound, epsilon
from clinograph.secure.dp_checks import Published, check_ledger, distributed_policy, share_problems
from clinograph.secure.messages import DistributedDP, DistributedShare, DPPolicy, LedgerEntry

SIGMA, Q, H, DELTA = 1.0, 0.2, 2, 1e-5
POLICY = DPPolicy(required=True, max_epsilon=50.0, delta=DELTA, min_noise_multiplier=0.0, max_clip_norm=1.0,
                  distributed=DistributedDP(mechanism="skellam", noise_multiplier=SIGMA, sample_rate=Q, min_honest=H,
                                            rounds=100))
#: the coarsest ring check_configuration allows at d = 10^4 (sqrt(d)/(C·s) = 0.1)
PUBLISHED = Published(scale=1000.0, dim=10_000)


def _eps(*, sigma: float = SIGMA, scale: float = PUBLISHED.scale, dim: int = PUBLISHED.dim, rounds: int = 1) -> float:
    return epsilon([(SkellamRound(Q, sigma, 1.0, scale, dim), rounds)], delta=DELTA)


def _entry(*, scale: float = PUBLISHED.scale, dim: int = PUBLISHED.dim, variance: float | None = None,
           steps: int = 1, eps: float | None = None, alone: float | None = None, round_: int = 0) -> LedgerEntry:
    at = (scale, dim)
    share = DistributedShare(mechanism="skellam", min_honest=H, scale=scale,
                             share_variance=(SIGMA * scale) ** 2 / H if variance is None else variance, dim=dim,
                             epsilon_alone=_eps(sigma=SIGMA / H ** 0.5, scale=at[0], dim=at[1]) if alone is None else alone)
    return LedgerEntry(round=round_, noise_multiplier=SIGMA, sample_rate=Q, steps=steps, clip_norm=1.0,
                       accountant="skellam-h2", epsilon=_eps(scale=at[0], dim=at[1]) if eps is None else eps,
                       delta=DELTA, budget_epsilon=50.0, share=share)


def _problems(entry: LedgerEntry, policy: DPPolicy = POLICY) -> list[str]:
    return share_problems(entry, policy=policy, published=PUBLISHED) + check_ledger(
        entry, previous=None, policy=policy, published=PUBLISHED)[0]


def test_an_honest_share_conforms():
    assert _problems(_entry()) == []
    assert distributed_policy(POLICY).share_variance(PUBLISHED.scale) == pytest.approx((SIGMA * 1000.0) ** 2 / H)


def test_a_share_declared_at_a_millionth_of_the_published_scale_is_refused():
    """Consistent with itself (μ/h at its own scale), a millionth of the noise in the ring."""
    problems = _problems(_entry(scale=PUBLISHED.scale * 1e-6))
    assert any("declared at ring scale 0.001" in p and "publishes masked.scale = 1000" in p and
               "compute the share at the plan's masked.scale" in p for p in problems)
    assert any("noise share variance" in p and "at scale 1000" in p for p in problems)


def test_a_share_variance_too_small_at_the_published_scale_is_refused():
    problems = _problems(_entry(variance=(SIGMA * PUBLISHED.scale) ** 2 / H / 4))
    assert len(problems) == 1 and "noise share variance" in problems[0] and "is not μ/h" in problems[0]


def test_a_share_accounted_over_fewer_coordinates_is_refused_and_its_floor_is_the_servers():
    # accounted (consistently) over one coordinate: ε 15 % lower at this ring
    low = _entry(dim=1)
    assert low.epsilon < 0.9 * _eps()
    problems = _problems(low)
    assert any("accounted over 1 coordinates, but the model spec releases 10000" in p for p in problems)
    assert any(p.startswith("ε = ") and "is below" in p for p in problems)
    assert any(p.startswith("epsilon_alone = ") and "is below" in p for p in problems)


def test_a_wrong_epsilon_alone_is_refused_and_an_overstated_one_is_not():
    honest = _eps(sigma=SIGMA / H ** 0.5)
    assert [p for p in _problems(_entry(alone=honest * 0.99)) if "epsilon_alone" in p]
    assert _problems(_entry(alone=honest * (1 - 1e-7))) == []  # within the argued tolerance
    assert _problems(_entry(alone=honest * 2)) == []  # conservative: the hospital's own choice


def test_floors_accumulate_over_rounds_and_a_round_of_zero_steps_is_refused():
    problems, track = check_ledger(_entry(), previous=None, policy=POLICY, published=PUBLISHED)
    assert problems == []
    second = _entry(round_=1, eps=_eps(), alone=_eps(sigma=SIGMA / H ** 0.5))  # ε of one round, declared for two
    problems, _ = check_ledger(second, previous=track, policy=POLICY, published=PUBLISHED)
    assert any(p.startswith("ε = ") and "is below" in p for p in problems)
    problems, _ = check_ledger(_entry(round_=1, steps=0, eps=_eps(), alone=_eps(sigma=SIGMA / H ** 0.5)),
                               previous=track, policy=POLICY, published=PUBLISHED)
    assert any("one DP-SGD step" in p for p in problems)


def test_a_share_in_a_federation_without_distributed_dp_is_refused():
    local = POLICY.model_copy(update={"distributed": None})
    assert any("has no distributed DP" in p for p in _problems(_entry(), local))


def test_a_plan_without_a_published_scale_refuses_every_share():
    problems = share_problems(_entry(), policy=POLICY, published=Published(scale=None, dim=PUBLISHED.dim))
    assert problems and "publishes no masked.scale" in problems[0]
