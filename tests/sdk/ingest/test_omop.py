"""OMOP CDM v5.4 through SQLAlchemy on embedded DuckDB: cohorts, labels, windows, snapshots, errors."""

from __future__ import annotations

import pandas as pd
import pytest
import sqlalchemy as sa
from clinograph.sdk.datasets.omop import (
    DISTRACTOR_MEASUREMENT,
    ICU_VISIT,
    SHUNT_CONDITION,
    demo_source,
    omop_tables,
    write_omop,
)
from clinograph.sdk.ingest import ingest
from clinograph.sdk.ingest.omop import (
    OmopCohort,
    OmopLabel,
    OmopSource,
    check_cdm,
    omop_engine,
    read_omop,
)
from ehr_helpers import D, assert_same, demo_hospitals

from clinograph.core.errors import ConfigError, SchemaError, SourceUnavailable


@pytest.fixture(scope="module")
def north_db(tmp_path_factory):
    table, schema = demo_hospitals()[0]
    path = tmp_path_factory.mktemp("omop") / "north.duckdb"
    engine = sa.create_engine(f"duckdb:///{path}")
    write_omop(engine, table, schema, D)
    engine.dispose()
    return path


def test_omop_duckdb_reads_what_the_csv_holds(north_db):
    table, schema = demo_hospitals()[0]
    extract = read_omop(omop_engine(north_db), source=demo_source("north"), dictionary=D)
    assert_same(ingest(table, schema=schema, dictionary=D), extract.ingest(D))
    r = extract.report
    assert r.unmapped_codes == f"'OMOP/{DISTRACTOR_MEASUREMENT}'" and r.unmapped_rows > 0
    assert any("outside the feature window" in n for n in r.notes)
    assert r.by_feature["glucose"] > 0 and r.patients == len(table)


def test_cohort_by_sql_equals_cohort_by_concept_set(north_db):
    by_set = read_omop(omop_engine(north_db), source=demo_source("north"), dictionary=D).ingest(D)
    by_sql = read_omop(omop_engine(north_db), source=demo_source("north", cohort_sql=True), dictionary=D).ingest(D)
    assert_same(by_set, by_sql)


def test_label_window_and_observation_labels(north_db):
    table, _ = demo_hospitals()[0]
    wide = read_omop(omop_engine(north_db), source=demo_source("north").model_copy(
        update={"label": OmopLabel(condition_concept_ids=(SHUNT_CONDITION,), window_days=60.0)}), dictionary=D)
    narrow = read_omop(omop_engine(north_db), source=demo_source("north"), dictionary=D)
    n_late = sum(1 for i, y in enumerate(table["outcome"]) if y == 0 and (i + 1) % 11 == 0)
    assert wide.table.groupby("patient_id")["label"].first().sum() == \
        narrow.table.groupby("patient_id")["label"].first().sum() + n_late


def test_a_folder_of_table_files_is_read_through_duckdb(tmp_path):
    table, schema = demo_hospitals()[3]
    for name, df in omop_tables(table, schema, D).items():
        if name == "measurement":
            df.to_parquet(tmp_path / "measurement.parquet", index=False)
        else:
            df.to_csv(tmp_path / f"{name}.csv", index=False)
    extract = read_omop(omop_engine(tmp_path), source=demo_source("west"), dictionary=D)
    assert_same(ingest(table, schema=schema, dictionary=D), extract.ingest(D))


def test_measurement_datetimes_become_snapshots(tmp_path):
    table, schema = demo_hospitals()[3]
    tables = omop_tables(table.iloc[:3], schema, D)
    m = tables["measurement"]
    later = m.copy()
    later["measurement_id"] += 10_000
    later["measurement_datetime"] = later["measurement_datetime"] + pd.Timedelta(hours=30)
    tables["measurement"] = pd.concat([m, later], ignore_index=True)
    engine = sa.create_engine(f"duckdb:///{tmp_path / 'ts.duckdb'}")
    with engine.begin() as conn:
        for name, df in tables.items():
            df.to_sql(name, conn, index=False)
    source = demo_source("west").model_copy(update={"after_days": 2.0, "snapshot_hours": 24.0})
    t = read_omop(engine, source=source, dictionary=D).ingest(D)
    assert t.n_snapshots == 2 and sorted(set(t.time.tolist())) == [0, 1]


def test_missing_tables_and_columns_are_all_named(tmp_path):
    engine = sa.create_engine(f"duckdb:///{tmp_path / 'bad.duckdb'}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE person (person_id BIGINT)")
        conn.exec_driver_sql("CREATE TABLE measurement (person_id BIGINT, measurement_concept_id INT)")
    with pytest.raises(SchemaError) as err:
        read_omop(engine, source=demo_source("x"), dictionary=D)
    text = str(err.value)
    for table in ("visit_occurrence", "condition_occurrence", "observation"):
        assert f"OMOP table {table!r} is missing" in text
    assert "'person' lacks column(s) ['person_source_value', 'gender_concept_id'" in text
    assert "OMOP table 'observation_period' is missing" in text
    assert "'measurement' lacks column(s) ['measurement_date'" in text


