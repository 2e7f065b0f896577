"""tests/sdk/ingest on the import path: the federation tests build hospitals from EHR exports written by
its ``cohort_exports`` (one synthetic cohort as OMOP, FHIR and MEDS)."""

import sys
from pathlib import Path

_INGEST = str(Path(__file__).resolve().parents[1] / "ingest")
if _INGEST not in sys.path:
    sys.path.insert(0, _INGEST)
