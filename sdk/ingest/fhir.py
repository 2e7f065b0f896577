"""FHIR R4 Patient and Observation resources -> the long table :func:`ingest` takes.

Input is a Bundle (one JSON file), an NDJSON file of a bulk export, or a folder of them
(``Patient.ndjson``, ``Observation.ndjson``, ...). Each resource is validated with the
``fhir.resources`` models (its R4B package: R4's Patient and Observation, wire-compatible); a
resource that does not validate is named by file, line (or entry) and field path -- never by
value -- and all of them are reported at once. Resource types other than Patient and
Observation are counted and skipped.

An Observation's ``code.coding`` maps through the dictionary's codes: the coding system's URL is
named by ``systems`` (``http://loinc.org`` -> ``LOINC``) and ``SYSTEM/CODE`` is looked up.
Values: ``valueQuantity`` (its UCUM ``code``, else its ``unit``, read through pint),
``valueBoolean`` (1/0) or ``valueInteger``. Time: ``effectiveDateTime``, ``effectiveInstant``,
``effectivePeriod.start`` or ``issued``, counted in hours from the patient's first mapped
observation and binned into snapshots of ``snapshot_hours``. The label is the latest
Observation coded ``label_code`` (boolean or 0/1 integer).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from clinograph.secure.errors import ConfigError, SchemaError

from ..ontology.dictionary import FeatureDictionary
from .extract import EhrExtract, to_long

DEFAULT_SYSTEMS = {"http://loinc.org": "LOINC", "http://snomed.info/sct": "SNOMED",
                   "https://clinograph.org/fhir/CodeSystem/alarm": "ALARM"}
UCUM_URL = "http://unitsofmeasure.org"
MAX_PROBLEMS_SHOWN = 20


def _resources(path: Path):
    """(where, dict) for every resource in a Bundle, an NDJSON file or a folder of them."""
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in (".ndjson", ".json")) if path.is_dir() else [path]
    if not files:
        raise ConfigError(f"FHIR folder {path} holds no .ndjson or .json file.")
    for f in files:
        if not f.is_file():
            raise ConfigError(f"FHIR input {f} does not exist. Give a Bundle .json, an .ndjson file or a folder.")
        if f.suffix.lower() == ".ndjson":
            with open(f, encoding="utf-8") as fh:
                for n, line in enumerate(fh, 1):
                    if line.strip():
                        yield f"{f.name} line {n}", _json(line, f"{f.name} line {n}")
            continue
        doc = _json(f.read_text(encoding="utf-8"), f.name)
        if doc.get("resourceType") == "Bundle":
            for n, entry in enumerate(doc.get("entry") or [], 1):
                yield f"{f.name} entry {n}", (entry or {}).get("resource") or {}
        else:
            yield f.name, doc


def _json(text: str, where: str) -> dict:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchemaError(f"FHIR input {where} is not valid JSON (position {exc.pos}). Export it again.",
                          title="FHIR input cannot be parsed") from None
    if not isinstance(doc, dict):
        raise SchemaError(f"FHIR input {where} is not a JSON object (a resource).", title="FHIR input cannot be parsed")
    return doc


def _validate(model, doc: dict, where: str, problems: list[str]):
    try:
        return model.parse_obj(doc)
    except Exception as exc:  # pydantic's ValidationError (fhir.resources' own pydantic)
        errors = exc.errors() if hasattr(exc, "errors") else []
        fields = sorted({".".join(str(x) for x in e.get("loc", ())) for e in errors}) or ["?"]
        problems.append(f"FHIR {doc.get('resourceType')} at {where} does not validate (fields: "
                        f"{', '.join(fields[:5])}). Fix the export for those fields.")
        return None


def _when(obs) -> pd.Timestamp | None:
    for t in (obs.effectiveDateTime, obs.effectiveInstant, obs.effectivePeriod.start if obs.effectivePeriod else None,
              obs.issued):
        if t is not None:
            ts = pd.Timestamp(t)
            return ts.tz_convert("UTC").tz_localize(None) if ts.tzinfo is not None else ts
    return None


def _value(obs) -> tuple[float | None, str | None]:
    q = obs.valueQuantity
    if q is not None and q.value is not None:
        unit = q.code if q.code and (q.system in (None, UCUM_URL)) else q.unit
        return float(q.value), unit
    if obs.valueBoolean is not None:
        return float(obs.valueBoolean), None
    if obs.valueInteger is not None:
        return float(obs.valueInteger), None
    return None, None


def read_fhir(path: str | Path, *, dictionary: FeatureDictionary, site: str, label_code: str | None,
              systems: dict[str, str] | None = None, patient_id: Literal["id", "identifier"] = "id",
              snapshot_hours: float = 24.0) -> EhrExtract:
    """FHIR R4 Patient and Observation resources as an :class:`EhrExtract`.

    ``label_code``: ``SYSTEM/CODE`` of the outcome Observation, or None for an unlabeled
    extract. ``systems``: coding-system URL -> system name, added to :data:`DEFAULT_SYSTEMS`.
    ``patient_id``: the Patient's resource id, or its first identifier's value.

    Raises:
        ConfigError: the input does not exist.
        SchemaError: invalid JSON, or resources that do not validate (all named at once).
    """
    from fhir.resources.R4B.observation import Observation
    from fhir.resources.R4B.patient import Patient

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"FHIR input {path} does not exist. Give a Bundle .json, an .ndjson file or a folder.")
    names = {**DEFAULT_SYSTEMS, **(systems or {})}
    problems: list[str] = []
    patients: dict[str, str] = {}
    observations = []
    skipped: Counter[str] = Counter()
    for where, doc in _resources(path):
        kind = doc.get("resourceType")
        if kind == "Patient":
            p = _validate(Patient, doc, where, problems)
            if p is not None:
                ident = p.identifier[0].value if p.identifier and p.identifier[0].value else None
                patients[str(p.id)] = ident if patient_id == "identifier" and ident else str(p.id)
        elif kind == "Observation":
            o = _validate(Observation, doc, where, problems)
            if o is not None:
                observations.append(o)
        else:
            skipped[str(kind)] += 1
    if problems:
        shown = problems[:MAX_PROBLEMS_SHOWN]
        if len(problems) > MAX_PROBLEMS_SHOWN:
            shown.append(f"... and {len(problems) - MAX_PROBLEMS_SHOWN} more resource(s) that do not validate.")
        raise SchemaError(shown, title=f"FHIR input {path} has invalid resources")
    return _assemble(observations, patients, skipped, names=names, label_code=label_code, dictionary=dictionary,
                     site=site, snapshot_hours=snapshot_hours)


def _assemble(observations, patients, skipped, *, names, label_code, dictionary, site, snapshot_hours):
    known = set(dictionary.by_code())
    rows, label_rows, orphans, no_value = [], [], 0, 0
    for o in observations:
        ref = (o.subject.reference or "") if o.subject else ""
        pid = patients.get(ref.removeprefix("Patient/")) if ref.startswith("Patient/") else None
        if pid is None:
            orphans += 1
            continue
        keys = [f"{names[c.system]}/{c.code}" for c in (o.code.coding or []) if c.system in names and c.code]
        key = next((k for k in keys if k == label_code or k in known), keys[0] if keys else "(uncoded)")
        value, unit = _value(o)
        if value is None:
            no_value += 1
            continue
        (label_rows if key == label_code else rows).append((pid, _when(o), key, value, unit))
    ev = pd.DataFrame(rows, columns=["patient_id", "t", "code", "value", "unit"])
    t = pd.to_datetime(ev["t"])
    mapped = ev["code"].isin(known)
    origin = t[mapped].groupby(ev.loc[mapped, "patient_id"]).min()
    hours = ((t - ev["patient_id"].map(origin)) / pd.Timedelta(hours=1)).to_numpy(dtype=float)
    events = ev.assign(hours=np.where(np.isnan(hours), 0.0, hours))
    labels = None
    if label_code is not None:
        lab = pd.DataFrame(label_rows, columns=["patient_id", "t", "code", "value", "unit"]).sort_values("t")
        labels = lab.groupby("patient_id")["value"].last().astype(float)
    notes = tuple(f"{what}: {n}" for what, n in (
        ("Observations without a Patient read here", orphans), ("Observations without a numeric or boolean value",
                                                                 no_value),
        ("other resources skipped", sum(skipped.values()))) if n)
    return to_long(events, labels=labels, patients=sorted(set(patients.values())), dictionary=dictionary, site=site,
                   source="FHIR R4", snapshot_hours=snapshot_hours, notes=notes)
