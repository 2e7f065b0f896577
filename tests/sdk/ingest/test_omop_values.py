"""OMOP as OMOP means it: unit concepts, censored values, observation periods, person, conditions,
death, and the errors that name source records and counts (sdk/ingest/omop_assemble.py)."""

from __future__ import annotations

import pandas as pd
import pytest
import sqlalchemy as sa
from clinograph.sdk.datasets.omop import demo_source, omop_tables
from clinograph.sdk.ingest.omop import (
    OmopConditions,
    OmopLabel,
    OmopPerson,
    OmopSex,
    omop_engine,
    read_omop,
)
from ehr_helpers import D, demo_hospitals, extended_dictionary

from clinograph.core.errors import SchemaError, SourceUnavailable, UnitError

GLUCOSE, SBP = D.get("glucose").omop_concept_id, D.get("systolic_bp").omop_concept_id


def _db(tmp_path, edit=None, n=4):
    """A small OMOP DuckDB of the west demo hospital; ``edit(tables)`` changes the tables first."""
    table, schema = demo_hospitals()[3]
    tables = omop_tables(table.iloc[:n], schema, D)
    if edit:
        edit(tables)
    engine = sa.create_engine(f"duckdb:///{tmp_path / 'x.duckdb'}")
    with engine.begin() as conn:
        for name, df in tables.items():
            df.to_sql(name, conn, index=False)
    engine.dispose()
    return omop_engine(tmp_path / "x.duckdb")


def _rows(tables, concept):
    m = tables["measurement"]
    return m.index[m["measurement_concept_id"] == concept]


def test_units_from_unit_concept_id_alone_and_no_unit_refused_by_record(tmp_path):
    def only_concepts(t):
        m = t["measurement"]
        m["unit_concept_id"] = m["unit_concept_id"].astype(object)
        m.loc[_rows(t, SBP), "unit_concept_id"] = 8876     # mm[Hg], the standard concept
        m["unit_source_value"] = None
        m.loc[_rows(t, GLUCOSE), "unit_concept_id"] = 0    # no matching concept: no unit
    engine = _db(tmp_path, only_concepts)
    with pytest.raises(UnitError) as err:
        read_omop(engine, source=demo_source("west"), dictionary=D)
    text = str(err.value)
    assert "feature 'glucose': 4 value(s) carry no unit (e.g. measurement_id" in text
    assert "units = { glucose = \"mmol/L\" } under [omop] in the source file" in text
    assert "systolic_bp" not in text                      # read from unit_concept_id 8876
    assert "feature 'temperature'" not in text            # 586323 (Cel), as the demo CDM writes it
    assert "feature 'airway_pressure'" in text            # cm[H2O]: no unit concept written, all named at once
    declared = {f.id: f.unit for f in D.features if f.kind.value == "numeric"}
    ex = read_omop(engine, source=demo_source("west").model_copy(update={"units": declared}), dictionary=D)
    assert any("'glucose' without a unit, read in the declared 'mmol/L': 4" in n for n in ex.report.notes)


def test_a_kpa_pressure_is_not_read_as_mmhg(tmp_path):
    def kpa(t):
        m = t["measurement"]
        rows = _rows(t, SBP)
        m.loc[rows, "value_as_number"] = 16.0
        m.loc[rows, "unit_concept_id"] = 9_999_999       # a site's kPa concept the table does not list
        m.loc[rows, "unit_source_value"] = None
    engine = _db(tmp_path, kpa)
    with pytest.raises(UnitError, match=r"unit_concept_id\(s\) \[9999999\] are not in Clinograph's table"):
        read_omop(engine, source=demo_source("west"), dictionary=D)
    source = demo_source("west").model_copy(update={"unit_concepts": {9_999_999: "kPa"}})
    t = read_omop(engine, source=source, dictionary=D).ingest(D)
    assert t.value[t.node == D.node_index()["systolic_bp"]].tolist() == pytest.approx([120.0] * 4, rel=1e-3)


def test_mixed_units_in_one_feature_are_converted_row_by_row(tmp_path):
    def mixed(t):
        m = t["measurement"]
        first = _rows(t, GLUCOSE)[0]
        m.loc[first, "value_as_number"] = 90.078
        m.loc[first, "unit_source_value"], m.loc[first, "unit_concept_id"] = "mg/dL", 8840
    t = read_omop(_db(tmp_path, mixed), source=demo_source("west"), dictionary=D).ingest(D)
    assert 5.0 in [round(v, 6) for v in t.value[t.node == D.node_index()["glucose"]]]


