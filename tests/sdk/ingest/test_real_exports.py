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


def test_a_follow_up_column_named_in_months_is_not_read_as_days_by_default():
    # [survival] time = "fu_months" without time_unit: months were read as days (the default)
    from clinograph.sdk.ontology.dictionary import Feature, FeatureDictionary
    from clinograph.sdk.ontology.schema import SiteSchema, SurvivalColumns

    d = FeatureDictionary(name="s", version=1, features=(
        Feature(id="age", name="Age", kind="numeric", unit="years", reference_low=40, reference_high=80),))
    df = pd.DataFrame({"pid": ["a", "b"], "age": [50.0, 60.0], "fu_months": [3.0, 12.0], "dead": [1, 0]})
    s = SiteSchema(site="h1", patient_id="pid", label=None, survival=SurvivalColumns(time="fu_months", event="dead"))
    with pytest.raises(SchemaError, match=r"name gives the unit 'months'.*time_unit = 'months'"):
        ingest(df, schema=s, dictionary=d)
    written = SurvivalColumns(time="fu_months", event="dead", time_unit="mo")
    assert ingest(df, schema=s.model_copy(update={"survival": written}), dictionary=d).survival.time[1] > 365
    days = SurvivalColumns(time="fu_days", event="dead")
    ingest(df.rename(columns={"fu_months": "fu_days"}), schema=s.model_copy(update={"survival": days}), dictionary=d)


def test_a_label_coded_1_2_names_every_code_and_asks_for_both():
    # R's survival convention (lifelines lung 'status': 1 censored, 2 dead): the 1s were read as
    # positives and the message showed only '2', suggesting dead/alive
    df = pd.DataFrame({"pid": list("abcd"), "hr": [70, 71, 72, 73], "y": ["1", "2", "2", "1"]})
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=wide(), dictionary=D)
    (p,) = [p for p in err.value.problems if p.startswith("Label column")]
    assert "label_codes = { \"1\" = ?, \"2\" = ? }" in p and "rows 2, 3" in p


def test_event_codes_are_shown_only_as_codes_and_the_fix_uses_the_columns_codes():
    from clinograph.sdk.ontology.dictionary import Feature, FeatureDictionary
    from clinograph.sdk.ontology.schema import SiteSchema, SurvivalColumns

    d = FeatureDictionary(name="s", version=1, features=(
        Feature(id="age", name="Age", kind="numeric", unit="years", reference_low=40, reference_high=80),))
    df = pd.DataFrame({"pid": list("abcde"), "age": [50.0] * 5, "fu": [3.0] * 5,
                       "status": ["1", "2", "2", "1", "ZQXCANARY"]})
    s = SiteSchema(site="h1", patient_id="pid", label=None, survival=SurvivalColumns(time="fu", event="status"))
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=s, dictionary=d)
    text = " ".join(err.value.problems)
    assert "ZQXCANARY" not in text and "event_codes = { \"1\" = ?, \"2\" = ? }" in text


def test_a_survival_tables_event_problem_and_its_feature_problems_come_at_once():
    # GBSG2 at a hospital with status 1/2 and a duplicated row: the event problem stopped ingestion,
    # the duplicate and the feature cells were reported only after it was fixed
    from clinograph.sdk.ontology.dictionary import Feature, FeatureDictionary
    from clinograph.sdk.ontology.schema import SiteSchema, SurvivalColumns

    d = FeatureDictionary(name="s", version=1, features=(
        Feature(id="age", name="Age", kind="numeric", unit="years", reference_low=40, reference_high=80,
                physical_min=0, physical_max=120),))
    df = pd.DataFrame({"pid": list("abcc"), "age": ["50", "61", "700", "700"], "fu": [3.0, 4.0, 5.0, 5.0],
                       "status": ["1", "2", "2", "2"]})
    s = SiteSchema(site="h1", patient_id="pid", survival=SurvivalColumns(time="fu", event="status"))
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=s, dictionary=d)
    text = "\n".join(err.value.problems)
    assert "Event column 'status'" in text and "rows 3, 4: the same row more than once" in text and "physically impossible" in text
    df["status"] = ["0", "1", "1", "1"]  # the event fixed: the same feature problems, and no event problem
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=s, dictionary=d)
    assert not any("status" in p for p in err.value.problems) and len(err.value.problems) == 2


