"""The kidney transplant cohort (issue 15, session 6): honest horizon labels, own column names
and codings per hospital, one hospital without race, binary form only."""

import pytest
from clinograph.sdk.datasets.real_tables import cohort_tables
from clinograph.sdk.ingest import ingest

from clinograph.core.errors import ConfigError

pytest.importorskip("lifelines")


def test_kidney_ingests_with_horizon_labels_and_a_missing_block():
    from lifelines.datasets import load_kidney_transplant

    df = load_kidney_transplant()
    c = cohort_tables("kidney")
    assert c.censored_before_horizon == int(((df["time"] < 1095) & (df["death"] == 0)).sum())
    assert c.positives == int(((df["time"] < 1095) & (df["death"] == 1)).sum())
    tables = [ingest(d, schema=s, dictionary=c.dictionary) for d, s in c.hospitals]
    assert [t.site for t in tables] == ["tx_community", "tx_regional", "tx_university"]
    assert sum(t.n_patients for t in tables) == c.patients
    assert [len(t.observed_nodes()) for t in tables] == [2, 3, 3]  # tx_community records no race
    assert len({frozenset(d.columns) for d, _ in c.hospitals}) == 3


def test_kidney_has_no_survival_form():
    with pytest.raises(ConfigError, match="binary form only"):
        cohort_tables("kidney", form="survival")
