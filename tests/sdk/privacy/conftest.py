"""Small demo hospitals shared by the privacy tests (pgmpy sampling costs seconds: built once)."""

from __future__ import annotations

import pytest
from clinograph.sdk.datasets.alarm import HospitalSpec, load_dictionary, make_hospital_tables
from clinograph.sdk.ingest.validate import ingest

SPECS = (HospitalSpec("alpha", 90), HospitalSpec("beta", 70), HospitalSpec("gamma", 60, lacks=("sao2", "svo2", "paco2")))


@pytest.fixture(scope="session")
def dictionary():
    return load_dictionary()


@pytest.fixture(scope="session")
def tables(dictionary):
    return [ingest(df, schema=s, dictionary=dictionary) for df, s in make_hospital_tables(seed=3, hospitals=SPECS)]
