"""PFGL-Net DQ weighting: eqs. (3)-(5) against hand-computed values, Algorithms 1-2, one-round lag."""

import math

import numpy as np
import pytest
from clinograph.secure.aggregation.base import ModuleSums
from clinograph.secure.strategies import create_strategy
from clinograph.secure.strategies.dq import ALPHA_CAP, DQWeighted, adapt_alpha, dq_factor, smooth
from hypothesis import given, settings
from hypothesis import strategies as st

from clinograph.core.errors import ConfigError


def test_eq3_dq_factor_by_hand():
    # 0.8^2 * (1 - 0.25)^1 = 0.64 * 0.75 = 0.48
    assert dq_factor(0.8, 0.25, beta1=2.0, beta2=1.0) == pytest.approx(0.48)
    # 0.9^1 * 0.6^0.5 = 0.9 * 0.7745966692 = 0.6971370023
    assert dq_factor(0.9, 0.4, beta1=1.0, beta2=0.5) == pytest.approx(0.6971370023)
    # ablations: β2 = 0 is performance-only, β1 = 0 structure-only
    assert dq_factor(0.7, 0.9, beta1=1.0, beta2=0.0) == pytest.approx(0.7)
    assert dq_factor(0.0, 0.3, beta1=0.0, beta2=1.0) == pytest.approx(0.7)


def test_eq4_smoothing_by_hand():
    assert smooth(0.6, None, alpha=0.3) == 0.6  # Alg. 1: a new client starts at its DQ
    assert smooth(0.6, 0.2, alpha=0.3) == pytest.approx(0.3 * 0.6 + 0.7 * 0.2)  # = 0.32


def test_eq5_adaptive_alpha_and_its_cap():
    assert adapt_alpha(0.5, 0.2, eta=0.5, threshold=0.05) == pytest.approx(0.6)
    assert adapt_alpha(0.5, -0.2, eta=0.5, threshold=0.05) == pytest.approx(0.6)  # |ΔPerf|
    assert adapt_alpha(0.5, 0.04, eta=0.5, threshold=0.05) == 0.5  # below the threshold: unchanged
    assert adapt_alpha(0.85, 0.9, eta=1.0, threshold=0.0) == ALPHA_CAP == 0.9
    a = 0.1
    for _ in range(100):
        a = adapt_alpha(a, 1.0, eta=10.0, threshold=0.0)
    assert a == 0.9


def test_algorithm1_sequence_by_hand():
    s = DQWeighted(beta1=1.0, beta2=1.0, alpha=0.5, eta=0.5, perf_threshold=0.05)
    # round 0: DQ = 0.8 * (1 - 0.2) = 0.64; new client -> D = 0.64, α stays 0.5
    assert s.update_client_dq("a", 0.8, 0.2) == pytest.approx(0.64)
    assert s.alpha["a"] == 0.5
    # round 1: ΔPerf = -0.4 > 0.05 -> α = min(0.5 + 0.5*0.4, 0.9) = 0.7; DQ = 0.4*0.8 = 0.32
    # D = 0.7*0.32 + 0.3*0.64 = 0.416
    assert s.update_client_dq("a", 0.4, 0.2) == pytest.approx(0.416)
    assert s.alpha["a"] == pytest.approx(0.7)
    assert s.perf_history["a"] == [0.8, 0.4] and s.missing_history["a"] == [0.2, 0.2]
    # round 2: ΔPerf = 0.02 (below threshold) -> α stays 0.7; DQ = 0.42*0.8 = 0.336
    assert s.update_client_dq("a", 0.42, 0.2) == pytest.approx(0.7 * 0.336 + 0.3 * 0.416)


def test_weights_one_round_lag_uniform_first_then_normalised_dq():
    s = create_strategy("dq_weighted", alpha=0.5)
    parts = ("a", "b", "c")
    w0 = s.client_weights(round_=0, participants=parts)
    assert w0 == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})
    s.observe(round_=0, metrics={"a": {"perf": 0.9, "missing_rate": 0.1},
                                 "b": {"perf": 0.5, "missing_rate": 0.5},
                                 "c": {"perf": 0.6, "missing_rate": 0.0}})
    w1 = s.client_weights(round_=1, participants=parts)
    raw = {"a": 0.81, "b": 0.25, "c": 0.6}
    assert w1 == pytest.approx({k: v / sum(raw.values()) for k, v in raw.items()})
    assert sum(w1.values()) == pytest.approx(1.0)
    # weights of round 1 were fixed before round 1's metrics exist; round-1 metrics move round 2 only
    s.observe(round_=1, metrics={"a": {"perf": 0.1, "missing_rate": 0.9}})
    assert s.weights_used[1] == w1
    w2 = s.client_weights(round_=2, participants=parts)
    assert w2["a"] < w1["a"]
    assert s.weights_used == {0: w0, 1: w1, 2: w2}


def test_late_joiner_gets_the_mean_and_invalid_metrics_are_ignored_not_fatal():
    s = DQWeighted()
    s.observe(round_=0, metrics={"a": {"perf": 0.8, "missing_rate": 0.0}, "b": {"perf": 0.4, "missing_rate": 0.0},
                                 "c": {"perf": float("nan"), "missing_rate": 0.1},
                                 "d": {"perf": 1.5, "missing_rate": 0.1}, "e": {"auroc": 0.7}})
    assert set(s.smoothed) == {"a", "b"}
    assert set(s.history[-1]["ignored"]) == {"c", "d", "e"}
    w = s.client_weights(round_=1, participants=("a", "b", "new"))
    assert w["new"] == pytest.approx(0.6 / 1.8)  # mean of 0.8 and 0.4 = 0.6; total 1.8


