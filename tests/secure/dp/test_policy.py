"""Distributed-DP policy checks: a share or configuration that cannot keep the promise is refused."""

from __future__ import annotations

import dataclasses

import pytest
from clinograph.secure.dp import (
    DistributedPolicy,
    ShareDeclaration,
    check_configuration,
    check_share,
)
from clinograph.secure.runtime.config import DPPolicySection

from clinograph.core.errors import ConfigError, ProtocolError

SCALE = 13421.0
POLICY = DistributedPolicy(mechanism="skellam", noise_multiplier=1.0, clip_norm=1.0, sample_rate=0.1, min_honest=2,
                           rounds=50, max_epsilon=10.0, delta=1e-5)


def _share(**kw) -> ShareDeclaration:
    base = ShareDeclaration(mechanism="skellam", noise_multiplier=1.0, min_honest=2, clip_norm=1.0, sample_rate=0.1,
                            scale=SCALE, share_variance=POLICY.share_variance(SCALE))
    return dataclasses.replace(base, **kw)


def test_a_conforming_share_passes_and_each_share_is_half_the_variance():
    check_share(POLICY, _share())
    assert POLICY.share_variance(SCALE) == pytest.approx((1.0 * 1.0 * SCALE) ** 2 / 2)


@pytest.mark.parametrize(("change", "message"), [
    ({"share_variance": POLICY.share_variance(SCALE) / 2}, "noise share variance"),
    ({"clip_norm": 2.0}, "clip norm 2 is not the federation's 1"),
    ({"noise_multiplier": 0.5}, "noise multiplier 0.5"),
    ({"min_honest": 3}, "minimum honest set 3"),
    ({"sample_rate": 0.2}, "sample rate 0.2"),
    ({"mechanism": "gaussian"}, "mechanism 'gaussian'"),
])
def test_a_share_differing_from_the_policy_is_refused(change, message):
    with pytest.raises(ProtocolError, match=message):
        check_share(POLICY, _share(**change))


def test_every_problem_is_listed_at_once():
    with pytest.raises(ProtocolError, match="clip norm.*sample rate"):
        check_share(POLICY, _share(clip_norm=3.0, sample_rate=0.5))


def _check(policy=POLICY, **kw):
    args = {"n_hospitals": 4, "masked_threshold": 2, "scale": SCALE, "hospital_bound": 40000.0,
            "max_batch": 10000.0, "dim": 800}
    return check_configuration(policy, **{**args, **kw})


def test_a_sound_configuration_returns_its_promised_epsilon():
    assert 0 < _check() <= 10.0


@pytest.mark.parametrize(("policy_change", "kw", "message"), [
    ({}, {"masked_threshold": 1}, "masked threshold t = 1 is below min_honest = 2"),
    ({"min_honest": 5}, {}, "min_honest = 5 must be between 1 and the 4 hospitals"),
    ({"min_honest": 1}, {}, "min_honest = 1 trusts any single"),
    ({"noise_multiplier": 0.3, "rounds": 500}, {}, r"give ε = .* > max_epsilon = 10"),
    ({}, {"hospital_bound": 4000.0}, "the 2\\^32 ring is too small"),
])
def test_configurations_that_cannot_keep_the_promise_are_refused(policy_change, kw, message):
    with pytest.raises(ConfigError, match=message):
        _check(dataclasses.replace(POLICY, **policy_change), **kw)


def test_dp_policy_section_builds_the_policy_or_names_what_is_missing():
    sec = DPPolicySection(mode="distributed", noise_multiplier=1.0, sample_rate=0.1, min_honest=2, rounds=50)
    assert sec.distributed() == POLICY
    with pytest.raises(ConfigError, match="needs sample_rate, min_honest, rounds"):
        DPPolicySection(mode="distributed", noise_multiplier=1.0).distributed()
    assert DPPolicySection().mode == "local"  # additive: the default is today's local DP


@pytest.mark.parametrize(("policy_change", "kw", "message"), [
    ({"delta": 0.01}, {}, r"δ = 0.01 must be in \(0, 0.001\]: δ is the probability that the ε bound fails outright"),
    ({"max_epsilon": float("inf")}, {}, "max_epsilon = inf must be a finite number > 0"),
    ({}, {"planned_rounds": 80}, "the federation plans 80 rounds but the ε promise covers \\[dp_policy\\] rounds = 50"),
    ({}, {"scale": 50.0, "hospital_bound": 40000.0}, r"the ring's scale s = 50 is too coarse .* rounding adds 57%"),
])
def test_more_configurations_that_cannot_keep_the_promise_are_refused(policy_change, kw, message):
    with pytest.raises(ConfigError, match=message):
        _check(dataclasses.replace(POLICY, **policy_change), **kw)


def test_planned_rounds_within_the_promise_pass():
    assert _check(planned_rounds=50) == _check()
