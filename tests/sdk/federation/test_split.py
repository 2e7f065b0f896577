"""sdk/federation/split.py: the federation's split as public API (``cg.split_patients``)."""

from __future__ import annotations

import numpy as np
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.split import hospital_split
from sdk_helpers import small_tables

import clinograph as cg


def test_split_patients_is_public_and_is_the_federation_split():
    table = small_tables()[0]
    config = SimulationConfig.model_validate({"split": {"test_fraction": 0.3, "validation_fraction": 0.2}})
    split = cg.split_patients(table, config=config)
    assert isinstance(split, cg.Split) and cg.hospital_split is hospital_split
    ref = hospital_split(table.labels, site=table.site, test_fraction=0.3, validation_fraction=0.2,
                         seed=config.split.seed)
    for part in ("train", "validation", "test"):
        assert np.array_equal(getattr(split, part), getattr(ref, part))
    every = np.concatenate([split.train, split.validation, split.test])
    assert sorted(every.tolist()) == list(range(len(table.labels)))  # disjoint and complete
    assert "split_patients" in cg.__all__ and "split_patients" in cg.__doc__


def test_the_federation_seed_moves_the_split_and_an_explicit_split_seed_pins_it():
    table = small_tables()[0]
    a = cg.split_patients(table, config=SimulationConfig.model_validate({"federation": {"seed": 1}}))
    b = cg.split_patients(table, config=SimulationConfig.model_validate({"federation": {"seed": 2}}))
    assert not np.array_equal(a.test, b.test)
    pinned = [cg.split_patients(table, config=SimulationConfig.model_validate(
        {"federation": {"seed": s}, "split": {"seed": 1}})) for s in (1, 2)]
    assert np.array_equal(pinned[0].test, pinned[1].test) and np.array_equal(pinned[0].test, a.test)


def test_the_task_trains_on_split_patients():
    from clinograph.sdk.federation.build import build_task

    table = small_tables()[0]
    config = SimulationConfig.model_validate({"federation": {"seed": 3}}).hospital_config()
    task = build_task(table, dictionary=table.dictionary, config=config)
    split = cg.split_patients(table, config=config)
    assert np.array_equal(np.sort(task.split.test), split.test)


def test_a_hospital_too_small_to_split_is_told_to_leave_not_to_lower_fractions():
    import pytest

    from clinograph.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"2 patients .* leave this hospital out of the federation"):
        hospital_split(np.array([0, 1]), site="inst33", test_fraction=0.3, validation_fraction=0.2, seed=0)
    with pytest.raises(ConfigError, match=r"lower \[split\] fractions"):
        hospital_split(np.array([0, 1] * 4), site="h", test_fraction=0.05, validation_fraction=0.05, seed=0)