def test_censored_values_need_a_declared_policy(tmp_path):
    def censored(t):
        m = t["measurement"]
        rows = _rows(t, GLUCOSE)
        m["operator_concept_id"] = m["operator_concept_id"].astype(object)
        m.loc[rows[0], "operator_concept_id"] = 4171756       # "<"
        m.loc[rows[0], "value_as_number"] = 3.0
        m.loc[rows[1], "value_as_number"] = None              # text only
        m.loc[rows[1], "value_source_value"] = "<2.0"
        m.loc[rows[2], "value_as_number"] = None              # neither a number nor a readable text
        m.loc[rows[2], "value_source_value"] = "see note"
    engine = _db(tmp_path, censored)
    with pytest.raises(UnitError, match=r"feature 'glucose': 2 censored value\(s\).*censored = \"bound\""):
        read_omop(engine, source=demo_source("west"), dictionary=D)
    ex = read_omop(engine, source=demo_source("west").model_copy(update={"censored": "half_bound"}), dictionary=D)
    glucose = sorted(ex.ingest(D).value[ex.ingest(D).node == D.node_index()["glucose"]].tolist())
    assert glucose[:2] == [1.0, 1.5] and len(glucose) == 3
    assert any("censored values of 'glucose' read as half the bound below a limit: 2" in n for n in ex.report.notes)
    assert any("rows without a numeric value" in n and n.endswith(": 1") for n in ex.report.notes)
    assert any("values read from text" in n and n.endswith(": 1") for n in ex.report.notes)


def test_events_outside_the_observation_period_are_excluded_and_counted(tmp_path):
    def short(t):
        p = t["observation_period"]
        p.loc[0, "observation_period_end_date"] = p.loc[0, "observation_period_start_date"]
    ex = read_omop(_db(tmp_path, short), source=demo_source("west"), dictionary=D)
    n_first = int((omop_tables(demo_hospitals()[3][0].iloc[:4], demo_hospitals()[3][1], D)["measurement"]
                   .pipe(lambda m: m[(m.person_id == 1) & (m.measurement_source_value != "distractor")]).shape[0]))
    assert ex.report.excluded["outside the person's observation periods"] >= n_first > 0
    assert ex.report.patients_without_events == 1


def test_person_conditions_and_death(tmp_path):
    d2 = extended_dictionary()

    def add(t):
        p = t["person"]
        p["gender_concept_id"] = [8507, 8532, 0, 8507]
        p["year_of_birth"] = [1950, 1980, 1990, 2000]
        p["month_of_birth"] = [1, None, 13, None]  # 13: no birth date (was counted as 'no year of birth')
        p["day_of_birth"] = [1, None, None, None]
        c = t["condition_occurrence"]
        t0 = t["visit_occurrence"]["visit_start_datetime"]
        extra = pd.DataFrame({"condition_occurrence_id": [900, 901], "person_id": [1, 2],
                              "condition_concept_id": 255573,
                              "condition_start_date": [(t0[0] - pd.Timedelta(days=100)).date(),
                                                       (t0[1] - pd.Timedelta(days=900)).date()],
                              "condition_start_datetime": [t0[0] - pd.Timedelta(days=100),
                                                           t0[1] - pd.Timedelta(days=900)],
                              "condition_type_concept_id": 32817})
        t["condition_occurrence"] = pd.concat([c, extra], ignore_index=True)
        t["death"] = pd.DataFrame({"person_id": [3], "death_date": [(t0[2] + pd.Timedelta(days=5)).date()],
                                   "death_datetime": [t0[2] + pd.Timedelta(days=5)], "death_type_concept_id": [32817]})
    source = demo_source("west").model_copy(update={
        "person": OmopPerson(age="age", sex=OmopSex(feature="sex", male="male", female="female")),
        "conditions": OmopConditions(features=("copd",), lookback_days=365.0),
        "label": OmopLabel(death=True, window_days=30.0)})
    ex = read_omop(_db(tmp_path, add), source=source, dictionary=d2)
    t = ex.ingest(d2)
    idx, ids = d2.node_index(), list(t.patient_ids)
    age = dict(zip([ids[p] for p in t.patient[t.node == idx["age"]]], t.value[t.node == idx["age"]], strict=True))
    first = ids[0]
    assert age[first] == pytest.approx(74.0, abs=0.01)                       # 1950-01-01 to 2024-01-01
    assert t.value[t.node == idx["copd"]].tolist() == [1.0, 0.0, 0.0, 0.0]  # 900 days ago: outside the window
    assert int(((t.node == idx["sex=male"])).sum()) == 2 and int((t.node == idx["sex=female"]).sum()) == 1
    assert any("persons of unknown sex" in n and n.endswith(": 1") for n in ex.report.notes)
    assert any("an impossible month or day; age missing): 1" in n for n in ex.report.notes)
    assert sorted(t.labels.tolist()) == [0, 0, 0, 1]


