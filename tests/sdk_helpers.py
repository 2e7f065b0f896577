"""Small real hospitals for SDK tests (generated from ALARM; no downloads)."""

from __future__ import annotations

import functools

from clinograph.sdk.datasets.alarm import (
    BLOOD_GAS,
    HospitalSpec,
    load_dictionary,
    make_hospital_tables,
)
from clinograph.sdk.ingest import ingest

SMALL = (
    HospitalSpec("north", 160, renames=(("heart_rate", "HR"), ("glucose", "GLU")), units=(("glucose", "mg/dL"),)),
    HospitalSpec("south", 120, renames=(("paco2", "PaCO2 (kPa)"),), units=(("paco2", "kPa"),)),
    HospitalSpec("east", 100, lacks=BLOOD_GAS),
)


@functools.cache
def small_tables(seed: int = 0):
    """Three small ingested hospitals (cached per seed)."""
    d = load_dictionary()
    return tuple(ingest(df, schema=s, dictionary=d) for df, s in make_hospital_tables(seed=seed, hospitals=SMALL))


@functools.cache
def raw_tables(seed: int = 0):
    """The same hospitals as (DataFrame, SiteSchema) before ingestion."""
    return tuple(make_hospital_tables(seed=seed, hospitals=SMALL))


#: The survival target the lung-cohort tests train on (months, public breaks).
SURVIVAL_TARGET = {"kind": "survival", "time_unit": "mo", "breaks": [3, 6, 12, 24, 36], "horizon": 12}


@functools.cache
def lung_survival():
    """The lung cohort in survival form: (dictionary, its hospitals' ingested tables). Needs lifelines."""
    from clinograph.sdk.datasets.real_tables import cohort_tables

    c = cohort_tables("lung", form="survival")
    return c.dictionary, tuple(ingest(df, schema=s, dictionary=c.dictionary) for df, s in c.hospitals)


def timeseries_sites(hospitals, *, seed: int):
    """(dictionary, [(ingested table, {modality: (signal, has)} or {})]) of timeseries ``hospitals``
    (:mod:`clinograph.sdk.datasets.timeseries` specs): the modality and temporal tests' sites."""
    from clinograph.sdk.datasets.timeseries import ingested_sites

    return ingested_sites(hospitals, seed=seed)
