"""The time-series federation generator: physiology directions, hospitals' own layouts, modality gaps."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
from clinograph.sdk.datasets import timeseries as ts
from clinograph.sdk.ingest import ingest


def _ingested(sites):
    d = ts.load_dictionary()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [ingest(s.table, schema=s.schema, dictionary=d) for s in sites]


def test_physiology_moves_the_published_way_and_shock_follows_sepsis3():
    rng = np.random.default_rng(0)
    c = ts.simulate_cohort(3000, deteriorating=0.35, rng=rng)
    o = ts.observe(c, rng)
    s = c.severity[:, : ts.OBS_HOURS].ravel()
    corr = {k: np.corrcoef(s, o[k].ravel())[0, 1] for k in ("heart_rate", "map", "lactate", "resp_rate", "spo2")}
    assert corr["heart_rate"] > 0.5 and corr["lactate"] > 0.5 and corr["resp_rate"] > 0.3
    assert corr["map"] < -0.5 and corr["spo2"] < -0.2
    # nobody is in shock (MAP < 65 with lactate > 2, noise-free) during the observed hours
    true_map = 90 - 8.5 * c.severity - 4 * c.chf[:, None]
    shock = (true_map < 65) & (np.exp(0.32 * c.severity) > 2)
    assert not shock[:, : ts.OBS_HOURS].any()
    assert np.array_equal(shock[:, ts.OBS_HOURS:].any(1), c.shock_4h.astype(bool))
    assert 0.05 < c.shock_4h.mean() < 0.3
    # the trend carries information beyond the level: among patients with the same level,
    # those who rose over the last 4 hours go into shock more often
    lvl, trend = c.severity[:, ts.OBS_HOURS - 1], c.severity[:, ts.OBS_HOURS - 1] - c.severity[:, ts.OBS_HOURS - 5]
    band = (lvl > 1.0) & (lvl < 2.2)
    assert c.shock_4h[band & (trend > 0.5)].mean() > 2 * c.shock_4h[band & (trend < 0)].mean()


def test_hospitals_have_their_own_names_units_layout_and_sampling():
    small = tuple(replace(h, n_patients=40) for h in ts.DEFAULT_TS_HOSPITALS)
    sites = ts.make_timeseries_sites(seed=3, hospitals=small)
    assert 10 <= len(sites) <= 20
    tables = _ingested(sites)
    by = {t.site: t for t in tables}
    assert by["icu_a"].n_snapshots == 12 and by["hdu_e"].n_snapshots == 6 and by["ward_h"].n_snapshots == 3
    assert "stay_id" in sites[0].table.columns and "HR" in set(sites[0].table["item"])
    node = {n: i for i, n in enumerate(ts.load_dictionary().node_ids())}
    for site in ("hdu_e", "ward_h"):  # °F and mg/dL at source, °C and mmol/L after ingestion
        t = by[site]
        temp = t.value[t.node == node["temperature"]]
        assert 34 <= temp.min() and temp.max() <= 42
        raw = sites[[s.schema.site for s in sites].index(site)].table
        assert raw.loc[raw.iloc[:, 2] == "temp_f"].iloc[:, 3].min() > 90
    assert node["lactate"] not in set(by["ward_h"].node) and node["wbc"] not in set(by["ward_i"].node)
    again = ts.make_timeseries_sites(seed=3, hospitals=small[:2])
    assert all(a.table.equals(b.table) for a, b in zip(sites[:2], again, strict=True))
    assert not sites[0].table.equals(ts.make_timeseries_sites(seed=4, hospitals=small[:1])[0].table)


def test_modality_gap_set_has_waveforms_only_where_declared():
    small = tuple(replace(h, n_patients=30) for h in ts.MODALITY_GAP_HOSPITALS)
    sites = ts.make_timeseries_sites(seed=0, hospitals=small)
    tables = _ingested(sites)
    for s, t in zip(sites, tables, strict=True):
        w, has = ts.waveform_matrix(s, t.patient_ids)
        assert has.all() == ("waveform" in s.hospital.modalities) and has.any() == has.all()
        assert w.shape == (t.n_patients, ts.WAVEFORM_SAMPLES)
        assert (t.n_snapshots > 1) == ("vitals" in s.hospital.modalities)