def test_declarations_that_do_not_fit_the_dictionary_are_all_named(tmp_path):
    source = demo_source("west").model_copy(update={
        "person": OmopPerson(age="glucosee", sex=OmopSex(feature="history_lvf", male="m", female="f")),
        "conditions": OmopConditions(features=("glucose",), lookback_days=1.0)})
    with pytest.raises(SchemaError) as err:
        read_omop(_db(tmp_path), source=source, dictionary=D)
    text = str(err.value)
    assert "[omop.person] age: 'glucosee' is not a feature" in text
    assert "[omop.conditions] features: 'glucose' is numeric; expected binary" in text
    assert "[omop.person] sex: male/female must be ['0', '1']" in text


def test_an_unreachable_database_is_not_missing_tables():
    engine = omop_engine("postgresql+psycopg://reader:secret@127.0.0.1:1/cdm")
    with pytest.raises(SourceUnavailable, match=r"Cannot connect to the OMOP database .*127.0.0.1:1/cdm") as err:
        read_omop(engine, source=demo_source("x"), dictionary=D)
    assert "secret" not in str(err.value) and "missing" not in str(err.value)


def test_an_empty_window_prints_the_readers_counts(tmp_path):
    source = demo_source("west").model_copy(update={"lookback_days": 0.0, "after_days": 0.0,
                                                    "cohort": demo_source("west", cohort_sql=True).cohort.model_copy(
                                                        update={"sql": "SELECT person_id, visit_start_datetime + "
                                                                "INTERVAL 5 DAY AS index_datetime FROM "
                                                                "visit_occurrence"})})
    ex = read_omop(_db(tmp_path), source=source, dictionary=D)
    with pytest.raises(SchemaError, match=r"holds no event to ingest \(4 patient\(s\) in the cohort; rows read: \d+, "
                                          r"mapped to the dictionary: 0, outside the feature window: \d+.*Most rows "
                                          r"were excluded as 'outside the feature window' \(\d+\): check the window"
                                          ) as err:
        ex.ingest(D)
    assert "is empty (0 rows)" not in str(err.value)


def test_ingest_errors_name_source_records_not_long_table_rows(tmp_path):
    def impossible(t):
        m = t["measurement"]
        m.loc[_rows(t, GLUCOSE)[1], "value_as_number"] = -5.0
    ex = read_omop(_db(tmp_path, impossible), source=demo_source("west"), dictionary=D)
    with pytest.raises(SchemaError) as err:
        ex.ingest(D)
    text = str(err.value)
    rec = ex.table.loc[ex.table["value"] < 0, "source_record"].item()
    assert f"source record {rec}: physically impossible value" in text and rec.startswith("measurement_id ")
    assert "row " not in text and "-5" not in text


def test_unit_text_that_is_no_unit_is_not_shown_and_disagreements_are_named(tmp_path):
    def odd(t):
        m = t["measurement"]
        rows = _rows(t, GLUCOSE)
        m.loc[rows[0], "unit_concept_id"], m.loc[rows[0], "unit_source_value"] = 0, "ZQXCANARY"
        m.loc[rows[1], "unit_concept_id"], m.loc[rows[1], "unit_source_value"] = 8840, "ZQXCANARY2"
        m.loc[rows[2], "unit_concept_id"], m.loc[rows[2], "unit_source_value"] = 8840, "mmol/L"
    with pytest.raises(UnitError) as err:
        read_omop(_db(tmp_path, odd), source=demo_source("west"), dictionary=D)
    text = str(err.value)
    assert "feature 'glucose': 1 unit string(s) are not known units (not shown: cell contents)" in text
    assert "disagree on 2 unit pair(s) (mg/dL vs mmol/L)" in text
    assert "ZQXCANARY" not in text


