"""FedOpt (FedAdam / FedYogi) against a hand-rolled numpy reference; FedProx's plan option; the registry."""

import numpy as np
import pytest
from clinograph.secure.aggregation.base import ModuleSums
from clinograph.secure.strategies import create_strategy, registered_strategies
from clinograph.secure.strategies.fedopt import FedAdam, FedYogi

from clinograph.core.errors import ConfigError, RegistryError


def reference(variant, x0, pseudo_grads, *, eta, b1, b2, tau):
    """Reddi et al. 2020, Algorithm 2, written out independently (Δ_t = mean(x_i) − x)."""
    x = x0.copy()
    m = np.zeros_like(x)
    v = np.full_like(x, tau * tau)
    for d in pseudo_grads:
        m = b1 * m + (1 - b1) * d
        if variant == "adam":
            v = b2 * v + (1 - b2) * d * d
        else:
            v = v - (1 - b2) * d * d * np.sign(v - d * d)
        x = x + eta * m / (np.sqrt(v) + tau)
    return x


@pytest.mark.parametrize("cls,variant", [(FedAdam, "adam"), (FedYogi, "yogi")])
def test_fedopt_matches_the_numpy_reference_over_rounds(cls, variant):
    rng = np.random.default_rng(0)
    x0 = rng.normal(size=5)
    strat = cls(server_lr=0.1, beta1=0.9, beta2=0.99, tau=1e-3)
    state = {"w": x0.copy()}
    pseudo = []
    for _ in range(6):
        client_models = state["w"] + rng.normal(scale=0.3, size=(3, 5))
        weights = np.array([2.0, 1.0, 1.0])
        deltas = state["w"] - client_models  # NS-FL sign: Δθ_i = θ − θ'_i
        sums = ModuleSums(sums={"w": (weights[:, None] * deltas).sum(0)}, weights={"w": weights.sum()},
                          counts={"w": 3}, contributors=("a", "b", "c"))
        pseudo.append((weights[:, None] * client_models).sum(0) / weights.sum() - state["w"])
        state = strat.apply(state, sums)
    expected = reference(variant, x0, pseudo, eta=0.1, b1=0.9, b2=0.99, tau=1e-3)
    assert state["w"] == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_fedopt_keeps_untrained_modules_and_their_moments():
    s = create_strategy("fedyogi")
    state = {"a": np.zeros(2), "b": np.ones(3)}
    sums = ModuleSums(sums={"a": np.array([0.2, -0.2])}, weights={"a": 1.0}, counts={"a": 1}, contributors=("x",))
    out = s.apply(state, sums)
    assert np.array_equal(out["b"], state["b"]) and "b" not in s.m
    assert not np.array_equal(out["a"], state["a"])


def test_fedopt_is_deterministic_for_hospitals_applying_it_themselves():
    sums = ModuleSums(sums={"a": np.array([0.3, -0.1])}, weights={"a": 2.0}, counts={"a": 2}, contributors=("x", "y"))
    outs = [create_strategy("fedopt").apply({"a": np.array([1.0, 1.0])}, sums)["a"] for _ in range(2)]
    assert np.array_equal(outs[0], outs[1])


def test_fedopt_rejects_bad_hyperparameters_all_at_once():
    with pytest.raises(ConfigError, match=r"server_lr must be > 0.*beta2 must be in \[0, 1\)"):
        create_strategy("fedadam", server_lr=0.0, beta2=1.0)


def test_fedprox_carries_mu_in_the_plan_and_averages_like_fedavg():
    s = create_strategy("fedprox", mu=0.1)
    assert s.plan_options() == {"fedprox.mu": 0.1}
    sums = ModuleSums(sums={"a": np.array([2.0])}, weights={"a": 4.0}, counts={"a": 2}, contributors=("x", "y"))
    assert s.apply({"a": np.array([1.0])}, sums)["a"] == pytest.approx([0.5])
    with pytest.raises(ConfigError, match="mu must be >= 0"):
        create_strategy("fedprox", mu=-1)


def test_every_strategy_is_registered_and_a_miss_lists_them():
    assert {"fedavg", "fedsgd", "fedprox", "fedopt", "fedadam", "fedyogi", "dq_weighted"} <= set(registered_strategies())
    with pytest.raises(RegistryError, match=r"Unknown aggregator 'fedavgg'\. Registered: .*dag_voting, dq_weighted, fedadam"):
        create_strategy("fedavgg")
    required = {"dag_voting": {"concepts": ["a", "b"]}}  # DAG voting needs its concept list (no silent default)
    needs_files = {"fednsl_rules"}  # built from a pinned rule-space file: tests/sdk/fednsl covers it
    for name in sorted(set(registered_strategies()) - needs_files):
        assert create_strategy(name, **required.get(name, {})).name == name  # constructible by name


@pytest.mark.parametrize(("name", "options", "takes"), [("fedprox", {"lr": 3}, "It takes: mu."),
                                                       ("fedavg", {"mu": 0.1}, "It takes no options.")])
def test_an_option_a_strategy_does_not_take_is_refused_with_the_ones_it_does(name, options, takes):
    from clinograph.secure.strategies import create_strategy

    from clinograph.core.errors import RegistryError

    with pytest.raises(RegistryError, match=rf"Bad options for aggregator '{name}' \(\[federation\] strategy_options\)"
                                            rf".*{takes}"):
        create_strategy(name, **options)


def test_options_of_the_wrong_type_are_all_named_with_what_is_expected():
    """A quoted number reached the strategy: FedOpt compared it (Python's "'>' not supported between
    instances of 'str' and 'int'"), FedProx's float() raised a bare ValueError; a bool passed as 1.0."""
    from clinograph.secure.strategies import create_strategy

    from clinograph.core.errors import RegistryError

    with pytest.raises(RegistryError) as err:
        create_strategy("fedadam", server_lr="0.5", beta1=True, tau=1e-3)
    said = str(err.value)
    assert "server_lr = '0.5' (str), expected float" in said and "beta1 = True (bool), expected float" in said
    assert "not supported" not in said and "tau" not in said
    with pytest.raises(RegistryError, match=r"mu = 'x' \(str\), expected float"):
        create_strategy("fedprox", mu="x")
    assert create_strategy("fedprox", mu=1).mu == 1.0  # an int is a number
