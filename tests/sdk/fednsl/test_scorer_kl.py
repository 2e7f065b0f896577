"""FedNSL E-step KL term: its weight against the total log-likelihood (eq. 3), its two directions (eqs. 2, 11)."""

from __future__ import annotations

import numpy as np
import pytest
from clinograph.sdk.fednsl import ScorerSettings
from clinograph.sdk.fednsl.scorer import fit_head

from clinograph.core.errors import ConfigError


def _data(n: int = 300, seed: int = 0):
    """Rule 0 fires on positives; rule 1 never fires here (a rule another hospital's subgroup holds); rule 2 noise."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.3).astype(int)
    values = np.stack([np.where(y == 1, 0.9, 0.05), np.zeros(n), rng.random(n)], axis=1)
    return values, y


LOG_PRIOR = np.log(np.array([0.2, 0.6, 0.2]))


def _fit(values, y, **kw):
    return fit_head(values, y, LOG_PRIOR, candidates=np.arange(3), settings=ScorerSettings(steps=60, **kw))


def test_kl_weight_counts_once_per_hospital_not_once_per_patient():
    values, y = _data()
    once = _fit(values, y, kl_weight=1.0)
    # the same patients twice: the likelihood sum doubles, so λ = 2 is the same trade-off as λ = 1
    twice = _fit(np.tile(values, (2, 1)), np.tile(y, 2), kl_weight=2.0)
    assert np.allclose(once.posterior, twice.posterior, atol=1e-9)
    # and it is not the old per-patient weighting (λ against the mean), which pins the posterior to the prior
    stronger = _fit(values, y, kl_weight=1.0 * len(y))
    assert stronger.kl < once.kl


@pytest.mark.parametrize("direction", ["posterior_prior", "prior_posterior"])
def test_both_kl_directions_keep_mass_on_a_rule_no_local_patient_fired(direction):
    values, y = _data()
    free = _fit(values, y, kl_weight=0.0)
    held = _fit(values, y, kl_weight=300.0, kl_direction=direction)
    assert held.posterior[1] > free.posterior[1]
    assert held.kl < free.kl and held.posterior.sum() == pytest.approx(1.0)


def test_scorer_settings_refuse_an_unknown_direction_and_a_negative_weight():
    with pytest.raises(ConfigError, match="kl_direction is 'reverse'.*'posterior_prior'"):
        ScorerSettings(kl_direction="reverse")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"kl_weight \(λ of eq. 2\) is -1"):
        ScorerSettings(kl_weight=-1.0)