def _sbp_in_kpa_under_an_unknown_unit_concept(t, *, unit_source_value):
    """The systolic BP rows as 16 kPa (120 mmHg) under unit concept 9 999 999, which Clinograph's unit
    table lacks, with ``unit_source_value`` beside it."""
    m = t["measurement"]
    rows = _rows(t, SBP)
    m.loc[rows, "value_as_number"] = 16.0
    m.loc[rows, "unit_concept_id"] = 9_999_999
    m.loc[rows, "unit_source_value"] = unit_source_value


def _systolic_bp(extract):
    table = extract.ingest(D)
    return table.value[table.node == D.node_index()["systolic_bp"]].tolist()


def test_an_unknown_unit_concept_with_a_source_unit_is_read_by_it_and_counted(tmp_path):
    def local(t):
        _sbp_in_kpa_under_an_unknown_unit_concept(t, unit_source_value="kPa")
    ex = read_omop(_db(tmp_path, local), source=demo_source("west"), dictionary=D)
    assert _systolic_bp(ex) == pytest.approx([120.0] * 4, rel=1e-3)
    assert any("not in the unit table, read by their unit_source_value: 4" in n for n in ex.report.notes)


def test_datetimes_with_a_time_zone_are_named_not_a_traceback(tmp_path):
    def zoned(t):
        m = t["measurement"]
        m["measurement_datetime"] = pd.to_datetime(m["measurement_datetime"]).dt.tz_localize("Europe/Berlin")
    with pytest.raises(SchemaError, match=r"datetimes with a time zone \(TIMESTAMPTZ\) in measurement;.*AT TIME ZONE"):
        read_omop(_db(tmp_path, zoned), source=demo_source("west"), dictionary=D)


def test_a_folder_of_csv_files_with_empty_columns_reads_and_a_malformed_cell_is_named(tmp_path):
    table, schema = demo_hospitals()[3]
    tables = omop_tables(table.iloc[:4], schema, D)  # value_as_concept_id, operator_concept_id: empty columns
    for name, df in tables.items():
        df.to_csv(tmp_path / f"{name}.csv", index=False)
    from_csv = read_omop(omop_engine(tmp_path), source=demo_source("west"), dictionary=D)
    assert from_csv.report.patients == 4 and from_csv.ingest(D).report.observations > 0
    m = tables["measurement"].astype({"measurement_datetime": str})
    m.loc[0, "measurement_datetime"] = "2024-02-30 10:00:00"
    m.to_csv(tmp_path / "measurement.csv", index=False)
    with pytest.raises(SchemaError, match=r"a cell that is not of its column's CDM type \(in "
                                          r"measurement.measurement_datetime\) .*impossible date") as err:
        read_omop(omop_engine(tmp_path), source=demo_source("west"), dictionary=D)
    assert "2024-02-30" not in str(err.value)
    with open(tmp_path / "measurement.csv", "a") as fh:  # a ragged row: DuckDB reads the file as one column
        fh.write("1,2,3\n")
    with pytest.raises(SchemaError, match=r"'measurement' has 1 column\(s\) and none of the CDM v5.4 ones.*could not "):
        read_omop(omop_engine(tmp_path), source=demo_source("west"), dictionary=D)


@pytest.mark.parametrize("days, label", [(0, 1.0), (-5, None)])
def test_a_death_date_on_the_index_day_is_a_death_and_one_before_it_is_an_error(tmp_path, days, label):
    def died(t):
        t0 = t["visit_occurrence"]["visit_start_datetime"][3]  # 03:00: a date-only death that day reads as 00:00
        t["death"] = pd.DataFrame({"person_id": [4], "death_date": [(t0 + pd.Timedelta(days=days)).date()],
                                   "death_datetime": [pd.NaT], "death_type_concept_id": [32817]})
    source = demo_source("west").model_copy(update={"label": OmopLabel(death=True, window_days=30.0)})
    if label is None:
        with pytest.raises(SchemaError, match=r"1 person\(s\) of the cohort of site 'west' died before their index"):
            read_omop(_db(tmp_path, died), source=source, dictionary=D)
        return
    t = read_omop(_db(tmp_path, died), source=source, dictionary=D).ingest(D)
    assert t.labels.tolist() == [0, 0, 0, 1]


