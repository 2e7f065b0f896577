"""Real tables as hospitals export them (session 47: lifelines/sklearn cohorts cut into hospitals,
each file written its own way): what was read wrongly or crashed, now refused or read right."""

import pandas as pd
import pytest
from clinograph.sdk.ingest import ingest, read_table
from clinograph.sdk.ontology import ColumnMap
from tables_helpers import D, wide

from clinograph.core.errors import SchemaError


def test_a_range_typed_in_a_numeric_cell_of_the_first_row_is_a_problem_not_a_crash():
    # '0-5' in row 1 was handed to the unit library (is it a units row?) and pint divided by zero
    df = pd.DataFrame({"pid": ["a", "b", "c"], "y": [1, 0, 1], "hr": ["0-5", "70", "71"], "paco2": [40, 41, 42]})
    with pytest.raises(SchemaError, match=r"Column 'hr' \(heart_rate\): row 1: text where a number"):
        ingest(df, schema=wide(), dictionary=D)


@pytest.mark.parametrize("header", ["PaCO2 (kPa)", "paco2_kPa", "PaCO2 [kPa]"])
def test_a_unit_named_in_the_header_is_not_read_as_the_canonical_unit(header):
    # 'Gewichtsverlust (kg)' mapped without a unit was read in the dictionary's lb, silently
    df = pd.DataFrame({"pid": ["a", "b"], "y": [1, 0], header: [5.3, 5.1]})
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=wide(columns={header: ColumnMap(feature="paco2")}), dictionary=D)
    assert any("its name gives the unit 'kPa'" in p and "unit = 'kPa'" in p for p in err.value.problems)
    # declared, it converts; a header naming the canonical unit or no unit needs nothing
    t = ingest(df, schema=wide(columns={header: ColumnMap(feature="paco2", unit="kPa")}), dictionary=D)
    assert t.value.round(1).tolist() == [39.8, 38.3]
    for ok in ("PaCO2 (mmHg)", "PaCO2 (arterial)", "pco2_art"):
        ingest(df.rename(columns={header: ok}), schema=wide(columns={ok: ColumnMap(feature="paco2")}), dictionary=D)


def test_a_windows_1252_export_is_decoded_as_windows_1252(tmp_path):
    # Excel on Windows writes cp1252: its curly apostrophe (0x92) was decoded as latin-1's control
    # character U+0092, so the header did not match the schema's 'Patient’s HR'
    path = tmp_path / "t.csv"
    path.write_bytes("pid;Patient’s HR;y\na;70;1\nb;80;0\n".encode("cp1252"))
    df = read_table(path)
    assert list(df.columns) == ["pid", "Patient’s HR", "y"] and df.attrs["encoding"] == "cp1252"
    path.write_bytes(b"pid;Gr\xf6\xdfe \x81;y\na;70;1\n")  # 0x81 is not cp1252: latin-1, as before
    assert read_table(path).attrs["encoding"] == "latin-1"
