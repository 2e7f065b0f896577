"""The rossi cohort (lifelines ``load_rossi``; issue 30's held-out table): the label is re-arrest
within the 52 weeks every man was followed, each site's own codings ingest to the same values,
and the missing blocks are missing."""

import pytest
from clinograph.sdk.datasets.real_tables import cohort_tables
from clinograph.sdk.ingest import ingest

pytest.importorskip("lifelines")


def test_rossi_label_is_the_arrest_within_the_year_and_every_man_is_kept():
    from lifelines.datasets import load_rossi

    df = load_rossi()
    c = cohort_tables("rossi")
    tables = [ingest(d, schema=s, dictionary=c.dictionary) for d, s in c.hospitals]
    assert c.censored_before_horizon == 0 and c.patients == len(df) == sum(t.n_patients for t in tables)
    assert c.positives == int(df["arrest"].sum()) == sum(int(t.labels.sum()) for t in tables)
    assert [t.n_patients for t in tables] == [130, 129, 173]
    nodes = c.dictionary.node_ids()
    aid, married = nodes.index("financial_aid"), nodes.index("married")
    got = {}
    for t, (raw, _) in zip(tables, c.hospitals, strict=True):
        dense, observed = t.dense()
        got[t.site] = (observed[:, aid].all(), observed[:, married].any(), dense[:, aid].sum(), set(raw.columns))
    east, central, west = got["ro_east"], got["ro_central"], got["ro_west"]
    assert {"aid", "AGE"} <= east[3] and "work_experience" not in east[3]  # own names, no work-history block
    assert set(c.hospitals[0][0]["aid"]) == {"yes", "no"}
    assert east[0] and central[1] and not west[1]  # west has no marital status
    assert east[2] + central[2] + west[2] == int(df["fin"].sum())  # "yes"/"no" and 0/1 ingest alike
