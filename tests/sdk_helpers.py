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


#: the concept-variable cardinalities of :func:`tiny_concept_model`
CONCEPT_CARDS = {"a": 2, "b": 3, "y": 2}


def tiny_concept_model(kind: str, *, seed: int = 0):
    """A float32 concept model of ``kind`` (cbm, c2bm, cgm, ...) over concepts a, b and task y (a DAG
    a -> b -> y, a -> y for c2bm / cgm; bipartite otherwise), an MLP encoder of 5 inputs; weights from
    ``torch.manual_seed(seed)``, as the concept DP tests build theirs."""
    import torch
    from clinograph.sdk.concepts.encoders import MLPEncoder
    from clinograph.sdk.concepts.graph import ConceptGraph
    from clinograph.sdk.concepts.model import ConceptModel
    from clinograph.sdk.concepts.modules import ConceptHParams

    torch.manual_seed(seed)
    if kind in ("c2bm", "cgm"):
        g = ConceptGraph.from_edges(nodes=["a", "b", "y"], edges=[("a", "b"), ("b", "y"), ("a", "y")], task="y",
                                    cards=CONCEPT_CARDS)
    else:
        g = ConceptGraph.bipartite(concepts=["a", "b"], task="y", cards=CONCEPT_CARDS, with_task=True)
    return ConceptModel(kind=kind, encoder=MLPEncoder(5, 8, (16,)), graph=g, z_dim=8, hp=ConceptHParams(hidden=8, emb=4))
