"""Real cohorts cut into hospitals: censoring handled, own names/codings/units/missing blocks,
every table ingests (the study's references: research/real_tables/tests)."""

import numpy as np
import pytest
from clinograph.sdk.datasets.real_tables import cohort_tables
from clinograph.sdk.ingest import ingest

from clinograph.core.errors import ConfigError

pytest.importorskip("lifelines")


@pytest.mark.parametrize("name", ["lung", "gbsg2"])
def test_cohorts_ingest_with_honest_labels(name):
    c = cohort_tables(name)
    assert c.censored_before_horizon > 0 and 0 < c.positives < c.patients
    tables = [ingest(df, schema=s, dictionary=c.dictionary) for df, s in c.hospitals]
    assert sum(t.n_patients for t in tables) == c.patients
    assert sum(int(t.labels.sum()) for t in tables) == c.positives
    observed = [set(t.observed_nodes().tolist()) for t in tables]
    assert len({frozenset(o) for o in observed}) > 1  # missing blocks differ
    columns = [set(df.columns) for df, _ in c.hospitals]
    assert len({frozenset(x) for x in columns}) == len(columns)  # every hospital names its columns its own way


def test_lung_labels_follow_the_horizon():
    from lifelines.datasets import load_lung

    df = load_lung().dropna(subset=["inst"])
    dead = df["status"] == 1
    assert cohort_tables("lung").censored_before_horizon == int(((df["time"] < 365) & ~dead).sum())
    assert cohort_tables("lung").positives == int(((df["time"] < 365) & dead).sum())


def test_a_karnofsky_fraction_is_converted_back():
    c = cohort_tables("lung")
    north_df, north_schema = c.hospitals[1]
    assert north_df["KPS_md"].dropna().max() <= 1.0  # reported as a fraction there
    t = ingest(north_df, schema=north_schema, dictionary=c.dictionary)
    k = c.dictionary.node_index()["karnofsky_physician"]
    assert t.value[t.node == k].max() > 50  # canonical unit: %


def test_unknown_cohort_lists_the_registered():
    with pytest.raises(ConfigError, match="Registered: lung, gbsg2"):
        cohort_tables("heart")


@pytest.mark.parametrize("name", ["lung", "gbsg2"])
def test_survival_form_keeps_censored_patients_in_days(name):
    from lifelines.datasets import load_gbsg2, load_lung

    c = cohort_tables(name, form="survival")
    tables = [ingest(df, schema=s, dictionary=c.dictionary) for df, s in c.hospitals]
    raw = load_lung().dropna(subset=["inst"]) if name == "lung" else load_gbsg2()
    assert sum(t.n_patients for t in tables) == c.patients == len(raw)  # nobody dropped for censoring
    times = np.sort(np.concatenate([t.survival.time for t in tables]))
    np.testing.assert_allclose(times, np.sort(raw["time"].to_numpy(float)), atol=0.05)  # d/wk/mo/a -> days
    assert sum(int(t.survival.event.sum()) for t in tables) == c.positives
    assert len({s.survival.time_unit for _, s in c.hospitals}) >= 3  # each hospital its own unit