def test_all_zero_dq_falls_back_to_uniform_via_the_floor():
    s = DQWeighted()
    s.observe(round_=0, metrics={c: {"perf": 0.0, "missing_rate": 0.5} for c in "ab"})
    assert s.client_weights(round_=1, participants=("a", "b")) == pytest.approx({"a": 0.5, "b": 0.5})


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from("abcdefgh"),
                       st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=8),
       st.integers(1, 4))
def test_weights_are_normalised_and_positive_for_any_metrics(metrics, rounds):
    s = DQWeighted(beta1=2.0, beta2=0.5)
    for r in range(rounds):
        s.observe(round_=r, metrics={c: {"perf": p, "missing_rate": m} for c, (p, m) in metrics.items()})
    w = s.client_weights(round_=rounds, participants=tuple(sorted(metrics)))
    assert math.isclose(sum(w.values()), 1.0, rel_tol=1e-9)
    assert all(v > 0 for v in w.values())
    assert all(0 < a <= ALPHA_CAP for a in s.alpha.values())


def test_apply_is_the_dq_weighted_average_of_algorithm2():
    s = DQWeighted()
    state = {"gnn": np.array([1.0, 2.0]), "head": np.array([5.0])}
    # two clients with weights 0.75 / 0.25 sent w_i * Δ_i; server divides by Σw over contributors
    d1, d2 = np.array([0.4, 0.0]), np.array([-0.4, 0.8])
    sums = ModuleSums(sums={"gnn": 0.75 * d1 + 0.25 * d2}, weights={"gnn": 1.0}, counts={"gnn": 2},
                      contributors=("a", "b"))
    out = s.apply(state, sums)
    assert out["gnn"] == pytest.approx(np.array([1.0, 2.0]) - (0.75 * d1 + 0.25 * d2))
    assert out["head"] == pytest.approx(state["head"])  # untouched (e.g. a personal module)


def test_bad_options_name_the_key_and_list_the_known_ones():
    with pytest.raises(ConfigError, match=r"alpha.*Known options: beta1, beta2, alpha, eta"):
        create_strategy("dq_weighted", alpha=0.95)  # above the paper's cap
    with pytest.raises(ConfigError, match="betta1"):
        create_strategy("dq_weighted", betta1=1.0)


def _hospital_accepts(weights: dict[str, float], *, min_clients: int, max_share: float = 0.9) -> dict[str, str]:
    """Run each participant's own check of the plan's published weights (HospitalClient._check_weights,
    the [release] max_weight_share rule); return the refusals."""
    from types import SimpleNamespace

    from clinograph.sdk.config import ReleaseSection
    from clinograph.sdk.federation.client import HospitalClient

    from clinograph.core.errors import ProtocolError

    plan = SimpleNamespace(round=3, min_clients=min_clients, participants=tuple(weights),
                           options={f"weight/{c}": w for c, w in weights.items()})
    refused = {}
    for c in weights:
        try:
            HospitalClient._check_weights(SimpleNamespace(name=c, release=ReleaseSection(max_weight_share=max_share)),
                                          plan)
        except ProtocolError as exc:
            refused[c] = str(exc)
    return refused


def test_a_hospital_at_the_dq_floor_does_not_make_the_best_one_refuse():
    """A weak hospital (F1 = 0: DQ at the floor, 1e-3) beside one at 0.8: the plain PFGL weights
    make the strong one 99.9 % of a two-hospital sum, which its own rule refuses (it then left every
    round: seen on examples/data with strategy dq_weighted). The light weight is raised to 1/9 of
    the heaviest, which keeps the order and each hospital's share of any sum the server may open <= 0.9."""
    s = DQWeighted()
    s.observe(round_=0, metrics={"a": {"perf": 0.8, "missing_rate": 0.0}, "b": {"perf": 0.0, "missing_rate": 0.0},
                                 "c": {"perf": 0.5, "missing_rate": 0.0}})
    plain = DQWeighted(max_share=1.0)
    plain.observe(round_=0, metrics={"a": {"perf": 0.8, "missing_rate": 0.0}, "b": {"perf": 0.0, "missing_rate": 0.0},
                                     "c": {"perf": 0.5, "missing_rate": 0.0}})
    assert set(_hospital_accepts(plain.client_weights(round_=1, participants=("a", "b", "c")), min_clients=2)) == {"a", "c"}
    w = s.client_weights(round_=1, participants=("a", "b", "c"), min_clients=2)
    assert _hospital_accepts(w, min_clients=2) == {}
    assert w["a"] / w["b"] == pytest.approx(9.0, rel=1e-5) and w["a"] / w["c"] == pytest.approx(0.8 / 0.5)
    assert w["a"] > w["c"] > w["b"] and math.isclose(sum(w.values()), 1.0, rel_tol=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from("abcdefgh"), st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=2, max_size=8),
       st.integers(1, 4), st.sampled_from([0.6, 0.75, 0.9]))
def test_published_dq_weights_pass_every_hospitals_share_rule(metrics, min_clients, max_share):
    min_clients = min(min_clients, len(metrics))
    s = DQWeighted(max_share=max_share)
    s.observe(round_=0, metrics={c: {"perf": p, "missing_rate": m} for c, (p, m) in metrics.items()})
    w = s.client_weights(round_=1, participants=tuple(sorted(metrics)), min_clients=min_clients)
    k = max(min_clients - 1, 1)
    if max_share >= 1 / (k + 1):  # below it even equal weights exceed the rule: nothing can pass
        assert _hospital_accepts(w, min_clients=min_clients, max_share=max_share) == {}
