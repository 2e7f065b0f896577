"""bnlearn networks from pgmpy's shipped files (F-CMs appendix B.1, Table 2)."""

from __future__ import annotations

import numpy as np
import pytest
from clinograph.sdk.datasets import bnlearn

from clinograph.core.errors import ConfigError

TABLE2 = {"asia": (8, 8), "sachs": (11, 17), "alarm": (37, 46), "insurance": (27, 52), "hailfinder": (56, 66)}


@pytest.mark.parametrize("name", sorted(TABLE2))
def test_networks_match_table2_and_sample(name):
    model = bnlearn.load_network(name)
    assert (len(model.nodes()), len(model.edges())) == TABLE2[name]
    assert bnlearn.TASKS[name] in model.nodes()
    df = bnlearn.sample_network(name, 200, seed=1)
    assert df.shape == (200, TABLE2[name][0]) and list(df.columns) == bnlearn.topological_nodes(name)
    states = bnlearn.network_states(name)
    assert all(set(df[c]) <= set(states[c]) for c in df.columns)
    assert df.equals(bnlearn.sample_network(name, 200, seed=1))


def test_asia_marginals_follow_the_cpds():
    df = bnlearn.sample_network("asia", 20000, seed=0)
    # P(smoke=yes) = 0.5, P(asia=yes) = 0.01, P(lung=yes) = 0.055 (bnlearn Asia CPDs)
    assert abs((df["smoke"] == "yes").mean() - 0.5) < 0.02
    assert abs((df["asia"] == "yes").mean() - 0.01) < 0.004
    assert abs((df["lung"] == "yes").mean() - 0.055) < 0.01
    # tub and lung both drive "either" (a logical OR in the CPD)
    either = (df["tub"] == "yes") | (df["lung"] == "yes")
    assert ((df["either"] == "yes") == either).all()


def test_featurise_and_split():
    states = bnlearn.network_states("asia")
    codes = bnlearn.encode_states(bnlearn.sample_network("asia", 600, 0), states)
    x = bnlearn.featurise(codes, [2] * codes.shape[1], latent_dim=8, seed=0, epochs=2)
    assert x.shape == (600, 8) and x.dtype == np.float32
    np.testing.assert_allclose(x.mean(0), 0, atol=1e-4)
    np.testing.assert_allclose(x.std(0), 1, atol=1e-3)
    tr, va, te = bnlearn.split_indices(1000, 0)
    assert (len(tr), len(va), len(te)) == (700, 100, 200)
    assert len(set(tr) | set(va) | set(te)) == 1000


def test_unknown_network_is_listed():
    with pytest.raises(ConfigError, match="Available: alarm, asia, hailfinder, insurance, sachs"):
        bnlearn.load_network("asai")


def test_mix_noise_signal_scale_sets_the_signal_to_noise_ratio():
    z = np.random.default_rng(3).normal(0.0, 0.3, size=(4000, 4)) + 5.0

    def corr(x):  # per-dimension correlation between the input and its latent
        return np.mean([np.corrcoef(x[:, j], z[:, j])[0, 1] for j in range(z.shape[1])])

    natural = bnlearn.mix_noise(z, seed=0)
    weak, strong = (bnlearn.mix_noise(z, seed=0, signal_scale=s) for s in (0.3, 3.0))
    # a unit-variance signal times s against unit noise: corr = s / sqrt(1 + s^2)
    assert abs(corr(weak) - 0.3 / np.sqrt(1.09)) < 0.03
    assert abs(corr(strong) - 3.0 / np.sqrt(10.0)) < 0.03
    assert abs(corr(natural) - 0.3 / np.sqrt(1.09)) < 0.03  # z's own std is 0.3 here
    for x in (natural, weak, strong):
        np.testing.assert_allclose(x.std(0), 1, atol=1e-3)


@pytest.mark.parametrize("kw", [{"signal_scale": 0.0}, {"signal_scale": -1.0}, {"noise_mix": 1.5}])
def test_mix_noise_rejects_bad_settings(kw):
    with pytest.raises(ConfigError, match="mix_noise needs"):
        bnlearn.mix_noise(np.zeros((10, 2)), seed=0, **kw)


def test_featurise_is_autoencode_then_mix_noise():
    states = bnlearn.network_states("asia")
    codes = bnlearn.encode_states(bnlearn.sample_network("asia", 300, 1), states)
    z = bnlearn.autoencode(codes, [2] * codes.shape[1], latent_dim=4, seed=1, epochs=1)
    np.testing.assert_array_equal(
        bnlearn.featurise(codes, [2] * codes.shape[1], latent_dim=4, seed=1, epochs=1, signal_scale=0.5),
        bnlearn.mix_noise(z, seed=1, signal_scale=0.5))


def test_every_network_has_a_calibrated_signal_scale():
    assert set(bnlearn.SIGNAL_SCALE) == set(bnlearn.TASKS)
    assert set(bnlearn.SIGNAL_SCALE_CONCEPTS) <= set(bnlearn.TASKS)
    assert all(0 < s < 5 for s in [*bnlearn.SIGNAL_SCALE.values(), *bnlearn.SIGNAL_SCALE_CONCEPTS.values()])
