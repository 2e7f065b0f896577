"""NS-FL eq. (6), module-wise (F-CMs 4.2.3)."""

import numpy as np
import pytest
from clinograph.secure.aggregation import ModuleSums
from clinograph.secure.strategies import FedAvg, FedSGD, create_strategy

from clinograph.core.errors import RegistryError


def sums(**mods):
    return ModuleSums(sums={k: np.asarray(v[0], float) for k, v in mods.items()},
                      weights={k: v[1] for k, v in mods.items()}, counts={k: 1 for k in mods}, contributors=("a",))


def test_eq6_with_server_learning_rate_over_contributors_only():
    state = {"a": np.array([1.0, 1.0]), "b": np.array([5.0]), "untouched": np.array([7.0])}
    # a: two hospitals, n=30 and n=10, deltas [1,2] and [3,4] -> weighted sum 30*[1,2]+10*[3,4]
    s = sums(a=([60.0, 100.0], 40.0), b=([20.0], 10.0))
    new = FedSGD(server_lr=0.5).apply(state, s)
    np.testing.assert_allclose(new["a"], [1 - 0.5 * 1.5, 1 - 0.5 * 2.5])
    np.testing.assert_allclose(new["b"], [5 - 0.5 * 2.0])
    np.testing.assert_array_equal(new["untouched"], [7.0])
    assert state["a"][0] == 1.0  # input not modified


def test_fedavg_is_the_weighted_mean_of_local_models():
    state = {"a": np.array([1.0])}
    # local models 0.0 (n=3) and 2.0 (n=1): deltas 1.0 and -1.0 -> sum 3*1 + 1*(-1) = 2, weights 4
    new = FedAvg().apply(state, sums(a=([2.0], 4.0)))
    np.testing.assert_allclose(new["a"], [0.5])


def test_registry_miss_lists_the_options():
    with pytest.raises(RegistryError, match=r"Unknown aggregator 'fedavgg'. Registered: .*fedavg.*fedsgd"):
        create_strategy("fedavgg")
    with pytest.raises(Exception, match="server_lr must be > 0"):
        create_strategy("fedsgd", server_lr=0)
