"""Fuzz: random CSV bytes through read_table + ingest.

Whatever the bytes (encodings with and without byte-order marks, delimiters, ragged rows,
header or not, odd column labels), the only exceptions are ClinographError subclasses, and no
message carries a cell value that was not a column header: every data cell holds a unique
canary string, and any canary in a message must be one of the header's cells.
"""

from __future__ import annotations

import os
import re

import pytest
from clinograph.sdk.ingest import ingest, read_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tables_helpers import CANARY, ColumnMap, D, long, wide

from clinograph.core.errors import ClinographError

LABELS = ["pid", "y", "hr", "HR", "pulse", "sex", "ward", "crp", "paco2", "t", "code", "v", "unit", "", "1", "2.5",
          "Na+", "é", 'q"x', " hr ", "note"]
PLAIN_CELLS = ["", " ", "0", "1", "F", "M", "yes", "70", "80.5", "1e308", "-1e300", "nan", "NA", "inf", "72 bpm",
               "kPa", "icu", "general", "3.0", "hr", "paco2", "é", "\u2603", '"', "x;y"]
ENCODINGS = ["utf-8"] * 4 + ["utf-8-sig", "utf-16", "utf-16-le", "utf-32", "latin-1", "cp1252"]
_TOKEN = re.compile(re.escape(CANARY) + r"\d+")


REQUIRED = {"wide": ["pid", "y"], "wide_coded": ["pid", "y"], "long": ["pid", "t", "code", "v", "unit", "y"]}
EXTRA = ["hr", "HR", "pulse", "sex", "ward", "crp", "paco2", "note", "", "1", "Na+", "é", 'q"x', " hr "]
BY_LABEL = {"y": ["0", "1", "1", "0", "", "yes", "2"], "t": ["0", "1", "2.5", "", "x"],
            "code": ["hr", "paco2", "sex", "ward", "crp", "HR", ""], "unit": ["", "kPa", "mmHg", "/min", "bpm"]}


@st.composite
def tables(draw):
    counter = iter(range(10**6))
    which = draw(st.sampled_from(["wide", "wide_coded", "long"]))

    def cell(label):
        if draw(st.integers(0, 3)) == 0:
            return f"{CANARY}{next(counter)}"
        if label in BY_LABEL and draw(st.booleans()):
            return draw(st.sampled_from(BY_LABEL[label]))
        return draw(st.sampled_from(PLAIN_CELLS))

    mode = draw(st.sampled_from(["plausible", "plausible", "random", "none"]))
    if mode == "plausible":
        extra = draw(st.lists(st.sampled_from(EXTRA), max_size=3))
        header = draw(st.permutations(REQUIRED[which] + extra))
    else:
        header = draw(st.lists(st.sampled_from(LABELS), min_size=1, max_size=6))
    width = len(header)
    rows = [[cell(header[i] if i < width else "") for i in range(max(0, width + draw(
        st.sampled_from([0] * 8 + [-1, 1]))))] for _ in range(draw(st.integers(0, 6)))]
    delim = draw(st.sampled_from([",", ";", "\t", "|"]))
    lines = ([header] if mode != "none" else []) + rows
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    text = newline.join(delim.join(r) for r in lines) + draw(st.sampled_from(["", newline, newline * 2]))
    encoding = draw(st.sampled_from(ENCODINGS))
    data = text.encode(encoding, errors="replace")
    header_cells = set(lines[0]) if lines else set()
    return data, header_cells, which


SCHEMAS = {
    "wide": wide(ignore=("note",)),
    "wide_coded": wide(columns={"sex": ColumnMap(feature="sex", coding={"F": 0, "M": 1}),
                                "paco2": ColumnMap(feature="paco2", unit="kPa")}),
    "long": long(),
}


@given(tables())
@settings(max_examples=int(os.environ.get("CLINOGRAPH_FUZZ_EXAMPLES", "150")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow])
def test_random_csv_bytes_end_in_a_table_or_a_clinograph_error_without_cell_values(tmp_path_factory, table):
    data, header_cells, which = table
    path = tmp_path_factory.mktemp("fuzz") / "t.csv"
    path.write_bytes(data)
    try:
        ingest(read_table(path), schema=SCHEMAS[which], dictionary=D)
    except ClinographError as exc:
        text = str(exc)
        leaked = {tok for tok in _TOKEN.findall(text)} - {c.strip() for c in header_cells}
        assert not leaked, f"cell values in the message: {sorted(leaked)}\n{text}"
    except Exception as exc:  # pragma: no cover - the property under test
        pytest.fail(f"{type(exc).__name__} escaped ingestion: {exc!r}")