def test_a_bad_cohort_query_is_named_without_data(north_db):
    bad = demo_source("north").model_copy(update={"cohort": OmopCohort(sql="SELECT person_id FROM person")})
    with pytest.raises(SchemaError, match=r"returns no column\(s\) \['index_datetime'\]"):
        read_omop(omop_engine(north_db), source=bad, dictionary=D)
    broken = demo_source("north").model_copy(update={"cohort": OmopCohort(sql="SELECT nonsense FROM nowhere")})
    with pytest.raises(SchemaError, match="cohort query of site 'north' failed"):
        read_omop(omop_engine(north_db), source=broken, dictionary=D)


@pytest.mark.parametrize("sql", [
    "COPY (SELECT 1 AS person_id) TO '{out}'",
    "COPY (SELECT 1 AS person_id) TO '{out}'; SELECT person_id, visit_start_datetime AS index_datetime "
    "FROM visit_occurrence",
    "SELECT person_id, visit_start_datetime AS index_datetime FROM visit_occurrence; COPY person TO '{out}'",
    "ATTACH '{out}' AS x",
])
def test_a_cohort_query_that_is_not_one_select_never_runs(north_db, tmp_path, sql):
    out = tmp_path / "written.csv"
    bad = demo_source("north").model_copy(update={"cohort": OmopCohort(sql=sql.format(out=out))})
    with pytest.raises(ConfigError, match=r"The cohort query of site 'north' must be one SELECT statement .*"
                                          r"DuckDB reads it as \d statement\(s\): (COPY|SELECT|ATTACH)"):
        read_omop(omop_engine(north_db), source=bad, dictionary=D)
    assert not out.exists()


def test_a_cohort_result_duckdb_cannot_hand_over_is_named_not_a_traceback(north_db):
    """Adversarial rerun of issue 31: a cohort of a type DuckDB cannot convert to NumPy (UHUGEINT)
    raised DuckDB's own NotImplementedException, past the SQLAlchemy errors read_omop names."""
    sql = ("SELECT CAST(person_id AS UHUGEINT) AS person_id, visit_start_datetime AS index_datetime "
           "FROM visit_occurrence")
    bad = demo_source("north").model_copy(update={"cohort": OmopCohort(sql=sql)})
    with pytest.raises(SchemaError, match=r"cohort query of site 'north' failed \(NotImplementedException\)"):
        read_omop(omop_engine(north_db), source=bad, dictionary=D)


def test_a_cohort_query_returning_no_row_is_a_schema_error(north_db):
    """Under pandas 3 the index times were mapped through an empty Series of times: TypeError
    (Cannot cast DatetimeArray to dtype float64) instead of the error naming what was read."""
    sql = "SELECT person_id, visit_start_datetime AS index_datetime FROM visit_occurrence WHERE person_id < 0"
    empty = demo_source("north").model_copy(update={"cohort": OmopCohort(sql=sql)})
    extract = read_omop(omop_engine(north_db), source=empty, dictionary=D)
    with pytest.raises(SchemaError, match=r"holds no event to ingest \(0 patient\(s\) in the cohort; rows read: 0"
                                          r".*\)\. The cohort selects no patient: check \[omop\] cohort"):
        extract.ingest(D)  # the fix names the cohort, not 'the window, the cohort and the codes' (session 53)


@pytest.mark.parametrize(("extra", "found"), [
    ("SELECT NULL, NULL", r"returns \d+ row\(s\) without a person_id or an index_datetime"),
    ("SELECT person_id, visit_start_datetime + INTERVAL 1 DAY FROM visit_occurrence",
     r"gives \d+ person\(s\) more than one index_datetime; one would be taken by row order"),
])
def test_cohort_rows_must_give_one_index_time_a_person(north_db, extra, found):
    """Adversarial rerun of issue 31: cohort rows without a person or a time were dropped without a
    word, and a person given two index times was read at whichever came first."""
    sql = f"SELECT person_id, visit_start_datetime AS index_datetime FROM visit_occurrence UNION ALL {extra}"
    bad = demo_source("north").model_copy(update={"cohort": OmopCohort(sql=sql)})
    with pytest.raises(SchemaError, match=found):
        read_omop(omop_engine(north_db), source=bad, dictionary=D)


