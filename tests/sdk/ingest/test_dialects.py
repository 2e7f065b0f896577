"""CSV dialects: German Excel (semicolons, decimal commas) declared or detected; wrong dialects named."""

import pytest
from clinograph.sdk.ingest import ingest, read_table
from clinograph.sdk.ontology import ColumnMap
from tables_helpers import CANARY, D, long, wide

from clinograph.core.errors import ConfigError, SchemaError

GERMAN = "pid;hr;PaCO2;ward;y\na;72,5;5,3;3,0;1\nb;80;4,9;icu;0\nc;;1.234,5;3;0\n"
SCHEMA = wide(columns={"PaCO2": ColumnMap(feature="paco2", unit="kPa")})


def _write(tmp_path, text, name="t.csv", encoding="utf-8"):
    path = tmp_path / name
    path.write_bytes(text.encode(encoding))
    return path


def test_german_excel_is_detected(tmp_path):
    df = read_table(_write(tmp_path, GERMAN, encoding="latin-1"))
    assert (df.attrs["delimiter"], df.attrs["decimal"]) == (";", ",")
    assert df["hr"].tolist()[:2] == ["72.5", "80"]
    assert df["PaCO2"].tolist()[2] == "1234.5"
    assert df["ward"].tolist() == ["3.0", "icu", "3"]  # a numeric-looking level, normalised below
    with pytest.raises(SchemaError, match="physically impossible"):  # 1234.5 kPa is read as a number
        ingest(df, schema=SCHEMA, dictionary=D)


def test_german_excel_declared_reads_the_same(tmp_path):
    text = GERMAN.replace("1.234,5", "5,1")
    detected = ingest(read_table(_write(tmp_path, text)), schema=SCHEMA, dictionary=D)
    declared = ingest(read_table(_write(tmp_path, text), delimiter=";", decimal=","), schema=SCHEMA, dictionary=D)
    assert detected.value.tolist() == declared.value.tolist()
    ward = [n for n in D.node_ids() if n.startswith("ward=")]
    nodes = [D.node_ids()[i] for i in detected.node]
    assert nodes.count("ward=3") == 2 and "ward=icu" in nodes and len(ward) == 3  # "3,0" == "3"
    assert 72.5 in detected.value.tolist()


def test_a_declared_dialect_that_does_not_fit_says_what_the_file_looks_like(tmp_path):
    path = _write(tmp_path, GERMAN)
    with pytest.raises(SchemaError, match=r"single column when split at commas.*looks semicolon-separated.*"
                                          r"delimiter=';'") as err:
        read_table(path, delimiter=",")
    assert "72" not in str(err.value).replace(str(tmp_path), "<tmp>")  # no cell value (the path may hold digits)


def test_decimal_commas_without_the_declaration_are_named_not_quoted(tmp_path):
    text = f"pid;hr;y\na;72,5;1\nb;80.5;0\nc;{CANARY};0\n"  # mixed: not detected
    df = read_table(_write(tmp_path, text))
    assert df.attrs["decimal"] == "."
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=wide(), dictionary=D)
    text = str(err.value)
    assert ("row 1: numbers written with a decimal comma. Declare decimal = \",\" in the site schema "
            "(read_table(..., decimal=\",\"); check --decimal ,)") in text
    assert "row 3: text where a number is expected" in text
    assert CANARY not in text and "72" not in text


def test_unknown_dialect_options_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"delimiter '::'.*decimal ';' is not one of"):
        read_table(_write(tmp_path, GERMAN), delimiter="::", decimal=";")


def test_comma_files_are_unchanged(tmp_path):
    df = read_table(_write(tmp_path, "pid,hr,y\na,\"72,5\",1\nb,80.5,0\n"))
    assert (df.attrs["delimiter"], df.attrs["decimal"]) == (",", ".")
    assert df["hr"].tolist() == ["72,5", "80.5"]


@pytest.mark.parametrize("decimal", [None, ","])
def test_a_point_grouped_number_in_a_decimal_comma_file_is_refused_not_read_a_thousand_times_smaller(tmp_path, decimal):
    # before: '1.150' (German Excel's 1150 kcal) in a decimal-comma file was read as 1.15, silently,
    # declared or detected (the detection counted it as a decimal point and chose '.')
    text = "pid;crp;hr;y\na;1.150;72,5;1\nb;2,5;80;0\nc;1,150;60;0\n"
    df = read_table(_write(tmp_path, text), decimal=decimal)
    assert df.attrs["decimal"] == ","
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=wide(), dictionary=D)
    assert err.value.problems == [
        "Column 'crp' (crp): row 1: numbers with a point that reads both as a thousands separator (in a "
        "decimal-comma file '1.234' is 1234) and as a decimal point (1.234), so they are not read. Export the "
        "numbers without thousands separators, or write them with a decimal comma ('1234' or '1,234')."]
    fixed = text.replace("1.150", "1150") + "d;0.125;61;1\n"  # a point not grouping digits by three: a decimal
    ok = ingest(read_table(_write(tmp_path, fixed), decimal=","), schema=wide(), dictionary=D)
    assert sorted(ok.value[ok.node == D.node_index()["crp"]].tolist()) == [0.125, 1.15, 2.5, 1150.0]


