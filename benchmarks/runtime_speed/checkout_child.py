"""What the EHR memory benchmarks' child processes share (ehr_memory.py, ehr_cohort_memory.py).

Each child measures one checkout's readers in a fresh process, so this module imports nothing of
Clinograph: importing it must not load this checkout's modules into a child that measures another.
"""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path


def use_checkout(code: Path) -> None:
    """Import ``clinograph`` (and its ``sdk``, ``secure``) from the checkout at ``code`` in this
    process, through the editable install's finder; call before any Clinograph import."""
    finder = importlib.import_module("__editable___clinograph_0_1_0_finder")
    code = Path(code).resolve()
    finder.MAPPING.update({"clinograph": str(code / "clinograph"), "clinograph.sdk": str(code / "sdk"),
                           "clinograph.secure": str(code / "secure")})


def vm_mib(key: str) -> float:
    """This process's ``/proc/self/status`` figure ``key`` (VmRSS, VmHWM, ...) in MiB; NaN if absent."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def extract_digest(ex) -> str:  # noqa: ANN001 - an EhrExtract: its table and report, to compare two checkouts
    """16 hex digits of an extract's table (as text) and report."""
    import pandas as pd

    h = hashlib.sha256(pd.util.hash_pandas_object(ex.table.astype(str), index=False).to_numpy().tobytes())
    h.update(repr(ex.report).encode())
    return h.hexdigest()[:16]
