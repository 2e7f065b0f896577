"""Bad input gets a clear error naming column/rows and the fix -- every problem at once, no cell values."""

import re

import numpy as np
import pandas as pd
import pytest
from clinograph.sdk.datasets.alarm import load_dictionary
from clinograph.sdk.ingest import ingest, read_table
from clinograph.sdk.ontology import ColumnMap, SiteSchema

from clinograph.core.errors import ConfigError, SchemaError

D = load_dictionary()


def schema(**kw):
    base = dict(site="h1", patient_id="pid", label="y",
                columns={"HR": ColumnMap(feature="heart_rate", unit="bpm"),
                         "GLU": ColumnMap(feature="glucose", unit="mg/dL"),
                         "Temp": ColumnMap(feature="temperature", unit="degF")})
    base.update(kw)
    return SiteSchema(**base)


def good():
    return pd.DataFrame({"pid": ["a", "b", "c", "d"], "HR": [70, 80, np.nan, 120],
                         "GLU": [90.0, 180.156, 100, 110], "Temp": [98.6, 99.5, 97.0, 101.0], "y": [0, 1, 0, 1]})


def test_good_table_converts_units_and_standardises():
    t = ingest(good(), schema=schema(), dictionary=D)
    assert t.n_patients == 4
    glu = t.value[t.node == D.node_index()["glucose"]]
    assert glu[1] == pytest.approx(10.0, rel=1e-4)
    temp = t.value[t.node == D.node_index()["temperature"]]
    assert temp[0] == pytest.approx(37.0, abs=1e-3)
    assert t.report.converted_columns == {"GLU": "mg/dL -> mmol/L", "Temp": "degF -> degC"}
    assert t.patient.size == 11  # one missing heart rate is simply absent, not imputed


def test_every_problem_of_a_table_is_reported_at_once_without_cell_values():
    df = good()
    df["HR"] = df["HR"].astype(object)
    df.loc[0, "HR"] = "72 bpm"          # unit string in a cell
    df.loc[1, "HR"] = "tachy"           # text in a numeric column
    df.loc[3, "HR"] = 1000              # physically impossible
    df["GLU"] = df["GLU"].astype(float)
    df.loc[2, "GLU"] = np.inf           # infinite
    df["Na+"] = [140, 141, 139, 138]    # unknown column
    df.loc[3, "pid"] = "a"              # duplicate id
    df.loc[2, "y"] = 2                  # non-binary label
    df.loc[1, "y"] = np.nan             # missing label
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=schema(), dictionary=D)
    text = str(err.value)
    assert len(err.value.problems) >= 7
    assert "Column 'HR' (heart_rate): row 1: number with a unit string" in text
    assert "Column 'HR' (heart_rate): row 2: text where a number is expected" in text
    assert "row 4: physically impossible" in text
    assert "Column 'GLU' (glucose): row 3: infinite value" in text
    assert "Column 'Na+' is not in the feature dictionary" in text and "Map it in the site schema" in text
    assert "rows 1, 4: repeated id" in text
    assert "Label column 'y': row 3: not binary" in text
    assert "Label column 'y': row 2: no label" in text and 'missing_label = "drop"' in text
    for secret in ("tachy", "72 bpm", "1000"):
        assert secret not in text


def test_unknown_column_suggests_nearest_dictionary_entries():
    df = good().rename(columns={"HR": "hart_rate"})
    with pytest.raises(SchemaError, match=r"Column 'hart_rate' is not in the feature dictionary .*nearest: \['heart_rate'"):
        ingest(df, schema=schema(columns={"GLU": ColumnMap(feature="glucose", unit="mg/dL")}), dictionary=D)


def test_empty_table_and_all_missing_feature():
    with pytest.raises(SchemaError, match="is empty"):
        ingest(good().iloc[:0], schema=schema(), dictionary=D)
    df = good()
    df["Temp"] = np.nan  # not measured at this hospital: as an absent column, reported (was an error for all)
    t = ingest(df, schema=schema(), dictionary=D)
    assert t.report.empty_columns == ("Temp",) and "temperature" not in {
        D.node_ids()[int(n)] for n in t.node}
    assert t.n_patients == len(df)
    df["Temp"] = ["37 degC", None, None, None]  # refused cells: their problem, not 'no usable value' as well
    with pytest.raises(SchemaError, match="number with a unit string") as err:
        ingest(df, schema=schema(), dictionary=D)
    assert [p for p in err.value.problems if "'Temp'" in p] == [next(p for p in err.value.problems if "Temp" in p)]


