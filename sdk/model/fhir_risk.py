"""Predictions as FHIR R4 ``RiskAssessment`` resources, one a patient, written as NDJSON.

Each resource (docs/ehr_formats.md, "Predictions back into the EHR", has a full example):

* ``status = "final"``, ``subject``: ``Patient/<id>`` when the ids are FHIR Patient ids, else a
  logical reference by identifier (``subject.identifier.system`` = the system the caller names);
* ``occurrenceDateTime``: when the risks were made;
* ``method``: Clinograph and the released model, coded by the SHA-256 of its weights
  (system :data:`MODEL_SYSTEM`, code = the hex digest);
* ``basis``: one reference whose display names the model (digest, format, exporting site);
* ``prediction[]``: one a risk, ``probabilityDecimal`` the risk, ``outcome`` the outcome's text
  (naming the model unless the caller names the outcome), and for a survival model
  ``whenRange.high`` the horizon as a UCUM quantity (risk = P(T <= horizon)).

Nothing here parses FHIR: the resources are plain JSON built from typed values; the tests
validate every one with ``fhir.resources`` (R4B, whose RiskAssessment is R4's).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from clinograph.core.errors import ConfigError

from .predictions import Predictions

#: coding system of ``method``: the code is the released model's weights SHA-256 (hex)
MODEL_SYSTEM = "https://clinograph.org/fhir/CodeSystem/model-sha256"
UCUM = "http://unitsofmeasure.org"
#: ``subject`` mode: the ids are FHIR Patient resource ids
REFERENCE = "reference"
_FHIR_ID = re.compile(r"^[A-Za-z0-9\-.]{1,64}$")
_SYSTEM = re.compile(r"^(?:https?://|urn:)[^\s|]{1,250}$")


def check_subject(subject: str) -> None:
    """Refuse a ``subject`` that is neither :data:`REFERENCE` nor an identifier system URI."""
    if subject != REFERENCE and not _SYSTEM.match(subject):
        raise ConfigError(f"FHIR subject {subject[:60]!r} is neither 'reference' (the ids are FHIR Patient ids) nor "
                          "an identifier system URI (http(s)://... or urn:...). Fix: pass the system of your "
                          "patient ids, e.g. --fhir-subject https://hospital.example/fhir/sid/mrn.")


def risk_assessments(predictions: Predictions, *, subject: str, outcome: str | None = None) -> list[dict[str, Any]]:
    """One ``RiskAssessment`` (as JSON-ready dicts) a patient, in the order of ``predictions``.

    Args:
        subject: :data:`REFERENCE` (``Patient/<id>``; every id must be a FHIR id) or the identifier
            system URI of the ids (``subject.identifier``).
        outcome: the outcome's text (e.g. "in-hospital death"); None names the model instead.

    Raises:
        ConfigError: a bad ``subject``, or ids that are not FHIR ids under :data:`REFERENCE`
            (counted, never shown).
    """
    check_subject(subject)
    if subject == REFERENCE:
        bad = sum(not _FHIR_ID.match(p) for p in predictions.patient_ids)
        if bad:
            raise ConfigError(f"{bad} of {len(predictions.patient_ids)} patient id(s) are not FHIR ids "
                              "([A-Za-z0-9-.], at most 64 characters), so 'Patient/<id>' would not be a valid "
                              "reference. Fix: pass the system of these ids (--fhir-subject <system URI>) to "
                              "reference patients by identifier.")
    p = predictions
    digest = p.model_sha256
    named = f"Clinograph model sha256:{digest} ({p.model_format}, exported by site {p.site!r})"
    what = outcome or f"outcome predicted by Clinograph model sha256:{digest[:12]}"
    method = {"coding": [{"system": MODEL_SYSTEM, "code": digest, "display": "Clinograph federated model"}],
              "text": named}
    when = p.created_text()
    out = []
    for pid, row in zip(p.patient_ids, p.risks, strict=True):
        ref = ({"reference": f"Patient/{pid}"} if subject == REFERENCE
               else {"identifier": {"system": subject, "value": pid}})
        preds = []
        for j, risk in enumerate(row):
            entry: dict[str, Any] = {"outcome": {"text": what}, "probabilityDecimal": float(risk)}
            if p.horizons is not None and p.time_unit is not None:
                entry["whenRange"] = {"high": {"value": p.horizons[j], "unit": p.time_unit, "system": UCUM,
                                               "code": p.time_unit}}
            preds.append(entry)
        rid = hashlib.sha256(json.dumps([digest, ref, when], sort_keys=True).encode()).hexdigest()[:32]
        out.append({"resourceType": "RiskAssessment", "id": rid, "status": "final", "subject": ref,
                    "occurrenceDateTime": when, "method": method, "basis": [{"display": named}],
                    "prediction": preds})
    return out


def write_risk_assessments(path: str | Path, predictions: Predictions, *, subject: str,
                           outcome: str | None = None) -> int:
    """Write :func:`risk_assessments` to ``path`` as NDJSON (one resource a line, UTF-8, the
    FHIR Bulk Data format); returns the number written. Raises as :func:`risk_assessments`."""
    resources = risk_assessments(predictions, subject=subject, outcome=outcome)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as fh:
        for r in resources:
            fh.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
    return len(resources)
