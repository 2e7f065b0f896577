"""The demo hospitals as MEDS datasets and FHIR R4 exports (OMOP: :mod:`.omop`).

The same events as the OMOP instance -- every present value of a hospital's wide table at the
patient's index time, in the hospital's own unit written in UCUM -- so that CSV, OMOP, MEDS and
FHIR of one hospital ingest to the same table. Codes are a feature's LOINC code, else its ALARM
node (a local code system). The outcome is a MEDS label (prediction time = index time) or a
FHIR Observation coded ``ALARM/SHUNT``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..ontology.dictionary import Feature, FeatureDictionary
from ..ontology.schema import SiteSchema
from .omop import hospital_events, index_times

ALARM_SYSTEM = "https://clinograph.org/fhir/CodeSystem/alarm"
LOINC_SYSTEM = "http://loinc.org"
UCUM_SYSTEM = "http://unitsofmeasure.org"
LABEL_CODE = "ALARM/SHUNT"


def demo_code(feat: Feature) -> tuple[str, str]:
    """(system, code) the demo writes for a feature: LOINC if it has one, else its ALARM node."""
    if "loinc" in feat.codes:
        return "LOINC", feat.codes["loinc"]
    return "ALARM", feat.codes["alarm"]


def write_meds(root: str | Path, table: pd.DataFrame, schema: SiteSchema, dictionary: FeatureDictionary) -> Path:
    """A MEDS dataset of one hospital under ``root`` (data/0.parquet) and its label file; returns the label path.

    Subject ``i`` is the table's row ``i``. Units are in the code (``LOINC/2345-7//mg/dL``).
    """
    import meds
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(root)
    (root / meds.data_subdirectory).mkdir(parents=True, exist_ok=True)
    ev = hospital_events(table, schema, dictionary)
    t0 = index_times(len(table))
    feats = {f.id: f for f in dictionary.features}
    codes = ["/".join(demo_code(feats[f])) + (f"//{u}" if isinstance(u, str) else "")
             for f, u in zip(ev["feature"], ev["unit"], strict=True)]
    events = pa.table({"subject_id": pa.array(ev["row"].to_numpy(dtype=np.int64)),
                       "time": pa.array(t0[ev["row"].to_numpy()].to_numpy(dtype="datetime64[us]")),
                       "code": pa.array(codes, pa.string()),
                       "numeric_value": pa.array(ev["value"].to_numpy(dtype=np.float32))})
    events = meds.DataSchema.align(events.sort_by([("subject_id", "ascending"), ("time", "ascending")]))
    pq.write_table(events, root / meds.data_subdirectory / "0.parquet")
    labels = meds.LabelSchema.align(pa.table({
        "subject_id": pa.array(np.arange(len(table), dtype=np.int64)),
        "prediction_time": pa.array(t0.to_numpy(dtype="datetime64[us]")),
        "boolean_value": pa.array(table[schema.label].to_numpy(dtype=bool))}))
    label_path = root / "labels.parquet"
    pq.write_table(labels, label_path)
    return label_path


def _observation(n: int, patient: str, when: str, system: str, code: str, value: dict) -> dict:
    url = LOINC_SYSTEM if system == "LOINC" else ALARM_SYSTEM
    return {"resourceType": "Observation", "id": f"{patient}-o{n}", "status": "final",
            "code": {"coding": [{"system": url, "code": code}]}, "subject": {"reference": f"Patient/{patient}"},
            "effectiveDateTime": when, **value}


def fhir_resources(table: pd.DataFrame, schema: SiteSchema, dictionary: FeatureDictionary) -> list[dict]:
    """Patient and Observation resources (FHIR R4 JSON) of one hospital."""
    ev = hospital_events(table, schema, dictionary)
    t0 = index_times(len(table))
    ids = table[schema.patient_id].astype(str).tolist()
    feats = {f.id: f for f in dictionary.features}
    out: list[dict] = [{"resourceType": "Patient", "id": pid, "active": True} for pid in ids]
    for n, (row, fid, value, unit, kind) in enumerate(
            zip(ev["row"], ev["feature"], ev["value"], ev["unit"], ev["kind"], strict=True)):
        system, code = demo_code(feats[fid])
        when = t0[row].isoformat() + "Z"
        if kind == "binary":
            body = {"valueBoolean": bool(value)}
        else:
            body = {"valueQuantity": {"value": float(value), "unit": unit, "system": UCUM_SYSTEM, "code": unit}}
        out.append(_observation(n, ids[row], when, system, code, body))
    for row, y in enumerate(table[schema.label].to_numpy(dtype=int)):
        out.append(_observation(len(ev) + row, ids[row], (t0[row] + pd.Timedelta(days=1)).isoformat() + "Z",
                                "ALARM", "SHUNT", {"valueBoolean": bool(y)}))
    return out


def write_fhir(path: str | Path, table: pd.DataFrame, schema: SiteSchema, dictionary: FeatureDictionary, *,
               form: str = "ndjson") -> Path:
    """One hospital as a FHIR bulk export (``form="ndjson"``: a folder of Patient.ndjson and
    Observation.ndjson) or a transaction Bundle (``form="bundle"``: one JSON file)."""
    path = Path(path)
    resources = fhir_resources(table, schema, dictionary)
    if form == "bundle":
        bundle = {"resourceType": "Bundle", "type": "collection",
                  "entry": [{"fullUrl": f"urn:uuid:{r['resourceType']}-{r['id']}", "resource": r} for r in resources]}
        path.write_text(json.dumps(bundle))
        return path
    path.mkdir(parents=True, exist_ok=True)
    for kind in ("Patient", "Observation"):
        with open(path / f"{kind}.ndjson", "w") as fh:
            for r in resources:
                if r["resourceType"] == kind:
                    fh.write(json.dumps(r) + "\n")
    return path