def test_person_source_values_that_are_shared_or_missing_are_refused_not_merged(tmp_path):
    def shared(t):
        p = t["person"].astype({"person_source_value": object})
        p.loc[1, "person_source_value"] = p.loc[0, "person_source_value"]  # was: 4 persons read as 3 patients
        p.loc[2, "person_source_value"] = None                               # was: a patient called 'None'
        t["person"] = p
    with pytest.raises(SchemaError) as err:
        read_omop(_db(tmp_path, shared), source=demo_source("west"), dictionary=D)
    assert [p.split(": ")[1].split(".")[0] for p in err.value.problems] == [
        "1 cohort person(s) have no person_source_value",
        "2 cohort person(s) share their person_source_value with another person"]
    assert "west-0000" not in str(err.value)



def as_text(tables):
    """The CDM tables with every column text, empty cells '' (a CSV loaded into VARCHAR columns)."""
    return {n: df.astype(str).replace({"None": "", "nan": "", "NaT": "", "<NA>": ""}) for n, df in tables.items()}


def _text_db(path, cell=None, text=True):
    """A small west CDM in DuckDB with every column VARCHAR (``text``); ``cell``: (table, column,
    text) put in row 0."""
    import duckdb

    table, schema = demo_hospitals()[3]
    tables = omop_tables(table.iloc[:4], schema, D)
    tables = as_text(tables) if text else tables
    if cell:
        tables[cell[0]].loc[0, cell[1]] = cell[2]
    with duckdb.connect(str(path)) as con:
        for name, df in tables.items():
            con.register("df", df)
            con.execute(f"CREATE TABLE {name} AS SELECT * FROM df")
            con.unregister("df")
    return omop_engine(path)


def test_a_cdm_stored_as_text_reads_as_the_typed_one_and_a_bad_cell_is_named(tmp_path):
    """Issue: text columns were cast for a folder of CSV files only; a .duckdb (or PostgreSQL) CDM
    loaded as VARCHAR ended in "the cohort query failed" (BinderException)."""
    typed = read_omop(_text_db(tmp_path / "typed.duckdb", text=False), source=demo_source("west"), dictionary=D)
    typed = typed.ingest(D)
    text = read_omop(_text_db(tmp_path / "t.duckdb"), source=demo_source("west"), dictionary=D).ingest(D)
    assert text.n_patients == 4 and (text.value == typed.value).all() and (text.time == typed.time).all()
    for i, bad in enumerate(("12,5", "01/02/2024 10:00:00", "2024-01-01T08:00:00+01:00")):
        col = "value_as_number" if "," in bad else "measurement_datetime"
        with pytest.raises(SchemaError, match=rf"a cell that is not of its column's CDM type \(in measurement.{col}\) "
                                              r".*not ISO 8601") as err:
            read_omop(_text_db(tmp_path / f"{i}.duckdb", ("measurement", col, bad)), source=demo_source("west"),
                      dictionary=D)
        assert bad not in str(err.value)


def test_a_dictionary_without_omop_concept_ids_is_named_not_an_empty_extract(tmp_path):
    """The example dictionary has LOINC codes but no omop_concept_id: every row was read, none
    mapped, and the error was "nothing to ingest ... check the window"."""
    from clinograph.sdk.ontology.dictionary import FeatureDictionary

    from clinograph.core.errors import ConfigError

    bare = FeatureDictionary(name="bare", version=D.version,
                             features=tuple(f.model_copy(update={"omop_concept_id": None}) for f in D.features))
    with pytest.raises(ConfigError, match=r"dictionary bare gives no feature an omop_concept_id: no measurement or "
                                          r"observation row of site 'west' can be mapped"):
        read_omop(_text_db(tmp_path / "t.duckdb", text=False), source=demo_source("west"), dictionary=bare)