def test_schema_mapping_to_unknown_feature_or_unconvertible_unit():
    bad = schema(columns={"HR": ColumnMap(feature="heartrate", unit="bpm"),
                          "GLU": ColumnMap(feature="glucose", unit="furlongs")})
    with pytest.raises(SchemaError) as err:
        ingest(good(), schema=bad, dictionary=D)
    text = str(err.value)
    assert "maps to feature 'heartrate', which is not in dictionary" in text
    assert "cannot convert unit 'furlongs'" in text


def test_drop_policy_counts_what_it_drops():
    df = good()
    df.loc[1, "y"] = np.nan
    t = ingest(df, schema=schema(policy={"missing_label": "drop"}), dictionary=D)
    assert t.n_patients == 3 and t.report.dropped_patients_missing_label == 1


def test_ignored_columns_are_reported():
    df = good()
    df["ward"] = ["x"] * 4
    t = ingest(df, schema=schema(ignore=("ward",)), dictionary=D)
    assert t.report.ignored_columns == ("ward",)


def test_long_table_gives_snapshots_and_constant_labels():
    rows = []
    for pid, y in (("a", 0), ("b", 1)):
        for t in (0, 4, 8):
            rows.append({"patient_id": pid, "time": t, "feature": "HR", "value": 70 + t, "label": y})
            rows.append({"patient_id": pid, "time": t, "feature": "glucose", "value": 5.0, "label": y})
    df = pd.DataFrame(rows)
    s = SiteSchema(site="h2", format="long", label="label", columns={"HR": ColumnMap(feature="heart_rate")})
    t = ingest(df, schema=s, dictionary=D)
    assert t.n_patients == 2 and t.n_snapshots == 3 and list(t.labels) == [0, 1]
    df.loc[0, "label"] = 1
    with pytest.raises(SchemaError, match="have different labels on different rows"):
        ingest(df, schema=s, dictionary=D)


def test_csv_and_parquet_read_the_same(tmp_path):
    df = good()
    df.to_csv(tmp_path / "t.csv", index=False)
    df.to_parquet(tmp_path / "t.parquet")
    a = ingest(read_table(tmp_path / "t.csv"), schema=schema(), dictionary=D)
    b = ingest(read_table(tmp_path / "t.parquet"), schema=schema(), dictionary=D)
    np.testing.assert_allclose(a.std_value, b.std_value)
    with pytest.raises(ConfigError, match="unsupported extension '.xlsx'; use .csv or .parquet"):
        (tmp_path / "t.xlsx").write_bytes(b"x")
        read_table(tmp_path / "t.xlsx")


def test_site_schema_from_toml_names_unknown_keys(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('site = "h1"\npatient_ids = "mrn"\n')
    with pytest.raises(ConfigError, match="patient_ids"):
        SiteSchema.from_toml(p)


def test_ingest_with_its_arguments_swapped_names_them():
    """ingest(df, schema=dictionary, dictionary=schema): an AttributeError ('no attribute policy') before."""
    d, schema = load_dictionary(), SiteSchema(site="x", patient_id="p", label="y")
    df = pd.DataFrame({"p": ["a"], "y": [0]})
    with pytest.raises(SchemaError, match=r"ingest\(\) needs schema= a SiteSchema, got FeatureDictionary\. Pass "
                                          r"cg\.SiteSchema\.from_toml\('site\.toml'\)"):
        ingest(df, schema=d, dictionary=d)
    with pytest.raises(SchemaError, match=r"needs dictionary= a FeatureDictionary, got SiteSchema"):
        ingest(df, schema=schema, dictionary=schema)


@pytest.mark.parametrize(("args", "kwargs", "message"), [
    ((None,), {}, "expected the path as a file name (str or pathlib.Path), got NoneType"),
    ((5,), {}, "got int"),
    ((b"site.csv",), {}, "got bytes"),
    (("site.csv",), {"delimiter": 1}, "expected delimiter as one character (a str), got int"),
    (("site.csv",), {"decimal": b","}, "expected decimal as one character (a str), got bytes")])
def test_read_table_names_a_wrong_argument_type(args, kwargs, message):
    """A TypeError from pathlib (or len() of an int) before: outside the one exception tree."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        read_table(*args, **kwargs)