def test_a_point_grouped_number_in_a_long_decimal_comma_file_is_refused(tmp_path):
    text = "pid;t;code;v;unit;y\na;0;crp;1.150;mg/L;1\na;1;hr;72,5;/min;1\nb;0;crp;2,5;mg/L;0\n"
    with pytest.raises(SchemaError, match=r"Column 'v\[crp\]' \(crp\): row 1: numbers with a point that reads both"):
        ingest(read_table(_write(tmp_path, text)), schema=long(), dictionary=D)


def test_the_site_schema_declares_the_exports_dialect(tmp_path):
    # before: a dialect detection could not settle (a ';' file mixing '72,5' and '80.5') was fixable only through
    # read_table(..., decimal=",") or check --decimal (tests/sdk/federation/test_load_tables.py: simulate)
    from clinograph.sdk.ingest.read import read_site_table

    path = _write(tmp_path, "pid;hr;y\na;72,5;1\nb;80.5;0\n")
    german = wide(decimal=",")
    assert read_site_table(path, german).attrs["decimal"] == ","
    assert sorted(ingest(read_site_table(path, german), schema=german, dictionary=D).value.tolist()) == [72.5, 80.5]
    assert read_site_table(path, german, decimal=".").attrs["decimal"] == "."  # an explicit argument wins
    assert read_site_table(path, wide(delimiter=";", decimal=",")).attrs["delimiter"] == ";"
    with pytest.raises(ConfigError, match="decimal"):
        wide(decimal=";")
    with pytest.raises(ConfigError, match="delimiter"):
        wide(delimiter='"')


@pytest.mark.parametrize(("text", "decimal", "read"), [
    ("pid;hr;y\na;1,234.5;1\nb;80.5;0\n", ".", ["1234.5", "80.5"]),  # both separators, the point last
    ("pid;hr;y\na;1,234.5;1\nb;80;0\n", ".", ["1234.5", "80"]),  # the one fractional number settles the file
    ("pid;hr;y\na;-1,234,567;1\nb;80;0\n", ".", ["-1234567", "80"]),  # two comma groups: not a decimal comma
    ("pid;hr;y\na;1.234,5;1\nb;80,5;0\n", ",", ["1234.5", "80.5"]),  # the decimal-comma locale's own form
    ("pid;hr;y\na;1.234.567;1\nb;80,5;0\n", ",", ["1234567", "80.5"]),  # two point groups: not a decimal point
    ("pid,hr,y\na,\"12,345.25\",1\n", ".", ["12345.25"]),  # quoted in a comma-separated file
])
def test_thousands_separators_that_cannot_be_decimal_are_read(tmp_path, text, decimal, read):
    """'1,234.5' was refused as 'a comma that reads both as a thousands separator and as a decimal
    comma', though a decimal point after it makes the comma a thousands separator."""
    df = read_table(_write(tmp_path, text))
    assert df.attrs["decimal"] == decimal and df["hr"].tolist() == read


@pytest.mark.parametrize(("text", "message", "decimal"), [
    ("pid;hr;y\na;1,175;1\nb;80;0\n", "row 1: numbers with a comma that reads both", None),  # 1175 or 1.175
    ("pid;hr;y\na;1,175;1\nb;80.5;0\n", "row 1: numbers with a comma that reads both", None),  # even in a decimal-point file
    ("pid;hr;y\na;1,175;1\nb;80;0\n", "row 1: numbers with a comma that reads both", "."),  # and with "." declared
    ("pid;hr;y\na;1.150;1\nb;80,5;0\n", "row 1: numbers with a point that reads both", None),  # 1150 or 1.15
    ("pid;hr;y\na;1,234.5;1\nb;80,5;0\n", "row 2: numbers written with a decimal comma", None),  # one of each: '.'
    ("pid;hr;y\na;1,234.5;1\nb;80,5;0\n", "row 1: numbers with a comma that reads both", ","),  # order wrong for ','
    ("pid;hr;y\na;1.234,5;1\nb;80.5;0\nc;81.5;0\n", "row 1: numbers written with a decimal comma", None),  # for '.'
    ("pid;hr;y\na;1,23,456.5;1\nb;80.5;0\n", "row 1: text where a number is expected", None),  # not 3-digit groups
])
def test_thousands_separators_that_could_be_decimal_are_still_refused(tmp_path, text, message, decimal):
    with pytest.raises(SchemaError, match=message):
        ingest(read_table(_write(tmp_path, text), decimal=decimal), schema=wide(), dictionary=D)