def test_thousands_commas_in_a_semicolon_file_of_whole_numbers_are_not_taken_for_decimal_commas(tmp_path):
    # lung's meal calories '1,175' in a ';' file without any other fractional number: the detection
    # chose decimal commas and read 1.175 kcal, silently
    path = tmp_path / "t.csv"
    path.write_text("pid;hr;paco2;y\na;1,175;40;1\nb;2,250;41;0\nc;950;42;1\n")
    df = read_table(path)
    assert df.attrs["decimal"] == "."
    with pytest.raises(SchemaError, match=r"Column 'hr' \(heart_rate\): rows 1, 2: numbers with a comma that reads both"):
        ingest(df, schema=wide(), dictionary=D)
    path.write_text("pid;hr;paco2;y\na;1,175;40,5;1\nb;2,250;41;0\n")  # a decimal comma elsewhere: the locale's
    assert read_table(path)["hr"].tolist() == ["1.175", "2.250"]


def test_a_date_in_a_numeric_column_is_named_a_date_not_a_unit_in_the_cell():
    # '01/02/2020' matched 'a number followed by a unit' ('01' + '/02/2020'): the fix offered was a unit
    df = pd.DataFrame({"pid": ["a", "b"], "y": [1, 0], "hr": ["01/02/2020", "70"], "paco2": ["5/3/2021", "41"]})
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=wide(), dictionary=D)
    assert [p.split(": ")[2][:14] for p in err.value.problems] == ["dates or times"] * 2


def test_dates_in_a_follow_up_column_are_named_dates_with_the_fix():
    from clinograph.sdk.ontology.dictionary import Feature, FeatureDictionary
    from clinograph.sdk.ontology.schema import SiteSchema, SurvivalColumns

    d = FeatureDictionary(name="s", version=1, features=(
        Feature(id="age", name="Age", kind="numeric", unit="years", reference_low=40, reference_high=80),))
    df = pd.DataFrame({"pid": list("abc"), "age": [50.0] * 3, "last_visit": ["03/04/2021", "2021-05-06", "12"],
                       "dead": [1, 0, 1]})
    s = SiteSchema(site="h1", patient_id="pid", survival=SurvivalColumns(time="last_visit", event="dead"))
    with pytest.raises(SchemaError, match=r"Time column 'last_visit': rows 1, 2: dates.*follow-up from the index date"):
        ingest(df, schema=s, dictionary=d)


def test_a_column_whose_values_sit_far_outside_the_reference_range_is_reported():
    # Karnofsky written as a fraction (0.9) under a '%' feature, no unit declared: within the physical
    # limits 0-100, so it was read as 0.9 % without a word
    from clinograph.sdk.ontology.dictionary import Feature, FeatureDictionary

    d = FeatureDictionary(name="k", version=1, features=(
        Feature(id="kps", name="Karnofsky", kind="numeric", unit="%", reference_low=50, reference_high=100,
                physical_min=0, physical_max=100),
        Feature(id="ecog", name="ECOG", kind="numeric", unit="1", reference_low=0, reference_high=2)))
    df = pd.DataFrame({"pid": list("abcd"), "y": [1, 0, 1, 0], "kps": [0.9, 0.8, 0.7, 1.0], "ecog": [0, 1, 1, 2]})
    t = ingest(df, schema=wide(), dictionary=d)
    assert list(t.report.far_from_reference) == ["kps"] and "below" in t.report.far_from_reference["kps"]
    df["kps"] = [90, 80, 70, 100]
    assert ingest(df, schema=wide(), dictionary=d).report.far_from_reference == {}
    # a long table's feature code too
    from tables_helpers import long
    rows = pd.DataFrame({"pid": list("abcd"), "t": [0] * 4, "y": [1, 0, 1, 0], "code": ["hr"] * 4,
                         "v": [0.7, 0.8, 0.9, 0.75], "unit": ["/min"] * 4})
    assert list(ingest(rows, schema=long(), dictionary=D).report.far_from_reference) == ["hr"]


