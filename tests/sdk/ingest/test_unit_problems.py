"""Unit problems in ingestion: each reported once; UCUM units in a long table's unit column."""

import numpy as np
import pandas as pd
import pytest
from clinograph.sdk.ingest import ingest
from clinograph.sdk.ontology import ColumnMap
from tables_helpers import D, long, wide

from clinograph.core.errors import SchemaError


def test_a_bad_schema_unit_is_reported_once():
    df = pd.DataFrame({"pid": ["a", "b"], "y": [0, 1], "HR": [70, 80], "PaCO2": [5.3, 5.1]})
    s = wide(columns={"HR": ColumnMap(feature="heart_rate", unit="furlongs"),
                      "PaCO2": ColumnMap(feature="paco2", unit="mg/dL")})
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=s, dictionary=D)
    problems = err.value.problems
    assert sum("cannot convert unit 'furlongs'" in p for p in problems) == 1
    assert sum("cannot convert unit 'mg/dL'" in p for p in problems) == 1
    assert len(problems) == len(set(problems))


def test_ucum_unit_cells_convert_and_spellings_of_one_unit_are_one_unit():
    df = pd.DataFrame({"pid": ["a", "a", "b"], "t": [0, 1, 0], "y": [1, 1, 0], "code": ["paco2"] * 3,
                       "v": [40.0, 42.0, 38.0], "unit": ["mm[Hg]", "mmHg", "mm Hg"]})
    t = ingest(df, schema=long(), dictionary=D)
    assert sorted(t.value.tolist()) == [38.0, 40.0, 42.0]
    # one code in two units (a lab that changed analysers): each row converted from its own unit
    df["unit"], df["v"] = ["kPa", "mm[Hg]", "kPa"], [5.0, 42.0, 6.0]
    t = ingest(df, schema=long(), dictionary=D)
    assert sorted(np.round(t.value, 2).tolist()) == [37.5, 42.0, 45.0]
    assert t.report.converted_columns == {"paco2": "kPa, mmHg -> mmHg"}
    df["unit"] = ["kPa", "mg/dL", "kPa"]  # a unit of another dimension is still refused, by name
    with pytest.raises(SchemaError, match=r"cannot convert unit 'mg/dL'"):
        ingest(df, schema=long(), dictionary=D)
