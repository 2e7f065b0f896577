"""The real-table study's references (research/real_tables): the linear, tree and Cox baselines
run on the same splits as NS-FL."""

import numpy as np
import pytest
from clinograph.sdk.datasets.real_tables import cohort_tables
from clinograph.sdk.ingest import ingest

pytest.importorskip("lifelines")


def test_references_run_on_the_splits():
    from research.model_quality import baselines, nsfl_config, splits_for

    c = cohort_tables("gbsg2")
    tables = [ingest(df, schema=s, dictionary=c.dictionary) for df, s in c.hospitals]
    out = baselines(tables, splits_for(tables, nsfl_config(seed=0)), seed=0)
    assert set(out) == {"lr_standalone", "lr_fedavg_aligned", "lr_pooled", "gbm_pooled"}
    for per in out.values():
        assert set(per) == {t.site for t in tables}
        assert all(0.5 < v["auroc"] <= 1 and np.isfinite(v["brier"]) for v in per.values())


def test_survival_references_run_on_the_same_splits():
    from research.model_quality import splits_for
    from research.real_tables.survival_baselines import (
        _cindex_pooled,
        cox_pooled,
        cox_standalone,
        horizon_form,
    )

    c = cohort_tables("lung", form="survival")
    tables = [ingest(df, schema=s, dictionary=c.dictionary) for df, s in c.hospitals]
    from clinograph.sdk.config import HospitalConfig

    splits = splits_for(tables, HospitalConfig())
    for per in (cox_pooled(tables, splits, horizon=365.0), cox_standalone(tables, splits, horizon=365.0)):
        assert set(per) == {t.site for t in tables}
        assert all(0 <= m["cindex"] <= 1 for m in per.values())
    ht, hs = horizon_form(tables, splits, horizon=365.0)
    cidx = _cindex_pooled(tables, splits, ht, hs, seed=0)  # risk scored on all test patients, censored included
    assert all(0 <= c <= 1 for c in [*cidx["lr"].values(), *cidx["gbm"].values()])
    for t, h, s, hsplit in zip(tables, ht, splits, hs, strict=True):
        known = (t.survival.time > 365) | (t.survival.event == 1)
        assert h.n_patients == known.sum() and len(hsplit.test) == known[s.test].sum()