def test_top_coded_ages_are_named_as_limits_not_as_text():
    # HIPAA top-coding writes '90+' as often as '>89': it was 'text where a number is expected'
    df = pd.DataFrame({"pid": list("abc"), "y": [1, 0, 1], "hr": ["90+", ">89", "70"]})
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=wide(), dictionary=D)
    (p,) = err.value.problems
    assert p.startswith("Column 'hr' (heart_rate): rows 1, 2: values beyond a detection limit") and "'90+'" in p


def test_a_patient_row_the_export_repeated_is_named_as_a_copy():
    # GBSG2 with one row exported twice: 'repeated id ... use format = "long"' sent the user to the wrong fix
    df = pd.DataFrame({"pid": list("abbcc"), "y": [1, 0, 0, 1, 0], "hr": [70, 71, 71, 72, 90]})
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=wide(), dictionary=D)
    text = "\n".join(err.value.problems)
    assert "rows 2, 3: the same row more than once (every cell equal)" in text
    assert "rows 4, 5: repeated id" in text and "rows 2, 3: repeated id" not in text


def test_many_unmapped_columns_end_in_one_problem_with_an_ignore_list_to_paste():
    # a 300-column export against a 30-feature dictionary: 270 problems, one a column, nothing to paste
    extra = {f"lab {i}": [1.0, 2.0] for i in range(15)}
    df = pd.DataFrame({"pid": ["a", "b"], "y": [1, 0], "hr": [70, 80], **extra})
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=wide(), dictionary=D)
    unknown = [p for p in err.value.problems if "not in the feature dictionary" in p]
    assert len(unknown) == 11 and "5 more column(s)" in unknown[-1] and "'lab 14'" in unknown[-1]
    assert "ignore = [" + ", ".join(f'"lab {i}"' for i in range(15)) + "]" in unknown[-1]


def test_a_parquet_duration_is_a_follow_up_in_days_and_a_datetime_is_a_date():
    # pandas' timedelta/datetime columns (Parquet durations and timestamps) were read as nanoseconds:
    # 'follow-up longer than 150 years ... check time_unit', and a duration under a minute as days
    from clinograph.sdk.ontology.dictionary import Feature, FeatureDictionary
    from clinograph.sdk.ontology.schema import SiteSchema, SurvivalColumns

    d = FeatureDictionary(name="s", version=1, features=(
        Feature(id="age", name="Age", kind="numeric", unit="years", reference_low=40, reference_high=80),))
    df = pd.DataFrame({"pid": list("abc"), "age": [50.0] * 3, "fu": pd.to_timedelta([30, 400, None], unit="D"),
                       "dead": [1, 0, 1]})
    s = SiteSchema(site="h1", patient_id="pid", policy={"missing_label": "drop"},
                   survival=SurvivalColumns(time="fu", event="dead", time_unit="wk"))
    assert ingest(df, schema=s, dictionary=d).survival.time.tolist() == [30.0, 400.0]
    df["fu"] = pd.to_datetime(["2021-01-01", "2021-02-01", None])
    with pytest.raises(SchemaError, match=r"Time column 'fu': rows 1, 2: dates, not follow-up times"):
        ingest(df, schema=s, dictionary=d)
    df["fu"] = pd.to_timedelta([-3, 4, None], unit="D")  # a negative duration is still refused
    with pytest.raises(SchemaError, match=r"Time column 'fu': row 1: negative follow-up time"):
        ingest(df, schema=s, dictionary=d)