def test_embedded_duckdb_reads_and_writes_no_other_file(north_db, tmp_path):
    secret = tmp_path / "secret.csv"
    secret.write_text("person_id,index_datetime\n1,2020-01-01 00:00:00\n")
    reads = demo_source("north").model_copy(update={"cohort": OmopCohort(sql=f"SELECT * FROM read_csv('{secret}')")})
    with pytest.raises(SchemaError, match=r"cohort query of site 'north' failed \((PermissionException|DatabaseError)"):
        read_omop(omop_engine(north_db), source=reads, dictionary=D)
    folder = tmp_path / "omop"
    folder.mkdir()
    table, schema = demo_hospitals()[3]
    for name, df in omop_tables(table, schema, D).items():
        df.to_csv(folder / f"{name}.csv", index=False)
    engine = omop_engine(folder)
    with engine.connect() as conn:  # the engine itself, whatever the caller sends it
        for sql in (f"COPY person TO '{folder / 'copy.csv'}'", f"SELECT * FROM read_csv('{secret}')",
                    "SET enable_external_access = true"):
            with pytest.raises(sa.exc.DBAPIError):
                conn.exec_driver_sql(sql)
            conn.rollback()
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM person").scalar() > 0  # its own table files: yes
    assert not (folder / "copy.csv").exists()


def test_source_configuration_is_strict():
    with pytest.raises(ConfigError, match="define the cohort one way"):
        OmopCohort(sql="SELECT 1", visit_concept_ids=(ICU_VISIT,))
    with pytest.raises(ConfigError, match="needs condition_concept_ids, observation_concept_ids or death"):
        OmopLabel(window_days=1.0)
    with pytest.raises(ConfigError, match="typo: unknown key"):
        OmopSource.model_validate({"site": "a", "cohort": {"visit_concept_ids": [1]}, "label": None, "typo": 1})
    with pytest.raises(ConfigError, match="does not exist"):
        omop_engine("/nonexistent/omop")


@pytest.mark.parametrize("url", ["http://cdm.example.org/cdm", "postgres+nodriver://reader:s3cret@db/cdm", "foo://",
                                 "mysql://reader:s3cret@db/cdm"])
def test_a_database_url_this_installation_cannot_open_is_a_config_error_without_its_password(url):
    """Before: `clinograph check omop.toml http://x/y` ended in "internal error (NoSuchModuleError)"; mysql://
    (a dialect SQLAlchemy knows, its driver not installed here) in "internal error (ModuleNotFoundError)", and a
    SuperNode whose source.url named it refused the run's hello with a traceback in its log."""
    with pytest.raises(ConfigError, match="is no database this installation can open") as caught:
        omop_engine(url)
    assert "s3cret" not in str(caught.value) and "postgresql+psycopg://" in str(caught.value)


def test_a_file_that_is_no_duckdb_database_is_named_as_such_not_as_a_connection_to_check(tmp_path):
    """Before: a SuperNode's data-dir/source.duckdb (or a `clinograph check` location) that is no DuckDB file said
    "Cannot connect to the OMOP database duckdb:///... Check the host, port, database name and credentials
    (PGPASSFILE / ~/.pgpass)" -- a fix for a database server, not for a file."""
    (tmp_path / "cdm.duckdb").write_text("person_id,year_of_birth\n1,1950\n")
    with pytest.raises(SourceUnavailable, match=r"cdm.duckdb cannot be opened as a DuckDB database \(IOException\): "
                                                r"it is no DuckDB file") as caught:
        check_cdm(omop_engine(tmp_path / "cdm.duckdb"))
    assert "PGPASSFILE" not in str(caught.value)


def test_source_records_name_each_kept_row_beside_age_and_sex_rows(tmp_path):
    """Session 53 keeps OMOP's records as a prefix and the row id, made text for the kept rows only: with the
    person's age and sex rows concatenated after them, the measurement rows' records were lost (NaN)."""
    from clinograph.sdk.ingest.sources import EhrSourceConfig, read_source
    from cohort_exports import DICTIONARY, example_cohort, omop_tables, source_files
    from cohort_exports import write_omop as write_cohort

    write_cohort(tmp_path / "omop", example_cohort())
    config = EhrSourceConfig.model_validate({"site": "h", "omop": source_files()["omop"]})
    table = read_source(config, tmp_path / "omop", dictionary=DICTIONARY).table
    ids = {f"measurement_id {i}" for i in omop_tables(example_cohort())["measurement"]["measurement_id"]}
    labs = table[table["feature"].isin(["glucose", "creatinine", "heart_rate"])]
    assert len(labs) and set(labs["source_record"]) <= ids
    assert table.loc[table["feature"] == "smoking", "source_record"].str.fullmatch(r"observation_id \d+").all()
    assert (table.loc[table["feature"] == "age", "source_record"] == "the person table").all()
