"""Hardening of ingestion: no cell value in a message, nothing changed silently, no traceback."""

from __future__ import annotations

import os
import tomllib

import numpy as np
import pandas as pd
import pytest
from clinograph.sdk.ingest import ingest, read_table
from clinograph.sdk.ontology import Feature, FeatureDictionary, FeatureKind, SiteSchema
from tables_helpers import CANARY, ColumnMap, D, long, wide

from clinograph.core.errors import ClinographError, ConfigError, SchemaError


def _csv(tmp_path, text: str | bytes, name="t.csv"):
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


# -- 11. never a cell value in a message -------------------------------------------------
def test_csv_without_header_row_says_so_without_echoing_the_first_patient(tmp_path):
    p = _csv(tmp_path, f"{CANARY}-007,72.5,1\np2,80,0\n")
    with pytest.raises(SchemaError, match="seems to have no header row") as err:
        ingest(read_table(p), schema=wide(), dictionary=D)
    assert CANARY not in str(err.value) and "72.5" not in str(err.value)


def test_text_only_first_row_without_header_is_not_echoed(tmp_path):
    p = _csv(tmp_path, f"{CANARY}a,{CANARY}b,yes\n")
    with pytest.raises(SchemaError, match="no header row") as err:
        ingest(read_table(p), schema=wide(), dictionary=D)
    assert CANARY not in str(err.value)


def test_long_unknown_feature_codes_are_counted_not_quoted():
    df = pd.DataFrame({"pid": ["a"] * 9, "t": range(9), "y": [1] * 9, "unit": [None] * 9,
                       "code": ["hr", "hr", "hr", f"{CANARY}1", f"{CANARY}2", f"{CANARY}3", f"{CANARY}1", "hr",
                                f"{CANARY}3"], "v": [70] * 9})
    with pytest.raises(SchemaError, match=r"Feature column 'code': 3 distinct feature code\(s\) in rows 4, 5, 6, 7, "
                                          r"9 are not in the feature dictionary") as err:
        ingest(df, schema=long(), dictionary=D)
    assert CANARY not in str(err.value)


def test_long_unit_cells_are_named_only_if_they_are_known_units():
    df = pd.DataFrame({"pid": ["a", "a", "b"], "t": [0, 1, 0], "y": [1, 1, 0], "code": ["paco2"] * 3,
                       "v": [5.0, 5.1, 4.9], "unit": [f"{CANARY}u", "kPa", "kPa"]})
    with pytest.raises(SchemaError, match="1 unit string\\(s\\) are not known units") as err:
        ingest(df, schema=long(), dictionary=D)
    assert CANARY not in str(err.value)
    df["unit"] = ["kPa", "mmHg", "kPa"]  # several units of one code: each row converted from its own
    t = ingest(df, schema=long(), dictionary=D)
    assert sorted(np.round(t.value, 2).tolist()) == [5.1, 36.75, 37.5]
    assert t.report.converted_columns == {"paco2": "kPa, mmHg -> mmHg"}
    df["unit"] = ["kPa"] * 3
    t = ingest(df, schema=long(), dictionary=D)
    assert t.report.converted_columns == {"paco2": "kPa -> mmHg"}


# -- 12. nothing changed silently -----------------------------------------------------------
def test_long_rows_without_patient_id_are_an_error():
    df = pd.DataFrame({"pid": ["a", None, " "], "t": [0, 0, 0], "y": [1, 1, 1], "code": ["hr"] * 3, "v": [70, 71, 72],
                       "unit": [None] * 3})
    with pytest.raises(SchemaError, match=r"Patient id column 'pid': rows 2, 3: no id"):
        ingest(df, schema=long(), dictionary=D)


def test_unit_conversion_overflow_is_an_error_not_missing():
    df = pd.DataFrame({"pid": ["a", "b"], "PaCO2": ["1e308", "5"], "y": [0, 1]})
    s = wide(columns={"PaCO2": ColumnMap(feature="paco2", unit="kPa")})
    with pytest.raises(SchemaError, match=r"Column 'PaCO2' \(paco2\): row 1: the value overflows when converted"):
        ingest(df, schema=s, dictionary=D)


def test_value_without_physical_limit_has_a_sane_magnitude_bound():
    df = pd.DataFrame({"pid": ["a", "b"], "crp": ["1e300", "3"], "y": [0, 1]})
    with pytest.raises(SchemaError, match=r"row 1: magnitude above 1e\+15 .*no physical limit on that side for 'crp'"):
        ingest(df, schema=wide(), dictionary=D)
    only_min = FeatureDictionary(name="m", version=1, features=(
        Feature(id="crp", name="CRP", kind=FeatureKind.NUMERIC, reference_low=0, reference_high=5, physical_min=0),))
    with pytest.raises(SchemaError, match=r"row 1: magnitude above 1e\+15"):
        ingest(df, schema=wide(), dictionary=only_min)


