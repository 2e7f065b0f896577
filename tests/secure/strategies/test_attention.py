"""insecure_attention (FedAtt, server-side, plaintext only) and agat_secure_attention."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from clinograph.secure.aggregation.base import ModuleSums
from clinograph.secure.policy import InsecureOptionWarning
from clinograph.secure.strategies import create_strategy, registered_strategies
from clinograph.secure.strategies.attention import (
    ATTENTION_OPTION,
    MAX_LOGIT_OPTION,
    InsecureAttention,
    PlaintextUpdateTap,
    attention_weight,
    check_secure_mode,
    softmax,
)

from clinograph.core.errors import ConfigError, ProtocolError
from clinograph.core.identity import Identity


def quiet_insecure(**kw) -> InsecureAttention:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureOptionWarning)
        return create_strategy("insecure_attention", **kw)  # type: ignore[return-value]


def test_both_are_registered():
    assert {"insecure_attention", "agat_secure_attention"} <= set(registered_strategies())


@pytest.mark.parametrize("mode", ["masked", "ckks"])
def test_insecure_attention_is_refused_under_secure_modes_by_name_with_the_reason(mode):
    with pytest.raises(ConfigError, match=rf"strategy = 'insecure_attention' is refused under secure_mode = '{mode}'"
                                          r".*individual update.*agat_secure_attention"):
        check_secure_mode("insecure_attention", mode)
    server = Identity.generate("server")
    with pytest.raises(ConfigError, match="insecure_attention"):
        PlaintextUpdateTap(object(), strategy=quiet_insecure(), secure_mode=mode, server=server.public, enrolled={})


def test_the_check_lets_plaintext_and_other_strategies_through():
    check_secure_mode("insecure_attention", "insecure_plaintext")
    check_secure_mode("agat_secure_attention", "masked")
    check_secure_mode("fedsgd", "ckks")


def test_insecure_attention_warns_every_time_it_is_built():
    for _ in range(2):
        with pytest.warns(InsecureOptionWarning, match="insecure_attention is in use"):
            create_strategy("insecure_attention")


def test_insecure_attention_without_individual_updates_refuses_naming_the_option():
    s = quiet_insecure()
    sums = ModuleSums(sums={"a": np.ones(2)}, weights={"a": 2.0}, counts={"a": 2}, contributors=("x", "y"))
    with pytest.raises(ConfigError, match="insecure_attention.*only aggregated sums"):
        s.apply({"a": np.zeros(2)}, sums)


def test_insecure_attention_is_fedatt_layer_wise():
    """β_k^m = softmax_k ||Δ_k^m|| per module, θ ← θ − η Σ β Δ; metric/ and AGAT's Gaussians
    (augmentation/, moment estimates: FedAtt weighted them by their distance from the global one)
    stay the weighted mean."""
    s = quiet_insecure(server_lr=0.5)
    deltas = {"x": {"a": np.array([1.0, 0.0]), "b": np.array([0.2]), "metric/validation": np.array([1.0, 2.0]),
                    "augmentation/f": np.array([0.1, -2.0])},
              "y": {"a": np.array([0.0, 3.0]), "metric/validation": np.array([3.0, 4.0]),
                    "augmentation/f": np.array([0.3, 0.5])}}
    w = {"x": 10.0, "y": 30.0}
    for c in deltas:
        s.offer_update(round_=0, client=c, weight=w[c], modules={k: w[c] * v for k, v in deltas[c].items()})
    names = ("a", "b", "metric/validation", "augmentation/f")
    sums = ModuleSums(
        sums={m: sum(w[c] * deltas[c][m] for c in deltas if m in deltas[c]) for m in names},
        weights={"a": 40.0, "b": 10.0, "metric/validation": 40.0, "augmentation/f": 40.0},
        counts={"a": 2, "b": 1, "metric/validation": 2, "augmentation/f": 2}, contributors=("x", "y"))
    state = {"a": np.zeros(2), "b": np.zeros(1), "metric/validation": np.zeros(2), "augmentation/f": np.zeros(2),
             "c": np.ones(3)}
    out = s.apply(state, sums)
    assert out["augmentation/f"] == pytest.approx(-0.5 * (10 * np.array([0.1, -2.0]) + 30 * np.array([0.3, 0.5])) / 40)
    bx, by = math.exp(1.0) / (math.exp(1.0) + math.exp(3.0)), math.exp(3.0) / (math.exp(1.0) + math.exp(3.0))
    assert out["a"] == pytest.approx(-0.5 * (bx * deltas["x"]["a"] + by * deltas["y"]["a"]))
    assert out["b"] == pytest.approx(-0.5 * deltas["x"]["b"])  # one contributor: β = 1
    assert out["metric/validation"] == pytest.approx(-0.5 * (10 * np.array([1.0, 2.0]) + 30 * np.array([3.0, 4.0])) / 40)
    assert out["c"] == pytest.approx(np.ones(3))  # nobody trained it
    assert s.history[-1]["a"] == pytest.approx({"x": bx, "y": by})


def test_insecure_attention_refuses_updates_that_do_not_add_up_to_the_aggregate():
    s = quiet_insecure()
    s.offer_update(round_=0, client="x", weight=1.0, modules={"a": np.array([1.0])})
    s.offer_update(round_=0, client="y", weight=1.0, modules={"a": np.array([1.0])})
    sums = ModuleSums(sums={"a": np.array([5.0])}, weights={"a": 2.0}, counts={"a": 2}, contributors=("x", "y"))
    with pytest.raises(ProtocolError, match="do not add up"):
        s.apply({"a": np.zeros(1)}, sums)


def test_secure_attention_tells_hospitals_the_rule_in_the_plan():
    s = create_strategy("agat_secure_attention", server_lr=0.5, max_logit=6.0)
    assert s.plan_options() == {ATTENTION_OPTION: "fedatt", MAX_LOGIT_OPTION: 6.0}
    assert s.constructor_options() == {"server_lr": 0.5, "max_logit": 6.0}
    with pytest.raises(ConfigError, match="max_logit must be in"):
        create_strategy("agat_secure_attention", max_logit=50.0)


def test_attention_weight_is_exp_of_the_capped_logit():
    assert attention_weight(1.5, max_logit=8.0) == pytest.approx(math.exp(1.5))
    assert attention_weight(30.0, max_logit=8.0) == pytest.approx(math.exp(8.0))
    assert attention_weight(-1.0, max_logit=8.0) == 1.0
    with pytest.raises(ConfigError, match="finite"):
        attention_weight(float("nan"), max_logit=8.0)
    assert sum(softmax({"a": 1000.0, "b": 1000.0}).values()) == pytest.approx(1.0)
