"""Done-criterion test: each demo hospital read from CSV, OMOP (DuckDB and PostgreSQL), MEDS and
FHIR ingests to the same table (MEDS values to float32 precision, MEDS patients renamed from
subject ids). The PostgreSQL server is started here, in a temporary cluster, and stopped."""

from __future__ import annotations

import pandas as pd
import pytest
import sqlalchemy as sa
from clinograph.sdk.datasets.ehr import LABEL_CODE, write_fhir, write_meds
from clinograph.sdk.datasets.omop import demo_source, write_omop
from clinograph.sdk.ingest import ingest, read_table
from clinograph.sdk.ingest.fhir import read_fhir
from clinograph.sdk.ingest.meds import read_meds
from clinograph.sdk.ingest.omop import omop_engine, read_omop
from ehr_helpers import HOSPITALS, D, assert_same, demo_hospitals
from pg_server import pg_bin, postgres_server


@pytest.fixture(scope="module")
def pg_url():
    if pg_bin() is None:
        pytest.skip("PostgreSQL server binaries are absent (Debian package `postgresql`; `make postgres` installs "
                    "them)")
    with postgres_server() as url:
        yield url


@pytest.mark.parametrize("which", range(4), ids=[h.site for h in HOSPITALS])
def test_csv_omop_meds_and_fhir_give_the_same_table(tmp_path, which):
    table, schema = demo_hospitals()[which]
    site = schema.site
    table.to_csv(tmp_path / "h.csv", index=False)
    from_csv = ingest(read_table(tmp_path / "h.csv"), schema=schema, dictionary=D)
    assert_same(ingest(table, schema=schema, dictionary=D), from_csv)

    engine = sa.create_engine(f"duckdb:///{tmp_path / 'omop.duckdb'}")
    write_omop(engine, table, schema, D)
    engine.dispose()
    assert_same(from_csv, read_omop(omop_engine(tmp_path / "omop.duckdb"), source=demo_source(site),
                                    dictionary=D).ingest(D))

    labels = write_meds(tmp_path / "meds", table, schema, D)
    subject = {str(i): p for i, p in enumerate(table[schema.patient_id])}
    assert_same(from_csv, read_meds(tmp_path / "meds", dictionary=D, site=site, labels=labels, lookback_hours=24.0).ingest(D),
                ids_b=subject, rtol=1e-6)

    write_fhir(tmp_path / "fhir", table, schema, D)
    assert_same(from_csv, read_fhir(tmp_path / "fhir", dictionary=D, site=site, label_code=LABEL_CODE).ingest(D))


def test_omop_on_a_real_postgresql_server(pg_url):
    engine = sa.create_engine(pg_url)
    for table, schema in demo_hospitals():
        write_omop(engine, table, schema, D, cdm_schema=f"cdm_{schema.site}")
    from clinograph.sdk.ingest.omop_vocab import UNIT_CONCEPTS

    first = demo_hospitals()[0][1].site  # a CDM with its vocabulary: units read from its concept table
    pd.DataFrame({"concept_id": list(UNIT_CONCEPTS), "concept_code": list(UNIT_CONCEPTS.values()),
                  "vocabulary_id": "UCUM", "concept_name": "unit"}).to_sql("concept", engine, schema=f"cdm_{first}",
                                                                           index=False)
    for table, schema in demo_hospitals():
        from_csv = ingest(table, schema=schema, dictionary=D)
        for by_sql in (False, True):
            source = demo_source(schema.site, cdm_schema=f"cdm_{schema.site}", cohort_sql=by_sql)
            ex = read_omop(omop_engine(pg_url), source=source, dictionary=D)
            assert_same(from_csv, ex.ingest(D))
            assert any("concept table" in n for n in ex.report.notes) == (schema.site == first)
    engine.dispose()


def test_every_documented_source_key_parses_and_every_key_is_documented():
    import re
    import tomllib
    from pathlib import Path

    from clinograph.sdk.ingest.omop import (
        OmopCohort,
        OmopConditions,
        OmopLabel,
        OmopPerson,
        OmopSex,
    )
    from clinograph.sdk.ingest.sources import EhrSourceConfig, FhirOptions, MedsOptions, OmopOptions

    doc = (Path(__file__).resolve().parents[3] / "docs" / "ehr_formats.md").read_text()
    block = re.search(r"### Every source-file key\n\n```toml\n(.*?)```", doc, re.S).group(1)
    data = tomllib.loads(block)
    for kind in ("omop", "meds", "fhir"):
        assert EhrSourceConfig.model_validate({"site": data["site"], kind: data[kind]}).kind == kind
    documented = {"omop": set(data["omop"]), "meds": set(data["meds"]), "fhir": set(data["fhir"]),
                  "person": set(data["omop"]["person"]), "conditions": set(data["omop"]["conditions"]),
                  "sex": set(data["omop"]["person"]["sex"]), "label": set(data["omop"]["label"])}
    for model, keys in ((OmopOptions, "omop"), (MedsOptions, "meds"), (FhirOptions, "fhir"), (OmopPerson, "person"),
                        (OmopConditions, "conditions"), (OmopSex, "sex")):
        names = {f.alias or n for n, f in model.model_fields.items()}
        assert names <= documented[keys], (model.__name__, names - documented[keys])
    label_keys = {*OmopLabel.model_fields} - {"observation_concept_ids", "death"}  # shown in the comment
    assert label_keys <= documented["label"] and "observation_concept_ids" in block and "death = true" in block
    assert all(k in block for k in OmopCohort.model_fields)