def test_two_columns_resolving_to_one_feature_are_an_error():
    df = pd.DataFrame({"pid": ["a", "b"], "hr": [70, 80], "HR": [71, 81], "y": [0, 1]})
    with pytest.raises(SchemaError, match=r"Columns \['HR', 'hr'\] all resolve to feature 'heart_rate'"):
        ingest(df, schema=wide(), dictionary=D)
    df = pd.DataFrame({"pid": ["a", "b"], "pulse": [70, 80], "Heart": [71, 81], "y": [0, 1]})
    with pytest.raises(SchemaError, match=r"Columns \['Heart', 'pulse'\] all resolve"):
        ingest(df, schema=wide(columns={"Heart": ColumnMap(feature="heart_rate")}), dictionary=D)


def test_conflicting_duplicate_long_observations_are_an_error_and_exact_repeats_counted():
    df = pd.DataFrame({"pid": ["a", "a", "a", "b"], "t": [0, 0, 1, 0], "y": [1, 1, 1, 0], "code": ["hr"] * 4,
                       "v": [70, 70, 75, 80], "unit": [None] * 4})
    t = ingest(df, schema=long(), dictionary=D)
    assert t.report.duplicate_observations_dropped == 1 and t.report.observations == 3
    df.loc[1, "v"] = 99
    with pytest.raises(SchemaError, match=r"rows 1, 2: the same patient, time and feature is recorded more than once"):
        ingest(df, schema=long(), dictionary=D)


@pytest.mark.parametrize("fmt", ["wide", "long"])
def test_ids_that_differ_only_by_whitespace_are_an_error(fmt):
    if fmt == "wide":
        df = pd.DataFrame({"pid": ["p1", " p1", "p2"], "hr": [70, 80, 90], "y": [0, 1, 0]})
        schema = wide()
    else:
        df = pd.DataFrame({"pid": ["p1", "p1 ", "p 2", "p2"], "t": [0, 1, 0, 0], "y": [0, 0, 1, 1],
                           "code": ["hr"] * 4, "v": [70, 71, 72, 73], "unit": [None] * 4})
        schema = long()
    with pytest.raises(SchemaError, match="differ from another id only by whitespace") as err:
        ingest(df, schema=schema, dictionary=D)
    assert "p1" not in str(err.value).replace("'pid'", "")


def test_dictionary_alias_of_two_features_infinite_bound_and_nan_limit_are_refused():
    hr = dict(id="hr2", name="HR two", kind=FeatureKind.NUMERIC, reference_low=60, reference_high=100)
    with pytest.raises(ConfigError, match=r"belong to several: 'pulse' -> heart_rate, hr2"):
        FeatureDictionary(name="x", version=1, features=(D.get("heart_rate"), Feature(**hr, aliases=("Pulse",))))
    with pytest.raises(ConfigError, match="reference_high is infinite"):
        Feature(**{**hr, "reference_high": float("inf")})
    with pytest.raises(ConfigError, match="physical_max is NaN"):
        Feature(**hr, physical_max=float("nan"))


def test_schema_without_label_is_an_error_unless_declared_unlabeled():
    with pytest.raises(ConfigError, match="label is not set: without a label column every patient would"):
        SiteSchema(site="h1", label=None)
    s = SiteSchema(site="h1", patient_id="pid", label=None, unlabeled=True)
    t = ingest(pd.DataFrame({"pid": ["a", "b"], "hr": [70, 80]}), schema=s, dictionary=D)
    assert list(t.labels) == [-1, -1] and t.report.labelled is False
    with pytest.raises(ConfigError, match="unlabeled = true but label"):
        SiteSchema(site="h1", label="y", unlabeled=True)


# -- 13. no tracebacks ------------------------------------------------------------------------
GOOD = "pid,hr,y\np1,70,0\np2,80,1\n"


@pytest.mark.parametrize("encoding", ["utf-16", "utf-8-sig", "utf-32"])
def test_files_with_a_byte_order_mark_are_decoded(tmp_path, encoding):
    t = ingest(read_table(_csv(tmp_path, GOOD.encode(encoding))), schema=wide(), dictionary=D)
    assert t.n_patients == 2 and t.report.encoding == encoding.removesuffix("-sig")


def test_utf16_without_bom_is_a_clear_error(tmp_path):
    with pytest.raises(SchemaError, match="looks like UTF-16 or UTF-32 without a byte-order mark. Export it as UTF-8"):
        read_table(_csv(tmp_path, GOOD.encode("utf-16-le")))


def test_latin1_byte_in_an_ignored_column_is_accepted(tmp_path):
    p = _csv(tmp_path, "pid,hr,note,y\np1,70,S\xf6ren,0\np2,80,x,1\n".encode("latin-1"))
    t = ingest(read_table(p), schema=wide(ignore=("note",)), dictionary=D)
    assert t.n_patients == 2 and t.report.encoding == "cp1252" and t.report.ignored_columns == ("note",)


def test_ragged_rows_are_reported_by_row_number(tmp_path):
    p = _csv(tmp_path, f"pid,hr,y\np1,70,0,{CANARY}\np2,80\np3,90,1\n")
    with pytest.raises(SchemaError) as err:
        read_table(p)
    text = str(err.value)
    assert "data row 1 have more fields than the header (3)" in text
    assert "data row 2 have fewer fields than the header (3)" in text and CANARY not in text


@pytest.mark.parametrize("content", [b"", b"   \n\t\n", b"\xef\xbb\xbf"])
def test_empty_or_whitespace_only_files(tmp_path, content):
    with pytest.raises(SchemaError, match="is empty or holds only whitespace"):
        read_table(_csv(tmp_path, content))


