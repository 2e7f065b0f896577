"""Fuzz: messy hospital exports (the cells real lab and EHR exports hold) through read_table + ingest.

Cells are drawn from what exports write: plain and decimal-comma numbers, detection limits
(``<5``), units and percent signs in cells, missing-value markers (``-``, ``?``, ``n.a.``,
``#VALUE!``), dates, yes/no spellings, huge and infinite values, spaces and invisible
characters, formula-looking text -- in comma, semicolon or tab files, UTF-8 with or without a
byte-order mark, UTF-16 or latin-1. Properties:

* the only exceptions are ClinographError subclasses, and no message quotes a canary cell;
* nothing is dropped silently: when a table ingests, every non-empty cell of a feature column
  is an observation (no patient is dropped under the default missing_label = "error").
"""

from __future__ import annotations

import io
import os
import re

import pandas as pd
import pytest
from clinograph.sdk.ingest import ingest, read_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tables_helpers import CANARY, ColumnMap, D, wide

from clinograph.core.errors import ClinographError

NUMBERS = ["70", "72.5", " 80 ", "95\u00a0", "1e2", "0", "-3", "+4", "350", "351", "1e308", "1e999", "inf", "-inf",
           "5,2", "1.234,5", "1,234", "<5", "> 200", "≤0.1", "12 mg/dL", "50%", "72 bpm", "0x10", "1_000", "\u22125"]
MISSING = ["", " ", "NA", "n/a", "NaN", "NULL", "-", ".", "?", "n.a.", "#VALUE!", "none", "missing"]
DATES = ["2024-03-01", "01.03.2024", "2024-03-01T10:00:00Z"]
CODES = ["0", "1", "yes", "no", "Y", "N", "true", "False", "M", "F", "1.0", "icu", "general", "ICU ", "3", "3.0"]
HOSTILE = ["=cmd|' /C calc'!A0", "@SUM(1)", "\u202eevil", "a\u200bb", "é", "e\u0301"]
LABELS = ["0", "1", "1.0", "0.0", "yes", "no", "true", "dead", "2", "", "NA", " 1"]
COLUMNS = {"hr": NUMBERS, "paco2": NUMBERS, "crp": NUMBERS, "sex": CODES, "ward": CODES}
SCHEMA = wide(columns={"paco2": ColumnMap(feature="paco2", unit="kPa")})
_TOKEN = re.compile(re.escape(CANARY) + r"\d+")


@st.composite
def exports(draw):
    counter = iter(range(10**6))
    cols = draw(st.lists(st.sampled_from(sorted(COLUMNS)), min_size=1, max_size=4, unique=True))
    n = draw(st.integers(1, 6))

    def cell(pool):
        kind = draw(st.sampled_from(["pool"] * 6 + ["missing", "date", "hostile", "canary"]))
        if kind == "canary":
            return f"{CANARY}{next(counter)}"
        return draw(st.sampled_from({"pool": pool, "missing": MISSING, "date": DATES, "hostile": HOSTILE}[kind]))

    data = {"pid": [draw(st.sampled_from([f"p{i}", f"p{i}", f"{CANARY}{next(counter)}", " p0", "p0"]))
                    for i in range(n)],
            **{c: [cell(COLUMNS[c]) for _ in range(n)] for c in cols},
            "y": [draw(st.sampled_from(LABELS)) for _ in range(n)]}
    delim = draw(st.sampled_from([",", ";", "\t"]))
    buf = io.StringIO()
    pd.DataFrame(data).to_csv(buf, index=False, sep=delim)
    encoding = draw(st.sampled_from(["utf-8", "utf-8", "utf-8-sig", "utf-16", "latin-1"]))
    return buf.getvalue().encode(encoding, errors="replace"), cols


@given(exports())
@settings(max_examples=int(os.environ.get("CLINOGRAPH_FUZZ_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_messy_exports_ingest_completely_or_fail_clearly_without_cell_values(tmp_path_factory, export):
    data, cols = export
    path = tmp_path_factory.mktemp("fuzz") / "t.csv"
    path.write_bytes(data)
    try:
        df = read_table(path)
        t = ingest(df, schema=SCHEMA, dictionary=D)
    except ClinographError as exc:
        leaked = set(_TOKEN.findall(str(exc)))
        assert not leaked, f"cell values in the message: {sorted(leaked)}\n{exc}"
        return
    except Exception as exc:  # pragma: no cover - the property under test
        pytest.fail(f"{type(exc).__name__} escaped ingestion: {exc!r}")
    present = sum(int(df[c].map(lambda x: isinstance(x, str) and x.strip() != "").sum()) for c in cols)
    assert t.report.dropped_patients_missing_label == 0 and t.n_patients == len(df)
    assert t.report.observations == present, "a non-empty feature cell was dropped silently"