def test_a_hostile_cohort_query_on_postgresql_changes_nothing_and_is_a_clear_error(pg_url):
    """Issue 31: on a server, a second statement or a SELECT that writes ran (saved only by a later
    error's rollback) and ended in raw driver errors. Here as the superuser, to show that one
    statement and the read-only transaction hold even where the role could write."""
    from clinograph.sdk.ingest.omop import OmopCohort

    from clinograph.core.errors import ClinographError

    engine = sa.create_engine(pg_url)
    table, schema = demo_hospitals()[0]
    cdm = f"cdm_hostile_{schema.site}"
    write_omop(engine, table, schema, D, cdm_schema=cdm)
    base = f"SELECT person_id, visit_start_datetime AS index_datetime FROM {cdm}.visit_occurrence"  # noqa: S608

    def state():
        with engine.connect() as c:
            tables = sorted(r[0] for r in c.exec_driver_sql(
                f"SELECT tablename FROM pg_tables WHERE schemaname = '{cdm}'"))  # noqa: S608
            return tables, c.exec_driver_sql(f"SELECT count(*) FROM {cdm}.observation").scalar()  # noqa: S608

    before = state()
    hostile = {
        base + f"; DROP TABLE {cdm}.death": r"one SELECT statement.*2 statement\(s\): SELECT, DROP",
        base + f"; COMMIT; CREATE TABLE {cdm}.evil AS SELECT 1 AS x; " + base: r"one SELECT statement.*SELECT, "
                                                                                r"TRANSACTION, CREATE",
        f"WITH d AS (DELETE FROM {cdm}.observation RETURNING person_id) "  # noqa: S608
        "SELECT person_id, CAST(now() AS TIMESTAMP) AS index_datetime FROM d": r"failed \(ReadOnlySqlTransaction\)",
        f"SELECT person_id, CAST(now() AS TIMESTAMP) AS index_datetime FROM {cdm}.person "  # noqa: S608
        "WHERE set_config('transaction_read_only', 'off', true) IS NOT NULL": r"failed \(\w+\)",
        f"SELECT person_id, now() AS index_datetime FROM {cdm}.person": r"index_datetime with a time zone",  # noqa: S608
    }
    for sql, found in hostile.items():
        source = demo_source(schema.site, cdm_schema=cdm, cohort_sql=True).model_copy(
            update={"cohort": OmopCohort(sql=sql)})
        with pytest.raises(ClinographError, match=found):
            read_omop(omop_engine(pg_url), source=source, dictionary=D)
        assert state() == before, sql
    engine.dispose()


def test_a_postgresql_cdm_stored_as_text_reads_as_the_typed_one_and_a_bad_cell_is_named(pg_url):
    """Text columns were cast for CSV folders only: on PostgreSQL a CDM loaded as TEXT failed
    (``character varying = integer``) as "the cohort query failed", and a date such as 01/02/2024
    would be read by the server's DateStyle."""
    from clinograph.sdk.datasets.omop import omop_tables

    from clinograph.core.errors import SchemaError

    table, schema = demo_hospitals()[3]
    engine = sa.create_engine(pg_url)
    write_omop(engine, table.iloc[:4], schema, D, cdm_schema="cdm_typed")
    tables = omop_tables(table.iloc[:4], schema, D)
    with engine.begin() as conn:
        for cdm, cell in (("cdm_text", None), ("cdm_us_date", "01/02/2024 10:00:00")):
            conn.exec_driver_sql(f"CREATE SCHEMA {cdm}")
            for name, df in tables.items():
                text = df.astype(str).replace({"None": "", "nan": "", "NaT": ""})
                if cell and name == "measurement":
                    text.loc[0, "measurement_datetime"] = cell
                text.to_sql(name, conn, schema=cdm, index=False, dtype=dict.fromkeys(text.columns, sa.Text))
    typed = read_omop(omop_engine(pg_url), source=demo_source("west", cdm_schema="cdm_typed"), dictionary=D).ingest(D)
    text = read_omop(omop_engine(pg_url), source=demo_source("west", cdm_schema="cdm_text"), dictionary=D).ingest(D)
    assert_same(typed, text)
    with pytest.raises(SchemaError, match=r"a cell that is not of its column's CDM type \(in "
                                          r"measurement.measurement_datetime\) .*not ISO 8601"):
        read_omop(omop_engine(pg_url), source=demo_source("west", cdm_schema="cdm_us_date"), dictionary=D)
    engine.dispose()