def test_header_only_file_is_an_empty_table(tmp_path):
    with pytest.raises(SchemaError, match="is empty \\(0 rows\\)"):
        ingest(read_table(_csv(tmp_path, "pid,hr,y\n")), schema=wide(), dictionary=D)


def test_a_table_without_columns_is_named_empty_not_a_missing_header(tmp_path):
    """An empty Parquet file or a DataFrame without columns was 'seems to have no header row ... 0 of
    its 0 fields look like numbers' (found by the Parquet dtype fuzzer)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({}), tmp_path / "t.parquet")
    with pytest.raises(SchemaError, match=r"Table .*t\.parquet has no columns"):
        read_table(tmp_path / "t.parquet")
    with pytest.raises(SchemaError, match=r"The table for site 'h1' has no columns") as err:
        ingest(pd.DataFrame(), schema=wide(), dictionary=D)
    assert "seems to have no header row" not in str(err.value)


def test_a_parquet_table_without_the_schemas_columns_names_them_not_a_missing_header_row(tmp_path):
    """Parquet has no header row to lose: a file of other columns was 'seems to have no header row'
    (the CSV heuristic); now the missing patient-id and label columns are named."""
    pd.DataFrame({"a": ["1"], "b": ["2"]}).to_parquet(tmp_path / "t.parquet")
    with pytest.raises(SchemaError) as err:
        ingest(read_table(tmp_path / "t.parquet"), schema=wide(), dictionary=D)
    text = str(err.value)
    assert "no header row" not in text
    assert "The label column 'y' is missing" in text and "'pid'" in text


def test_directory_and_fifo_are_refused_before_opening(tmp_path):
    (tmp_path / "dir.csv").mkdir()
    with pytest.raises(ConfigError, match="is a directory, not a regular file"):
        read_table(tmp_path / "dir.csv")
    with pytest.raises(ConfigError, match="is a directory, not a regular file"):  # before: "unsupported extension ''"
        read_table(tmp_path)
    with pytest.raises(ConfigError, match="is a device, pipe or socket, not a regular file"):
        read_table("/dev/null")
    os.mkfifo(tmp_path / "pipe.csv")
    with pytest.raises(ConfigError, match="is a FIFO \\(named pipe\\), not a regular file"):
        read_table(tmp_path / "pipe.csv")


def test_semicolon_and_tab_delimiters_are_detected(tmp_path):
    for name, text in (("s.csv", GOOD.replace(",", ";")), ("t.tsv", GOOD.replace(",", "\t"))):
        assert ingest(read_table(_csv(tmp_path, text, name)), schema=wide(), dictionary=D).n_patients == 2


def test_broken_parquet_and_quoting(tmp_path):
    with pytest.raises(SchemaError, match="not a readable Parquet file"):
        read_table(_csv(tmp_path, b"PAR1 not really", "t.parquet"))
    with pytest.raises(SchemaError, match="not valid CSV near line"):
        read_table(_csv(tmp_path, 'pid,hr,y\np1,"70,0\n'))


@pytest.mark.parametrize("head, found", [(b"PK\x03\x04\x14\x00\x06\x00", "an Excel .xlsx workbook.*CSV UTF-8"),
                                         (b"\x1f\x8b\x08\x00", "gzip-compressed.*gunzip"),
                                         (b"PAR1\x15\x04", "a Parquet file.*Rename it to .parquet")])
def test_a_workbook_archive_or_parquet_saved_as_csv_is_named(tmp_path, head, found):
    with pytest.raises(SchemaError, match=found):
        read_table(_csv(tmp_path, head + bytes(range(256)) * 4))
    with pytest.raises(ConfigError, match=r"unsupported extension '.xlsx'; use .csv or .parquet \(save the sheet as"):
        read_table(_csv(tmp_path, head, "t.xlsx"))


@pytest.mark.parametrize("columns, message", [
    (pd.MultiIndex.from_tuples([("a", "pid"), ("a", "hr"), ("b", "y")]), "hierarchical \\(MultiIndex\\)"),
    ([0, 1, 2], "All 3 column labels are not text"),
    (["pid", 5, "y"], "Columns at positions 2 have labels that are not text \\(int\\)"),
    (["pid", "hr", "hr", "y"], "Column labels \\['hr'\\] appear more than once"),
])
def test_dataframes_with_unusable_column_labels(columns, message):
    df = pd.DataFrame(np.array([["p1"] + ["1"] * (len(columns) - 1)]), columns=columns)
    with pytest.raises(SchemaError, match=message):
        ingest(df, schema=wide(), dictionary=D)


def test_non_dataframe_input_is_a_schema_error():
    with pytest.raises(ClinographError, match="needs a pandas DataFrame"):
        ingest(None, schema=wide(), dictionary=D)  # type: ignore[arg-type]


# -- 16. declared codings -----------------------------------------------------------------------
def _sex(codes, coding=None):
    df = pd.DataFrame({"pid": [f"p{i}" for i in range(len(codes))], "sex": codes, "y": [0] * len(codes)})
    return ingest(df, schema=wide(columns={"sex": ColumnMap(feature="sex", coding=coding)}), dictionary=D)


def test_undeclared_binary_coding_is_an_error_naming_the_codes():
    with pytest.raises(SchemaError, match=r"Column 'sex' \(sex\): rows 1, 2, 3, 4: codes that are not a declared "
                                          r"binary coding \(seen: 'F', 'M'\)") as err:
        _sex(["F", "M", "F", "M"])
    # the fix names the column's own codes and the feature's meaning, and never proposes which is 1:
    # before, it suggested { "F" = 0, "M" = 1 }, which pasted under a sex_female column inverts it
    text = str(err.value)
    assert "coding = { \"F\" = ?, \"M\" = ? }" in text and "means 'sex' (" in text
    assert "\"F\" = 0" not in text and "\"M\" = 1" not in text


def test_binary_coding_fix_cannot_invert_a_sex_female_column():
    from clinograph.sdk.ingest.cells import binary_coding_fix
    from clinograph.sdk.ontology.dictionary import Feature

    female = Feature(id="sex_female", name="Female sex", kind="binary")
    fix = binary_coding_fix("gender", female, ["F", "M"])
    assert "[columns.'gender'] coding = { \"F\" = ?, \"M\" = ? }" in fix and "'sex_female' (Female sex)" in fix
    with pytest.raises(tomllib.TOMLDecodeError):  # pasted as is, it is refused, not silently inverted
        tomllib.loads("coding = " + fix.split("coding = ", 1)[1].split(", each ?", 1)[0])
    anon = binary_coding_fix("gender", female, [])
    assert "\"<code meaning sex_female>\" = 1" in anon and "\"<code meaning not sex_female>\" = 0" in anon


def test_undeclared_y_n_feature_is_refused_with_the_fix_and_declared_y_n_is_read():
    # docs/quickstart.md: Y/N must be declared for a feature column (labels read it: Y = the outcome happened)
    with pytest.raises(SchemaError, match=r"rows 1, 2, 3, 4: codes that are not a declared binary coding \(seen: "
                                          r"'N', 'Y'\); without a coding only 0/1, true/false, yes/no are read. "
                                          r"Y/N is not read without a coding .*If 'Y' means 'sex' \(.*\) is true, "
                                          r"declare \[columns.'sex'\] coding = \{ \"Y\" = 1, \"N\" = 0 \}"):
        _sex(["Y", "N", "N", "Y"])
    assert list(_sex(["Y", "N", "n"], coding={"Y": 1, "N": 0}).value) == [1.0, 0.0, 0.0]
    assert list(_sex(["yes", "no", "1"]).value) == [1.0, 0.0, 1.0]


def test_declared_binary_coding_is_applied():
    t = _sex(["F", "M", " f ", "m"], coding={"F": 0, "M": 1})
    assert list(t.value) == [0.0, 1.0, 0.0, 1.0]
    with pytest.raises(SchemaError, match=r"row 3: codes not in the coding declared"):
        _sex(["F", "M", "X"], coding={"F": 0, "M": 1})


def test_codes_seen_are_capped_and_one_off_text_is_never_shown():
    codes = [f"c{i}" for i in range(12) for _ in range(2)] + [f"{CANARY}-unique", "x" * 25, "x" * 25]
    with pytest.raises(SchemaError) as err:
        _sex(codes)
    text = str(err.value)
    assert CANARY not in text and "x" * 21 not in text
    assert text.count("'c") == 10 and "4 other code(s) not shown" in text


def test_categorical_level_map_and_numeric_looking_levels():
    df = pd.DataFrame({"pid": ["a", "b", "c", "d"], "ward": ["1", "2.0", "3.0", " 2 "], "y": [0, 1, 0, 1]})
    s = wide(columns={"ward": ColumnMap(feature="ward", coding={"1": "icu", "2": "general", "3": "3"})})
    t = ingest(df, schema=s, dictionary=D)
    idx = D.node_index()
    assert list(t.node) == [idx["ward=icu"], idx["ward=general"], idx["ward=3"], idx["ward=general"]]
    df["ward"] = ["ICU", "general", "3.0", "4"]
    with pytest.raises(SchemaError, match=r"row 4: codes that are not levels \['icu', 'general', '3'\] of the dictionary \(seen: 1 other code"):
        ingest(df, schema=wide(), dictionary=D)


def test_bad_codings_in_the_schema_are_reported_together():
    s = wide(columns={"sex": ColumnMap(feature="sex", coding={"F": 0, "f ": 1, "M": 2}),
                      "ward": ColumnMap(feature="ward", coding={"1": "nowhere"}),
                      "hr": ColumnMap(feature="heart_rate", coding={"a": 1})})
    df = pd.DataFrame({"pid": ["a"], "sex": ["F"], "ward": ["1"], "hr": [70], "y": [0]})
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=s, dictionary=D)
    text = str(err.value)
    assert "coding keys ['F', 'f '] are the same code" in text
    assert "coding values for ['M'] must be 0 or 1: 1 for the code(s) that mean 'sex' (" in text
    assert "coding for ['1'] must map to one of the dictionary levels" in text
    assert "a coding is only for binary or categorical features" in text


def test_coding_in_toml(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('site = "h1"\npatient_id = "pid"\nlabel = "y"\n[columns.sex]\nfeature = "sex"\n'
                 'coding = { "F" = 0, "M" = 1 }\n')
    s = SiteSchema.from_toml(p)
    assert s.columns["sex"].coding == {"F": 0, "M": 1}
    p.write_text('site = "h1"\nlabel = "y"\nunlabeled = true\n')
    with pytest.raises(ConfigError, match="unlabeled = true but label"):
        SiteSchema.from_toml(p)


# -- header spellings the site schema almost names -----------------------------------------
def test_header_differing_from_a_schema_column_by_spaces_or_case_is_an_error_not_an_alias_match():
    # before: 'paco2 ' resolved to paco2 by its dictionary id, without the schema's kPa -> mmHg conversion
    schema = wide(columns={"paco2": ColumnMap(feature="paco2", unit="kPa")})
    df = pd.DataFrame({"PID": ["a", "b"], "paco2 ": [5.1, 5.3], "y": [0, 1]})
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=schema, dictionary=D)
    msg = str(err.value)
    assert "Column 'paco2 ' differs from 'paco2', which the site schema names, only by surrounding spaces" in msg
    assert "Column 'PID' differs from 'pid'" in msg and "The patient_id column 'pid' is missing" in msg
    assert "is not in the feature dictionary" not in msg  # no second message for the same column
    assert len(err.value.problems) == 3


def test_a_missing_label_column_is_reported_once_not_again_for_every_row():
    df = pd.DataFrame({"pid": ["a", "b", "c"], "hr": [70, 80, 90]})
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=wide(), dictionary=D)
    assert err.value.problems == ["The label column 'y' is missing (columns present: 2). Set `label` in the site "
                                  "schema to the right column name."]


# -- what a lab export writes in a numeric column ---------------------------------------------
def test_censored_values_missing_markers_and_dates_each_get_their_own_fix():
    # before: all of them were "text where a number is expected"
    df = pd.DataFrame({"pid": list("abcdefg"), "y": [0, 1] * 3 + [0],
                       "crp": ["<7", "> 351", "-", "n.a.", "#VALUE!", "2024-03-01", f"{CANARY}"]})
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=wide(), dictionary=D)
    p = err.value.problems
    assert any(x.startswith("Column 'crp' (crp): rows 1, 2: values beyond a detection limit") for x in p)
    assert any(x.startswith("Column 'crp' (crp): rows 3, 4, 5: missing-value markers") for x in p)
    assert any(x.startswith("Column 'crp' (crp): row 6: dates or times where a number is expected") for x in p)
    assert any(x.startswith("Column 'crp' (crp): row 7: text where a number is expected") for x in p)
    assert CANARY not in str(err.value) and "351" not in str(err.value)


@pytest.mark.parametrize("as_datetime", [False, True])
def test_dates_in_the_long_time_column_are_refused_with_the_fix(as_datetime):
    # before: text dates were "not a finite number"; datetime64 cells silently became nanoseconds since 1970
    t = ["2024-01-01 10:00", "2024-01-01 11:00", "2024-01-02 08:00"]
    df = pd.DataFrame({"pid": ["a", "a", "b"], "t": pd.to_datetime(t) if as_datetime else t, "code": ["hr"] * 3,
                       "v": [70, 72, 80], "unit": ["/min"] * 3, "y": [0, 0, 1]})
    with pytest.raises(SchemaError, match=r"Time column 't': rows 1, 2, 3: dates or datetimes\. .* convert them to "
                                          "hours since each patient's admission"):
        ingest(df, schema=long(), dictionary=D)


@pytest.mark.parametrize("twin", ["p1\u200b", "p1\x00", "\u202ep1", "p\uff11"])  # zero-width, NUL, RTL, fullwidth 1
def test_ids_that_differ_only_by_invisible_characters_or_normalisation_are_an_error(twin):
    # before: two patients that print identically were silently kept apart
    df = pd.DataFrame({"pid": ["p1", twin, "p2"], "hr": [70, 80, 90], "y": [0, 1, 0]})
    with pytest.raises(SchemaError, match=r"rows 1, 2: ids that differ from another id only by whitespace, "
                                          "invisible characters"):
        ingest(df, schema=wide(), dictionary=D)


def test_ids_with_control_characters_are_an_error():
    # pandas hashes 'a' and 'a\x00' alike in groupby/nunique: such ids are refused, not grouped by chance
    df = pd.DataFrame({"pid": ["a\x00", "a\x00", "b"], "t": [0, 1, 0], "code": ["hr"] * 3, "v": [70, 71, 72],
                       "unit": [None] * 3, "y": [0, 0, 1]})
    with pytest.raises(SchemaError, match=r"rows 1, 2: ids holding control characters"):
        ingest(df, schema=long(), dictionary=D)


def test_long_unit_cells_that_are_empty_on_some_rows_or_contradict_the_schema_are_errors():
    # before: the one unit of the other rows (or the unit column over the schema) was applied silently
    df = pd.DataFrame({"pid": ["a", "a", "b"], "t": [0, 1, 0], "y": [1, 1, 0], "code": ["paco2"] * 3,
                       "v": [5.0, 40.0, 4.9], "unit": ["kPa", None, "kPa"]})
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=long(), dictionary=D)
    assert ("Unit column 'unit' for feature code 'paco2' (paco2): row 2: a value without a unit while the other rows "
            "of this code give 'kPa'") in err.value.problems[0]
    df["unit"] = ["kPa"] * 3
    with pytest.raises(SchemaError, match=r"the unit column 'unit' says 'kPa' but the site schema says 'mmHg'"):
        ingest(df, schema=long(columns={"paco2": ColumnMap(feature="paco2", unit="mmHg")}), dictionary=D)
    df["unit"] = ["kPa", None, "kPa"]  # the schema's unit agrees with the cells: empty cells take it
    t = ingest(df.assign(v=[5.0, 5.2, 4.9]), schema=long(columns={"paco2": ColumnMap(feature="paco2", unit="kPa")}),
               dictionary=D)
    assert t.report.observations == 3


def test_columns_without_a_name_are_reported_as_such(tmp_path):
    # before: "Column '' is not in the feature dictionary (nearest: [])", or for two of them "no header row"
    for text, positions in (("pid,hr,,y\na,70,,0\nb,80,,1\n", "3"), ("pid,hr,,,y\na,70,,,0\nb,80,,,1\n", "3, 4")):
        p = _csv(tmp_path, text)
        with pytest.raises(SchemaError) as err:
            ingest(read_table(p), schema=wide(), dictionary=D)
        assert err.value.problems[0].endswith(f"the header cell at position(s) {positions} is empty (often an index "
                                              "column a spreadsheet or pandas wrote, or a trailing delimiter). Name "
                                              "them and map them under [columns], delete them from the export, or "
                                              "leave them out with ignore = [\"\"] in the site schema (counted like "
                                              "every ignored column).")


def test_columns_without_a_name_can_be_ignored_in_the_site_schema(tmp_path):
    # the UCI/Kaggle breast-cancer CSV ends every line with a comma: one (or, after a second export
    # step, two) empty trailing columns. Before: refused, and ignore = [""] was not enough for two
    for text, count in (("pid,hr,y,\na,70,0,\nb,80,1,\n", 1), ("pid,hr,y,,\na,70,0,,\nb,80,1,,\n", 2)):
        t = ingest(read_table(_csv(tmp_path, text)), schema=wide(ignore=("",)), dictionary=D)
        assert t.n_patients == 2 and t.report.ignored_columns == ("",) * count


def test_pandas_name_for_an_empty_header_cell_is_explained_with_the_fix(tmp_path):
    # an integrator who reads the trailing-comma CSV with pd.read_csv and passes the DataFrame got only
    # "Column 'Unnamed: 3' is not in the feature dictionary": the column is pandas' placeholder
    df = pd.read_csv(_csv(tmp_path, "pid,hr,y,\na,70,0,\nb,80,1,\n"))
    assert "Unnamed: 3" in df.columns
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=wide(), dictionary=D)
    assert "Column 'Unnamed: 3'" in err.value.problems[0] and "header cell is empty" in err.value.problems[0]
    assert ingest(df.drop(columns=["Unnamed: 3"]), schema=wide(), dictionary=D).n_patients == 2


def test_a_stray_nul_byte_is_not_called_utf16(tmp_path):
    # before: "looks like UTF-16 or UTF-32 without a byte-order mark" for a damaged UTF-8 file
    p = _csv(tmp_path, b"pid,hr,y\na,70,0\nb,8\x000,1\n")
    with pytest.raises(SchemaError, match=r"holds 1 NUL byte\(s\), the first on line 3: a damaged export"):
        read_table(p)


def test_thousands_separators_and_spreadsheet_formulas_are_not_called_decimal_commas(tmp_path):
    # before: "1,234" got the fix "read with decimal=','" (1.234: a 1000-fold error if followed), and
    # Excel's ="90" was plain "text"
    p = _csv(tmp_path, 'pid,crp,hr,y\na,"1,234",="90",0\nb,3.5,80,1\n')
    with pytest.raises(SchemaError) as err:
        ingest(read_table(p), schema=wide(), dictionary=D)
    problems = err.value.problems
    assert problems[0].startswith("Column 'crp' (crp): row 1: numbers with a comma that reads both as a thousands "
                                  "separator")
    assert problems[1].startswith("Column 'hr' (heart_rate): row 1: spreadsheet formulas")
    assert len(problems) == 2


def test_an_unknown_column_close_to_a_schema_column_absent_from_the_table_is_called_a_rename():
    schema = wide(columns={"paco2_kpa": ColumnMap(feature="paco2", unit="kPa")})
    df = pd.DataFrame({"pid": ["a", "b"], "paco2_kpa_v2": [5.1, 5.3], "y": [0, 1]})
    with pytest.raises(SchemaError, match=r"The site schema maps 'paco2_kpa', which is not in the table: if the "
                                          r"column was renamed, fix its name under \[columns\]\."):
        ingest(df, schema=schema, dictionary=D)


def test_excel_sep_line_title_line_and_totals_row(tmp_path):
    # before: Excel's "sep=;" line was read as the header (ragged rows), a title line gave only "more fields than
    # the header", and a "Total" row was ingested as a patient
    t = ingest(read_table(_csv(tmp_path, "sep=;\npid;hr;y\na;70,5;0\nb;80;1\n")), schema=wide(), dictionary=D)
    assert sorted(t.value.tolist()) == [70.5, 80.0]
    with pytest.raises(SchemaError) as err:
        read_table(_csv(tmp_path, f"{CANARY} export\npid,hr,y\na,70,0\nb,80,1\n"))
    assert "seems to start with a title or comment line above the header" in err.value.problems[0]
    assert CANARY not in str(err.value)
    with pytest.raises(SchemaError, match=r"row 3: the id is a summary word"):
        ingest(read_table(_csv(tmp_path, "pid,hr,y\na,70,0\nb,80,1\nTOTAL,150,1\n")), schema=wide(), dictionary=D)


@pytest.mark.parametrize("ignore", [(), ("hr",)])
def test_a_wide_table_without_any_feature_column_is_an_error(ignore):
    # before: ingested as patients with 0 observations
    df = pd.DataFrame({"pid": ["a", "b"], "y": [0, 1], **({"hr": [70, 80]} if ignore else {})})
    with pytest.raises(SchemaError, match="No column of the table is a feature"):
        ingest(df, schema=wide(ignore=ignore), dictionary=D)


def test_label_codes_in_the_site_schema_and_y_n_labels():
    # before: "dead"/"alive" labels could not be declared at all, and Y/N were refused
    df = pd.DataFrame({"pid": ["a", "b", "c"], "hr": [70, 80, 90], "y": ["dead", "alive", "Dead "]})
    with pytest.raises(SchemaError, match=r"rows 1, 2, 3: not binary .*label_codes = \{ \"dead\" = 1"):
        ingest(df, schema=wide(), dictionary=D)
    t = ingest(df, schema=wide(label_codes={"dead": 1, "alive": 0}), dictionary=D)
    assert t.labels.tolist() == [1, 0, 1]
    assert ingest(df.assign(y=["Y", "N", "y"]), schema=wide(), dictionary=D).labels.tolist() == [1, 0, 1]
    with pytest.raises(SchemaError, match=r"row 2: codes not in the site schema's label_codes"):
        ingest(df, schema=wide(label_codes={"dead": 1, "censored": 0}), dictionary=D)
    with pytest.raises(ConfigError, match="must map codes to both 1 and 0"):
        wide(label_codes={"dead": 1})


def test_header_in_another_unicode_normalisation_than_the_schema_is_named():
    schema = wide(columns={"h\u00e4mo": ColumnMap(feature="paco2")})  # schema: NFC
    df = pd.DataFrame({"pid": ["a", "b"], "ha\u0308mo": [40.0, 41.0], "y": [0, 1]})  # table: NFD (macOS)
    with pytest.raises(SchemaError, match="which the site schema names, only by surrounding spaces, letter case or "
                                          "Unicode normalisation"):
        ingest(df, schema=schema, dictionary=D)


@pytest.mark.parametrize("fmt", ["wide", "long"])
def test_declared_missing_value_markers_are_read_as_missing_and_counted(fmt):
    # before: an export writing "-" for "no value" could only be cleaned outside Clinograph
    policy = {"missing_values": ["-", "n.d."]}
    if fmt == "wide":
        df = pd.DataFrame({"pid": ["a", "b", "c"], "hr": ["70", " - ", "n.d."], "crp": ["-", "3", "4"],
                           "y": ["1", "0", "-"]})
        schema = wide(policy={**policy, "missing_label": "drop"})
    else:
        df = pd.DataFrame({"pid": ["a", "a", "b"], "t": [0, 1, 0], "code": ["hr"] * 3, "v": ["70", "-", "80"],
                           "unit": [None] * 3, "y": [1, 1, 0]})
        schema = long(policy=policy)
    t = ingest(df, schema=schema, dictionary=D)
    assert t.report.declared_missing_cells == (4 if fmt == "wide" else 1)
    assert t.report.observations == 2 and t.report.dropped_patients_missing_label == (fmt == "wide")
    with pytest.raises(ConfigError, match="empty or blank"):
        wide(policy={"missing_values": [" "]})


def test_integer_ids_stored_as_floats_or_bytes_keep_the_hospitals_spelling(tmp_path):
    # before: a Parquet id column of integers with a gap (float64) gave ids '1.0', a binary one "b'a'"
    def ids(pid):
        df = pd.DataFrame({"pid": pid, "hr": [70.0, 80.0, 90.0], "y": [0, 1, 0]})
        df.to_parquet(tmp_path / "t.parquet")
        return ingest(read_table(tmp_path / "t.parquet"), schema=wide(), dictionary=D).patient_ids
    assert ids([1.0, 2.0, 3.0]) == ("1", "2", "3") and ids([b"a", b"b", b"c"]) == ("a", "b", "c")
    for pid in ([1.5, 2.0, 3.0], [2.0**60, 2.0, 3.0]):
        with pytest.raises(SchemaError, match=r"row 1: ids stored as floating-point numbers that are not whole or are"):
            ids(pid)


def test_declared_missing_numbers_match_whatever_their_number_format(tmp_path):
    # before: missing_values = ["-999"] did not match a Parquet/DataFrame float -999.0 nor a CSV '-999,00'
    # or '-999.0': the marker was read as a value (CRP -999 mg/L: no physical limit, silently a value)
    df = pd.DataFrame({"pid": ["a", "b", "c"], "crp": [-999.0, 3.0, 4.0], "hr": ["-999.00", "70", " -999 "],
                       "y": [1, 0, 1]})
    df.to_parquet(tmp_path / "t.parquet")
    (tmp_path / "t.csv").write_text("pid;crp;hr;y\na;-999,00;70;1\nb;3,5;-999;0\nc;4;80;1\n")
    schema = wide(policy={"missing_values": ["-999", "n.d."]})
    for given in (df, read_table(tmp_path / "t.parquet"), read_table(tmp_path / "t.csv")):
        t = ingest(given, schema=schema, dictionary=D)
        assert t.report.declared_missing_cells == 2 + (given["hr"].iloc[2] != "80")
        assert -999.0 not in t.value.tolist() and t.report.observations == 6 - t.report.declared_missing_cells
    assert ingest(pd.DataFrame({"pid": ["a", "b"], "crp": ["N.D.", "1"], "y": [0, 1]}),  # text: exact, as before
                  schema=wide(policy={"missing_values": ["N.D."]}), dictionary=D).report.declared_missing_cells == 1


def test_a_long_tables_cell_problems_name_the_tables_rows_not_the_rows_of_that_feature_code():
    # before: rows were counted among one code's rows: 'x40' on data row 4 was "row 2", 1e9 on row 6 "row 3"
    df = pd.DataFrame({"pid": ["a", "a", "b", "b", "c", "c", "c"], "t": [0, 0, 0, 0, 0, 0, 1],
                       "code": ["hr", "paco2", "hr", "paco2", "hr", "paco2", "ward"],
                       "v": ["70", "40", "80", "x40", "90", "1e9", "nowhere"], "unit": [None] * 7, "y": [1, 1, 0, 0, 1, 1, 1]})
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=long(), dictionary=D)
    assert err.value.problems[:2] == [
        "Column 'v[paco2]' (paco2): row 4: text where a number is expected. Clean these cells or leave them empty for "
        "missing.",
        "Column 'v[paco2]' (paco2): row 6: physically impossible value after conversion to mmHg (allowed 0 to 300). "
        "Check the unit in the site schema or correct the values."]
    assert err.value.problems[2].startswith("Column 'v[ward]' (ward): row 7: codes that are not levels")


@pytest.mark.parametrize("fmt", ["wide", "long"])
def test_a_column_whose_coding_is_refused_is_not_also_blamed_for_its_cells(fmt):
    # before: coding = { "2" = 1, "1" = 2 } gave the coding's problem and, for every '1' cell, "codes not in the
    # coding declared for this column (seen: '1')" -- but '1' is declared; its value is what is wrong
    coding = {"2": 1, "1": 2}
    if fmt == "wide":
        df = pd.DataFrame({"pid": ["a", "b", "c"], "Sex": ["1", "2", "1"], "hr": [70, 80, 90], "y": [0, 1, 0]})
        schema = wide(columns={"Sex": ColumnMap(feature="sex", coding=coding)})
    else:
        df = pd.DataFrame({"pid": ["a", "b", "c"], "t": [0] * 3, "code": ["Sex"] * 3, "v": ["1", "2", "1"],
                           "unit": [None] * 3, "y": [0, 1, 0]})
        schema = long(columns={"Sex": ColumnMap(feature="sex", coding=coding)})
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=schema, dictionary=D)
    assert err.value.problems == ["Column 'Sex' (sex, binary): coding values for ['1'] must be 0 or 1: 1 for the "
                                  "code(s) that mean 'sex' (Sex) is true, 0 for the others."]


def test_a_units_row_under_the_header_is_named_as_such(tmp_path):
    # before: only "row 1: no id", "row 1: text where a number is expected" per column and "row 1: no label"
    (tmp_path / "t.csv").write_text("pid,hr,crp,y\n,bpm,mg/L,\na,70,1,1\nb,80,2,0\n")
    with pytest.raises(SchemaError) as err:
        ingest(read_table(tmp_path / "t.csv"), schema=wide(), dictionary=D)
    assert ("Row 1 holds unit names in the numeric column(s) 'hr', 'crp', not a patient's values: the export has a "
            "units row under the header. Delete that row, and write each column's unit in the site schema "
            "([columns].<column>.unit).") in err.value.problems
    (tmp_path / "t.csv").write_text("pid,hr,crp,y\nz,80,mg/L,1\na,70,1,1\nb,80,2,0\n")  # one stray cell: no such claim
    with pytest.raises(SchemaError) as err:
        ingest(read_table(tmp_path / "t.csv"), schema=wide(), dictionary=D)
    assert not any("units row" in p for p in err.value.problems)


def test_an_infinite_float_patient_id_is_named_without_a_numpy_warning():
    """inf % 1 warned 'invalid value encountered in remainder' (a stray line on the CLI's stderr, an
    exception under -W error) before the id was named."""
    import warnings

    df = pd.DataFrame({"pid": [1.0, np.inf, 3.0], "y": ["0", "1", "0"]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(SchemaError, match=r"Patient id column 'pid': row 2: ids stored as floating-point"):
            ingest(df, schema=wide(), dictionary=D)