def test_a_multi_line_note_in_the_first_row_of_a_numeric_column_is_a_problem_not_a_crash(tmp_path):
    # Excel's quoted newline ('see\nnote') reached the units-row check and the UCUM parser's regex did not match
    path = tmp_path / "t.csv"
    path.write_text('pid,hr,paco2,y\np1,"see\nnote",40,1\np2,70,41,0\n')
    with pytest.raises(SchemaError, match=r"Column 'hr' \(heart_rate\): row 1: text where a number"):
        ingest(read_table(path), schema=wide(), dictionary=D)


def test_space_grouped_thousands_are_named_with_the_fix():
    # French Excel groups thousands with a (no-break) space: '1 175' was 'text where a number is expected'
    df = pd.DataFrame({"pid": list("abc"), "y": [1, 0, 1], "crp": ["1\u00a0175", "2 250,5", "3"]})
    with pytest.raises(SchemaError, match=r"rows 1, 2: numbers with spaces between digit groups"):
        ingest(df, schema=wide(), dictionary=D)


def test_a_follow_up_columns_text_is_named_like_a_feature_columns():
    # '12,5', '>365' (censored at a year, written as a limit) and '?' were all 'not a number'
    from clinograph.sdk.ontology.dictionary import Feature, FeatureDictionary
    from clinograph.sdk.ontology.schema import SiteSchema, SurvivalColumns

    d = FeatureDictionary(name="s", version=1, features=(
        Feature(id="age", name="Age", kind="numeric", unit="years", reference_low=40, reference_high=80),))
    df = pd.DataFrame({"pid": list("abcd"), "age": [50.0] * 4, "fu": ["12,5", ">365", "?", "3"], "dead": [1, 0, 1, 1]})
    s = SiteSchema(site="h1", patient_id="pid", survival=SurvivalColumns(time="fu", event="dead"))
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=s, dictionary=d)
    text = "\n".join(err.value.problems)
    assert "row 1: numbers written with a decimal comma" in text and "row 2: values beyond a detection limit" in text
    assert "row 3: missing-value markers" in text and "not a number" not in text


def test_follow_up_times_that_look_like_excel_serial_dates_are_reported():
    # a last-contact date exported as Excel's serial number (44927 = 2023-01-01) is 123 years of
    # follow-up: under the 150-year limit, so it was read without a word
    from clinograph.sdk.ontology.dictionary import Feature, FeatureDictionary
    from clinograph.sdk.ontology.schema import SiteSchema, SurvivalColumns

    d = FeatureDictionary(name="s", version=1, features=(
        Feature(id="age", name="Age", kind="numeric", unit="years", reference_low=40, reference_high=80),))
    df = pd.DataFrame({"pid": list("abcd"), "age": [50.0] * 4, "fu": [44927, 45012, 44100, 45300], "dead": [1, 0, 1, 1]})
    s = SiteSchema(site="h1", patient_id="pid", survival=SurvivalColumns(time="fu", event="dead"))
    report = ingest(df, schema=s, dictionary=d).report
    assert list(report.far_from_reference) == ["fu"] and "Excel serial dates" in report.far_from_reference["fu"]
    assert ingest(df.assign(fu=[30, 400, 12, 800]), schema=s, dictionary=d).report.far_from_reference == {}


def test_a_long_tables_feature_code_naming_a_unit_is_not_read_as_the_canonical_unit():
    from tables_helpers import long
    rows = pd.DataFrame({"pid": ["a", "b"], "t": [0, 0], "y": [1, 0], "code": ["paco2_kPa"] * 2, "v": [5.3, 5.1]})
    s = long(long={"patient": "pid", "time": "t", "feature": "code", "value": "v"},
             columns={"paco2_kPa": ColumnMap(feature="paco2")})
    with pytest.raises(SchemaError, match=r"Feature code 'paco2_kPa' \(paco2\): its name gives the unit 'kPa'"):
        ingest(rows, schema=s, dictionary=D)
    s = s.model_copy(update={"columns": {"paco2_kPa": ColumnMap(feature="paco2", unit="kPa")}})
    assert ingest(rows, schema=s, dictionary=D).value.round(1).tolist() == [39.8, 38.3]
