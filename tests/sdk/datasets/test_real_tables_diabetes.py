"""The diabetes cohort (Efron et al. 2004, scikit-learn's unscaled copy; issue 15, session 7):
every patient kept with the public threshold label, mmol/L columns at one hospital converted back
to the dictionary's mg/dL, one hospital without the extended lipid panel, binary form only."""

import numpy as np
import pytest
from clinograph.sdk.datasets.real_tables import cohort_tables
from clinograph.sdk.ingest import ingest

from clinograph.core.errors import ConfigError

pytest.importorskip("sklearn")


def _tables():
    c = cohort_tables("diabetes")
    return c, [ingest(d, schema=s, dictionary=c.dictionary) for d, s in c.hospitals]


def test_diabetes_keeps_every_patient_with_the_public_threshold_label():
    from sklearn.datasets import load_diabetes

    target = load_diabetes(scaled=False).target
    c, tables = _tables()
    assert c.patients == len(target) == sum(t.n_patients for t in tables) and c.censored_before_horizon == 0
    assert c.positives == int((target > 140).sum()) == sum(int(t.labels.sum()) for t in tables)
    assert [t.site for t in tables] == ["dm_community", "dm_district", "dm_university"]
    assert [len(t.observed_nodes()) for t in tables] == [10, 8, 10]  # dm_district: no LDL, no TC/HDL
    assert len({frozenset(d.columns) for d, _ in c.hospitals}) == 3


def test_mmol_columns_come_back_in_mg_per_dl():
    c, tables = _tables()
    local, schema = c.hospitals[0]
    assert schema.columns["glu_mmol"].unit == "mmol/L" and local["glu_mmol"].max() < 10  # really mmol/L
    ref = c.dictionary.get("glucose")
    node = c.dictionary.node_ids().index("glucose")
    dense, observed = tables[0].dense()
    src_mgdl = local["glu_mmol"].to_numpy() * 180.156 / 10  # the analyte's molar mass
    mgdl, z = np.sort(src_mgdl), np.sort(dense[observed[:, node], node])
    src = np.sort(ref.standardise_array(mgdl))  # what the table holds: public-range standardised mg/dL
    np.testing.assert_allclose(z, src, rtol=1e-5, atol=1e-6)


def test_diabetes_has_no_survival_form():
    with pytest.raises(ConfigError, match="binary form only"):
        cohort_tables("diabetes", form="survival")