def test_standard_unit_concepts_of_temperature_and_unknown_operators(tmp_path):
    """586323 (degree Celsius) and 9289 (degree Fahrenheit), as ETLs write body temperature with no
    unit_source_value, were refused as unknown; an operator_concept_id that is no Meas Value
    Operator was read as an exact value, silently."""
    temp = D.get("temperature").omop_concept_id

    def fahrenheit(t):
        m = t["measurement"]
        rows = _rows(t, temp)
        m["unit_concept_id"] = m["unit_concept_id"].astype(object)
        m.loc[rows, "unit_source_value"] = None
        m.loc[rows[:2], "unit_concept_id"], m.loc[rows[:2], "value_as_number"] = 9289, 98.6
        m.loc[rows[2:], "unit_concept_id"], m.loc[rows[2:], "value_as_number"] = 586323, 37.0
    t = read_omop(_db(tmp_path, fahrenheit), source=demo_source("west"), dictionary=D).ingest(D)
    assert t.value[t.node == D.node_index()["temperature"]].tolist() == pytest.approx([37.0] * 4)

    def odd_operator(t):
        m = t["measurement"]
        m["operator_concept_id"] = m["operator_concept_id"].astype(object)
        m.loc[_rows(t, GLUCOSE)[0], "operator_concept_id"] = 4_000_000   # no Meas Value Operator
        m.loc[_rows(t, GLUCOSE)[1], "operator_concept_id"] = 4172703     # "=": exact
    with pytest.raises(UnitError, match=r"operator_concept_id\(s\) \[4000000\] \(1 row\(s\)\) are not Meas Value"):
        (tmp_path / "b").mkdir()
        read_omop(_db(tmp_path / "b", odd_operator), source=demo_source("west"), dictionary=D)


def test_unit_concepts_are_read_from_the_cdms_concept_table(tmp_path):
    """A unit concept Clinograph's table lacks is read by the CDM's own concept table (UCUM)."""
    def kpa(t):
        _sbp_in_kpa_under_an_unknown_unit_concept(t, unit_source_value=None)
        t["concept"] = pd.DataFrame({"concept_id": ["9999999", "8876"], "concept_code": ["kPa", "mm[Hg]"],
                                     "vocabulary_id": ["UCUM", "UCUM"], "concept_name": ["kilopascal", "mmHg"]})
    ex = read_omop(_db(tmp_path, kpa), source=demo_source("west"), dictionary=D)
    assert _systolic_bp(ex) == pytest.approx([120.0] * 4, rel=1e-3)
    assert any("concept table (UCUM concept_code): 2" in n for n in ex.report.notes)


@pytest.mark.parametrize("datetimes", [True, False])
def test_an_etl_csv_folder_upper_case_tab_separated_without_datetimes(tmp_path, datetimes):
    """Eunomia / ETL-Synthea style table files: UPPER-CASE headers (DuckDB returned PERSON_ID: 'the
    cohort query returns no column person_id'), tab-separated, vocabulary tables and tables not
    read beside them; a CDM without *_datetime columns (v5.2, minimal ETLs) was refused as lacking
    them -- now read from the dates at 00:00, named in the report. A .csv.gz table file was not
    read ('table measurement is missing')."""
    table, schema = demo_hospitals()[3]
    for name, df in omop_tables(table.iloc[:4], schema, D).items():
        df = df.drop(columns=[] if datetimes else [c for c in df.columns if c.endswith("_datetime")])
        gz = name == "measurement" and not datetimes  # a compressed table file (DuckDB reads .csv.gz)
        df.rename(columns=str.upper).to_csv(tmp_path / f"{name.upper()}.csv{'.gz' if gz else ''}", sep="\t",
                                            index=False)
    pd.DataFrame({"CONCEPT_ID": [8876], "VOCABULARY_ID": ["UCUM"], "DOMAIN_ID": ["Unit"],
                  "CONCEPT_CODE": ["mm[Hg]"]}).to_csv(tmp_path / "CONCEPT.csv", sep="\t", index=False)
    pd.DataFrame({"DRUG_EXPOSURE_ID": [1], "PERSON_ID": [1]}).to_csv(tmp_path / "DRUG_EXPOSURE.csv", index=False)
    ex = read_omop(omop_engine(tmp_path), source=demo_source("west"), dictionary=D)
    assert ex.ingest(D).n_patients == 4
    lacks = [n for n in ex.report.notes if n.startswith("columns the CDM lacks")]
    assert lacks == ([] if datetimes else [lacks[0]]) and ("measurement.measurement_datetime" in lacks[0]
                                                           if lacks else True)
    (tmp_path / "NOTE.csv").write_bytes(b"note_id;note_text\n1;\xe9t\xe9 \xff\xfe\n")  # Latin-1: not read
    assert read_omop(omop_engine(tmp_path), source=demo_source("west"), dictionary=D).report.patients == 4
    if datetimes:  # a damaged table file that is served: named, not an internal error
        (tmp_path / "DEATH.csv").write_bytes(b"person_id;death_date\n\xff\xfe\x00\n")
        with pytest.raises(SchemaError, match=r"OMOP table file DEATH.csv cannot be read as CSV"):
            omop_engine(tmp_path)
    if not datetimes:  # dates written 20240101: the sniffer reads a number, named by table and column
        m = pd.read_csv(tmp_path / "MEASUREMENT.csv.gz", sep="\t")
        m["MEASUREMENT_DATE"] = m["MEASUREMENT_DATE"].str.replace("-", "").astype(int)
        m.to_csv(tmp_path / "MEASUREMENT.csv.gz", sep="\t", index=False)
        with pytest.raises(SchemaError, match=r"CDM type \(in measurement.measurement_date\)"):
            read_omop(omop_engine(tmp_path), source=demo_source("west"), dictionary=D)


