"""The demo's four hospitals, small, for the EHR-source tests, and a table comparison."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pandas as pd
from clinograph.sdk.datasets.alarm import (
    DEFAULT_HOSPITALS,
    load_dictionary,
    make_hospital_tables,
)

D = load_dictionary()
#: DEFAULT_HOSPITALS (names, missing blocks, local names and units) at 1/40 of their size.
HOSPITALS = tuple(dataclasses.replace(h, n_patients=h.n_patients // 40) for h in DEFAULT_HOSPITALS)


@functools.cache
def demo_hospitals():
    """((wide table, site schema), ...) for the four demo hospitals."""
    return tuple(make_hospital_tables(seed=11, hospitals=HOSPITALS))


def canonical(table, ids=None) -> pd.DataFrame:
    """A PatientTable as sorted rows (patient, node, time, value, label); ``ids`` renames patients."""
    pids = np.array([ids[p] if ids else p for p in table.patient_ids], dtype=object)
    df = pd.DataFrame({"patient": pids[table.patient], "node": table.node, "time": table.time,
                       "value": table.value, "label": table.labels[table.patient]})
    return df.sort_values(["patient", "node", "time"]).reset_index(drop=True)


def assert_same(a, b, *, ids_b=None, rtol=0.0) -> None:
    """Same patients, nodes, snapshots and labels; values equal (within ``rtol``)."""
    ca, cb = canonical(a), canonical(b, ids_b)
    assert a.n_patients == b.n_patients and a.site == b.site
    pd.testing.assert_frame_equal(ca.drop(columns="value"), cb.drop(columns="value"))
    np.testing.assert_allclose(ca["value"], cb["value"], rtol=rtol, atol=0)
    assert sorted(a.labels.tolist()) == sorted(b.labels.tolist())


def extended_dictionary():
    """The demo dictionary plus age, sex, diastolic blood pressure and a condition (COPD)."""
    from clinograph.sdk.ontology.dictionary import Feature, FeatureDictionary

    extra = (Feature(id="age", name="Age", kind="numeric", unit="a", reference_low=18, reference_high=90,
                     physical_min=0, physical_max=130),
             Feature(id="sex", name="Sex", kind="categorical", levels=("female", "male")),
             Feature(id="diastolic_bp", name="Diastolic blood pressure", kind="numeric", unit="mmHg",
                     reference_low=60, reference_high=90, codes={"loinc": "8462-4"}),
             Feature(id="copd", name="COPD", kind="binary", omop_concept_id=255573))
    return FeatureDictionary(name=D.name, version=D.version, features=(*D.features, *extra))
