"""A model's risks for a set of patients, as the EHR writers take them.

:class:`Predictions` holds what every output of ``clinograph predict`` shares -- the patients,
their risks (one column, or one a survival horizon), the released model's SHA-256 digest and the
time the risks were made -- so the CSV, the FHIR ``RiskAssessment`` resources
(:mod:`.fhir_risk`) and the OMOP results table (:mod:`.omop_results`) carry the same numbers.
Formats: docs/ehr_formats.md, "Predictions back into the EHR".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np

from clinograph.core.errors import ConfigError

from .description import ModelDescription

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"^[+-]?\d+(?:\.\d+)?$")


def spreadsheet_safe(cell: str) -> str:
    """``cell`` with a leading ``'`` if a spreadsheet would read it as a formula (CSV injection,
    OWASP "CSV Injection"): it starts with ``= + - @``, a tab or a carriage return and is not a
    plain number such as ``-12``. Every CSV of patient ids ``clinograph predict`` writes uses it."""
    if cell.startswith(_FORMULA_START) and not _PLAIN_NUMBER.match(cell):
        return "'" + cell
    return cell


@dataclass(frozen=True, repr=False)
class Predictions:
    """Risks of ``len(patient_ids)`` patients from one released model.

    Shapes:
        risks: [n_patients, n_outputs] probabilities; n_outputs = 1 (binary) or len(horizons).

    ``horizons`` (survival only): the times t of the columns, risk = P(T <= t), in ``time_unit``
    (UCUM). ``created``: when the risks were made (timezone-aware). ``model_format`` and
    ``site``: from the model's signed description. Never printed with its ids (the repr counts).
    """

    patient_ids: tuple[str, ...]
    risks: np.ndarray
    model_sha256: str
    model_format: str
    site: str
    created: datetime
    horizons: tuple[float, ...] | None = None
    time_unit: str | None = None

    def __post_init__(self) -> None:
        problems = []
        if not _SHA256.match(self.model_sha256):
            problems.append("model_sha256 is not a SHA-256 hex digest")
        if self.risks.ndim != 2 or self.risks.shape[0] != len(self.patient_ids):
            problems.append(f"risks of shape {self.risks.shape} do not give one row a patient "
                            f"({len(self.patient_ids)})")
        width = 1 if self.horizons is None else len(self.horizons)
        if self.risks.ndim == 2 and self.risks.shape[1] != width:
            problems.append(f"{self.risks.shape[1]} risk column(s) for {width} output(s)")
        if (self.horizons is None) != (self.time_unit is None):
            problems.append("horizons and time_unit go together (survival) or are both None (binary)")
        if self.created.tzinfo is None:
            problems.append("created must be timezone-aware")
        if problems:
            raise ConfigError("Predictions: " + "; ".join(problems) + ". Build them with Predictions.of.")

    def __repr__(self) -> str:
        return (f"Predictions(patients={len(self.patient_ids)}, outputs={self.risks.shape[1]}, "
                f"model_sha256={self.model_sha256[:12]}…)")

    @property
    def survival(self) -> bool:
        """True when the columns are risks at survival horizons."""
        return self.horizons is not None

    @classmethod
    def of(cls, *, description: ModelDescription, patient_ids: list[str] | tuple[str, ...], risks: np.ndarray,
           created: datetime | None = None) -> Predictions:
        """Predictions of the model ``description`` describes (its digest, format, site, and for a
        survival model its horizons); ``risks`` [n] (binary) or [n, H]; ``created`` default now (UTC)."""
        r = np.asarray(risks, dtype=np.float64)
        r = r[:, None] if r.ndim == 1 else r
        s = description.survival
        when = (created or datetime.now(timezone.utc)).replace(microsecond=0)
        return cls(patient_ids=tuple(str(p) for p in patient_ids), risks=r, model_sha256=description.weights_sha256,
                   model_format=description.format, site=description.site, created=when,
                   horizons=None if s is None else tuple(float(h) for h in s.horizons),
                   time_unit=None if s is None else s.time_unit)

    def created_text(self) -> str:
        """``created`` as an ISO 8601 dateTime with its offset (FHIR ``dateTime``), to the second."""
        return self.created.isoformat(timespec="seconds")