def test_a_number_beside_a_censored_text_is_censored_not_exact(tmp_path):
    """value_as_number 3.0 beside value_source_value '<3.0' and no operator_concept_id (how many ETLs
    write a below-detection lab) was read as an exact 3.0, silently."""
    def both(t):
        m = t["measurement"]
        rows = _rows(t, GLUCOSE)
        m.loc[rows[0], "value_as_number"], m.loc[rows[0], "value_source_value"] = 3.0, "<3.0"
        m.loc[rows[1], "value_as_number"], m.loc[rows[1], "value_source_value"] = 1.0, "<2.0"   # a substitute
        m.loc[rows[2], "value_as_number"], m.loc[rows[2], "value_source_value"] = 4.0, "4.0"
    engine = _db(tmp_path, both)
    with pytest.raises(UnitError, match=r"feature 'glucose': 1 censored value\(s\)"):
        read_omop(engine, source=demo_source("west"), dictionary=D)
    ex = read_omop(engine, source=demo_source("west").model_copy(update={"censored": "half_bound"}), dictionary=D)
    assert 1.5 in ex.ingest(D).value.tolist()
    assert any("censored by their text" in n and n.endswith(": 1") for n in ex.report.notes)
    assert any("an ETL's substitute; read as value_as_number): 1" in n for n in ex.report.notes)


def test_a_date_only_row_of_the_index_day_is_counted(tmp_path):
    """A measurement with a date and no time on the index day reads at 00:00, before an index time
    later that day, though it may have been taken after it: counted, not silent."""
    def dated(t):
        m = t["measurement"]
        row = _rows(t, GLUCOSE)[1]                      # person 2, whose index time is 01:00
        pid = m.loc[row, "person_id"]
        v = t["visit_occurrence"]
        index = v.loc[v["person_id"] == pid, "visit_start_datetime"].min()
        m.loc[row, "measurement_datetime"] = None
        m.loc[row, "measurement_date"] = pd.Timestamp(index).date()
    ex = read_omop(_db(tmp_path, dated), source=demo_source("west"), dictionary=D)
    assert any(n.startswith("rows of the index day at 00:00") and n.endswith(": 1") for n in ex.report.notes)


def test_a_table_file_damaged_past_the_sniffed_rows_is_named_not_a_cohort_query_failure(tmp_path):
    """DuckDB sniffs a CSV's first 20 480 rows: non-UTF-8 bytes after them failed the read as 'the
    cohort query failed (InvalidInputException) ... check it against the CDM'."""
    table, schema = demo_hospitals()[3]
    for name, df in omop_tables(table.iloc[:4], schema, D).items():
        if name == "measurement":
            df = pd.concat([df] * (21_000 // len(df) + 1), ignore_index=True)
            df["measurement_id"] = range(1, len(df) + 1)
        df.to_csv(tmp_path / f"{name}.csv", index=False)
    with open(tmp_path / "measurement.csv", "ab") as fh:
        fh.write(b"0,1,3027018,2024-01-01,2024-01-01 00:00:00,32817,1.0,\xff\xfe,hr,8541,,,\n")
    with pytest.raises(SchemaError, match=r"OMOP folder of site 'west' cannot be read past its first rows"):
        read_omop(omop_engine(tmp_path), source=demo_source("west"), dictionary=D)
