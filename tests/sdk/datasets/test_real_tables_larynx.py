"""The larynx cohort (lifelines ``load_larynx``; session 10): about 30 patients a hospital, the
smallest federation the SDK's defaults must survive -- stage coded three ways, the horizon label
honest, and the default federation (every candidate, selection, calibration) runs and verifies."""

from pathlib import Path

import numpy as np
import pytest
from clinograph.sdk.datasets.real_tables import cohort_tables
from clinograph.sdk.ingest import ingest

pytest.importorskip("lifelines")


def _tables():
    c = cohort_tables("larynx")
    return c, [ingest(d, schema=s, dictionary=c.dictionary) for d, s in c.hospitals]


def test_larynx_labels_follow_the_three_year_horizon():
    from lifelines.datasets import load_larynx

    df = load_larynx()
    dead = df["death"] == 1
    c, tables = _tables()
    assert c.censored_before_horizon == int(((df["time"] < 3) & ~dead).sum()) == 4
    assert c.positives == int(((df["time"] < 3) & dead).sum()) == sum(int(t.labels.sum()) for t in tables)
    assert [t.n_patients for t in tables] == [27, 26, 33]


def test_three_stage_codings_ingest_to_the_same_levels():
    from lifelines.datasets import load_larynx

    c, tables = _tables()
    raw = [set(d[[k for k in d.columns if "stage" in k][0]].astype(str)) for d, _ in c.hospitals]
    codes = [{"1", "2", "3", "4"}, {"I", "II", "III", "IV"}, {"stage 1", "stage 2", "stage 3", "stage 4"}]
    assert all(len(r) >= 3 and r <= code for r, code in zip(raw, codes, strict=True))  # each its own coding
    nodes = c.dictionary.node_ids()
    stage_nodes = [nodes.index(f"stage={lv}") for lv in ("I", "II", "III", "IV")]
    counts = np.zeros(4)
    for t in tables:
        dense, observed = t.dense()
        counts += (observed[:, stage_nodes] & (dense[:, stage_nodes] > 0)).sum(0)
    df = load_larynx()
    kept = (df["time"] >= 3) | (df["death"] == 1)
    expect = [int((kept & (df[["Stage_II", "Stage_III", "Stage_IV"]].sum(1) == 0)).sum())] + [
        int((kept & (df[s] == 1)).sum()) for s in ("Stage_II", "Stage_III", "Stage_IV")]
    assert counts.tolist() == expect


def test_the_default_federation_runs_and_verifies_on_thirty_patients_a_hospital(tmp_path: Path):
    from clinograph.sdk.config import SimulationConfig
    from clinograph.sdk.federation.simulate import simulate as simulate_choosing
    from clinograph.secure.audit import verify_audit_dir

    c, tables = _tables()
    defaults = SimulationConfig.model_validate({"federation": {"id": "larynx-0", "seed": 0}, "model": {"init_seed": 0},
                                                "training": {"seed": 0}, "split": {"seed": 0}})  # the SDK's defaults
    res = simulate_choosing(tables, c.dictionary, defaults, audit_dir=tmp_path / "audit")
    assert verify_audit_dir(tmp_path / "audit").ok
    names = [cand["name"] for cand in res.choice["candidates"]]
    assert res.choice["chosen"] in names and len(names) == 4
    assert set(res.final) == {t.site for t in tables}
    for m in res.final.values():
        assert np.isfinite(m["brier"]) and 0 <= m["brier"] <= 1
