"""Who a FHIR Observation is about: Patient references, contained and logical subjects, one record a patient.

A ``subject`` names a Patient relatively (``Patient/1``), absolutely, by version, by a Bundle's
``urn:uuid:`` (:data:`PATIENT_REF`), as a Patient in the Observation's ``contained`` (``#p1``,
:data:`CONTAINED`: the patient of its identifier) or logically (``subject.identifier``,
:data:`LOGICAL`: the one Patient read that carries that identifier). Every copy of a patient
(top-level or contained) must agree on gender and birthDate (:func:`one_birth_a_patient`);
:func:`person_events` turns them into age and sex.
"""

from __future__ import annotations

import json
import re

import pandas as pd

from clinograph.core.errors import SchemaError

from ..ontology.dictionary import FeatureKind

#: a reference to a Patient: relative (``Patient/1``), absolute (``https://ehr/fhir/Patient/1``),
#: versioned (``Patient/1/_history/2``) or a bundle's ``urn:uuid:`` (Synthea: the Patient's id is the uuid)
PATIENT_REF = re.compile(r"(?:^|/)Patient/([A-Za-z0-9\-.]{1,64})(?:/_history/[A-Za-z0-9\-.]{1,64})?$"
                          r"|^urn:uuid:([0-9A-Fa-f\-]{36})$")
#: prefix of a subject resolved to a Patient contained in its Observation (no reference can start so)
CONTAINED = "\x00contained:"
#: prefix of a logical reference (``subject.identifier``), resolved once every Patient is read
LOGICAL = "\x00identifier:"
MAX_PROBLEMS_SHOWN = 20


def one_birth_a_patient(records, holders, problems, *, patient_id) -> dict:  # noqa: ANN001
    """patient key -> (birthDate, gender, where) from every Patient copy read for it (top-level and
    contained; the first one that gives each); copies that disagree are a problem (places only)."""
    born, clash = {}, []
    for key, recs in records.items():
        births, genders = {r[0] for r in recs if r[0]}, {r[1] for r in recs if r[1]}
        if (len(births) > 1 or len(genders) > 1) and len(holders.get(key, ())) < 2:  # shared ids: named apart
            clash.append(", ".join(dict.fromkeys(r[2] for r in recs[:3])))
        born[key] = (next((r[0] for r in recs if r[0]), None), next((r[1] for r in recs if r[1]), None), recs[0][2])
    if clash:
        problems.append(f"{len(clash)} patient(s) are described by several Patient resources (top-level or "
                        f"contained) that disagree on gender or birthDate (e.g. {clash[0]}): they would be read as "
                        f"one patient ({patient_id}). Fix the export: one {patient_id} a person.")
    return born


def logical_subjects(readings: list[tuple], idents: dict[tuple[str, str], set[str]]) -> dict[str, str]:
    """Logical subjects (``subject.identifier``) -> the key of the one Patient read that carries the
    identifier (any of its identifiers; by value alone when the reference gives no system). None
    or several: unresolved, counted as without a Patient -- never a patient made up from the value."""
    out = {}
    for ref in {r[0] for r in readings if r[0].startswith(LOGICAL)}:
        system, value = json.loads(ref.removeprefix(LOGICAL))
        keys = idents.get((system, value), set()) if system else \
            set().union(*(k for (_, v), k in idents.items() if v == value))
        if len(keys) == 1:
            out[ref] = next(iter(keys))
    return out


def person_events(born, origin, *, age, sex, dictionary) -> tuple[pd.DataFrame, int]:  # noqa: ANN001
    """Age (years at the patient's first mapped observation) and sex from Patient.birthDate/gender."""
    rows, unknown, bad = [], 0, []
    for pid, (birth, gender, where) in born.items():
        if age and birth and pid in origin.index:
            try:
                b = pd.Timestamp(birth if len(birth) == 10 else f"{birth}-07-01" if len(birth) == 4 else f"{birth}-01")
                rows.append((pid, f"FEATURE/{age}", (origin[pid] - b) / pd.Timedelta(days=365.25), "a", where))
            except (ValueError, OverflowError):  # no such day, or outside a timestamp's years 1677-2262
                bad.append(where)
        if sex:
            code = {"male": sex.male, "female": sex.female}.get(gender or "")
            if code is None:
                unknown += 1
                continue
            binary = dictionary.get(sex.feature).kind == FeatureKind.BINARY if sex.feature in dictionary else False
            rows.append((pid, f"FEATURE/{sex.feature}", float(code) if binary else code, None, where))
    if bad:
        raise SchemaError(f"FHIR {len(bad)} Patient birthDate(s) are not a calendar date between the years 1677 and "
                          f"2262 (at {', '.join(map(str, bad[:MAX_PROBLEMS_SHOWN]))}). Fix them in the export.",
                          title="FHIR birth dates cannot be read")
    out = pd.DataFrame(rows, columns=["patient_id", "code", "value", "unit", "where"]).assign(hours=0.0)
    return out, unknown
