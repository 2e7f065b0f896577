"""`clinograph predict` back into the EHR: FHIR R4 RiskAssessments (NDJSON, validated with
fhir.resources) and the OMOP-side results table (CSV, and a table in the OMOP DuckDB the
patients were read from), each naming the model's digest and carrying the same risks as --out."""

from __future__ import annotations

import hashlib
import json

import pandas as pd
import pytest
import sqlalchemy as sa
import tomli_w
from clinograph.sdk.config import HospitalConfig
from clinograph.sdk.datasets.alarm import DICTIONARY_PATH
from clinograph.sdk.federation.build import build_task
from clinograph.sdk.model.fhir_risk import MODEL_SYSTEM
from clinograph.sdk.model.omop_results import RESULT_COLUMNS
from sdk_helpers import raw_tables, small_tables
from typer.testing import CliRunner

from clinograph.cli import app
from clinograph.core.identity import Identity

RiskAssessment = pytest.importorskip("fhir.resources.R4B.riskassessment").RiskAssessment
runner = CliRunner()
HOSPITAL = Identity.generate("north")
MRN = "https://hospital.example/fhir/sid/mrn"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    t = small_tables()[0]
    cfg = HospitalConfig.model_validate({"model": {"hidden": 8}, "graph": {"k_similar": 0}})
    task = build_task(t, dictionary=t.dictionary, config=cfg)
    task.train(round_=0, epochs=2, plan_options={})
    task.finish()
    path, _ = task.export(tmp_path_factory.mktemp("model") / "model.safetensors", signer=HOSPITAL)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def _run(tmp_path, model, table, schema, *extra):
    return runner.invoke(app, ["predict", "--insecure-untrusted-model", "--model", str(model), "--table", str(table), "--schema", str(schema),
                               "--dictionary", str(DICTIONARY_PATH), "--out", str(tmp_path / "risks.csv"),
                               "--trusted-key", HOSPITAL.public.b64(), *extra])


def _csv_table(tmp_path, n=20):
    df, schema = raw_tables()[0]
    df.drop(columns=[schema.label]).head(n).to_csv(tmp_path / "new.csv", index=False)
    (tmp_path / "schema.toml").write_text(tomli_w.dumps(schema.model_dump(mode="json", exclude_none=True)))
    return tmp_path / "new.csv", tmp_path / "schema.toml"


def _resources(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(x) for x in lines], [RiskAssessment.parse_raw(x) for x in lines]


def test_fhir_risk_assessments_and_omop_csv_round_trip_the_risks(tmp_path, exported):
    model, digest = exported
    table, schema = _csv_table(tmp_path)
    res = _run(tmp_path, model, table, schema, "--fhir-out", str(tmp_path / "risk.ndjson"), "--fhir-subject", MRN,
               "--outcome", "intrapulmonary shunt", "--omop-out", str(tmp_path / "omop.csv"))
    assert res.exit_code == 0, res.output
    assert "20 FHIR RiskAssessment(s) written" in res.output and "20 OMOP result row(s) written" in res.output
    risks = pd.read_csv(tmp_path / "risks.csv", dtype={"patient_id": str}, float_precision="round_trip")
    raw, parsed = _resources(tmp_path / "risk.ndjson")
    assert len(parsed) == len(risks) == 20
    by_patient = {r.subject.identifier.value: r for r in parsed}
    for pid, risk in zip(risks["patient_id"], risks["risk"], strict=True):
        ra = by_patient[pid]
        assert ra.status == "final" and ra.subject.identifier.system == MRN
        assert len(ra.prediction) == 1 and float(ra.prediction[0].probabilityDecimal) == risk
        assert ra.prediction[0].outcome.text == "intrapulmonary shunt" and ra.prediction[0].whenRange is None
        assert ra.method.coding[0].system == MODEL_SYSTEM and ra.method.coding[0].code == digest
        assert "Clinograph" in ra.method.text and digest in ra.basis[0].display
    assert len({r["occurrenceDateTime"] for r in raw}) == 1 and len({r["id"] for r in raw}) == 20
    omop = pd.read_csv(tmp_path / "omop.csv", dtype={"person_source_value": str}, float_precision="round_trip")
    assert tuple(omop.columns) == RESULT_COLUMNS
    assert omop["person_id"].isna().all() and omop["horizon"].isna().all() and omop["horizon_unit"].isna().all()
    assert (omop["model_sha256"] == digest).all()
    assert omop["score"].tolist() == risks["risk"].tolist()
    assert omop["person_source_value"].tolist() == risks["patient_id"].tolist()
    created = pd.Timestamp(raw[0]["occurrenceDateTime"]).tz_convert("UTC").tz_localize(None)
    assert (pd.to_datetime(omop["created_datetime"]) == created).all()


def test_fhir_out_from_a_table_needs_the_id_system_and_nothing_is_written(tmp_path, exported):
    model, _ = exported
    table, schema = _csv_table(tmp_path, n=5)
    res = _run(tmp_path, model, table, schema, "--fhir-out", str(tmp_path / "risk.ndjson"))
    assert res.exit_code == 2 and "--fhir-out needs --fhir-subject" in res.output
    res = _run(tmp_path, model, table, schema, "--fhir-out", str(tmp_path / "risk.ndjson"), "--fhir-subject", "mrn")
    assert res.exit_code == 2 and "neither 'reference'" in res.output
    res = _run(tmp_path, model, table, schema, "--omop-table", "clinograph_risk")
    assert res.exit_code == 2 and "--schema must be an [omop] source file" in res.output
    res = _run(tmp_path, model, table, schema, "--omop-out", str(tmp_path / "risks.csv"))
    assert res.exit_code == 2 and "name the same file" in res.output
    assert not (tmp_path / "risk.ndjson").exists() and not (tmp_path / "risks.csv").exists()


OMOP_SOURCE = {"site": "north", "omop": {
    "cohort": {"visit_concept_ids": [32037]}, "label": {"condition_concept_ids": [2000000100], "window_days": 2.0},
    "patient_id": "person_id", "lookback_days": 1.0, "after_days": 0.0}}


def test_omop_database_source_gets_a_results_table_with_person_ids(tmp_path, exported):
    from clinograph.sdk.datasets.omop import write_omop
    from clinograph.sdk.ontology import FeatureDictionary

    model, digest = exported
    df, schema = raw_tables()[0]
    db = tmp_path / "omop.duckdb"
    engine = sa.create_engine(f"duckdb:///{db}")
    write_omop(engine, df.head(30), schema, FeatureDictionary.from_toml(DICTIONARY_PATH))
    engine.dispose()
    (tmp_path / "omop.toml").write_text(tomli_w.dumps(OMOP_SOURCE))
    args = ("--omop-table", "clinograph_risk", "--fhir-out", str(tmp_path / "risk.ndjson"), "--fhir-subject",
            "https://hospital.example/fhir/sid/omop-person-id")
    res = _run(tmp_path, model, db, tmp_path / "omop.toml", *args)
    assert res.exit_code == 0, res.output
    assert "30 OMOP result row(s) appended to table clinograph_risk" in res.output
    risks = pd.read_csv(tmp_path / "risks.csv", dtype={"patient_id": str}, float_precision="round_trip")
    engine = sa.create_engine(f"duckdb:///{db}", connect_args={"read_only": True})
    with engine.connect() as conn:
        got = pd.read_sql("SELECT * FROM clinograph_risk ORDER BY person_id", conn)
    engine.dispose()
    assert tuple(got.columns) == RESULT_COLUMNS and len(got) == 30
    assert got["person_source_value"].isna().all() and (got["model_sha256"] == digest).all()
    expected = dict(zip(risks["patient_id"].astype(int), risks["risk"], strict=True))
    assert dict(zip(got["person_id"], got["score"], strict=True)) == expected
    _, parsed = _resources(tmp_path / "risk.ndjson")
    assert {int(r.subject.identifier.value): float(r.prediction[0].probabilityDecimal) for r in parsed} == expected
    # append-only: a second run adds its rows beside the first
    again = _run(tmp_path, model, db, tmp_path / "omop.toml", "--omop-table", "clinograph_risk")
    assert again.exit_code == 0, again.output
    engine = sa.create_engine(f"duckdb:///{db}", connect_args={"read_only": True})
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM clinograph_risk")).scalar() == 60
    engine.dispose()


def test_an_existing_table_of_another_shape_is_refused_by_name(tmp_path, exported):
    from clinograph.sdk.datasets.omop import write_omop
    from clinograph.sdk.ontology import FeatureDictionary

    model, _ = exported
    df, schema = raw_tables()[0]
    db = tmp_path / "omop.duckdb"
    engine = sa.create_engine(f"duckdb:///{db}")
    write_omop(engine, df.head(10), schema, FeatureDictionary.from_toml(DICTIONARY_PATH))
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE clinograph_risk (person_id BIGINT, score DOUBLE)"))
    engine.dispose()
    (tmp_path / "omop.toml").write_text(tomli_w.dumps(OMOP_SOURCE))
    res = _run(tmp_path, model, db, tmp_path / "omop.toml", "--omop-table", "clinograph_risk",
               "--omop-out", str(tmp_path / "omop.csv"))
    assert res.exit_code == 2
    assert "Results table clinograph_risk exists but lacks the column(s) person_source_value, model_sha256" in res.output
    # the table is written first: its refusal leaves no file behind
    assert not (tmp_path / "omop.csv").exists() and not (tmp_path / "risks.csv").exists()


def _pg_server():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "pg_server", Path(__file__).resolve().parents[1] / "sdk" / "ingest" / "pg_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_table_in_a_real_postgresql_cdm(tmp_path, exported):
    from clinograph.sdk.datasets.omop import write_omop
    from clinograph.sdk.ontology import FeatureDictionary

    pg = _pg_server()
    if pg.pg_bin() is None:
        pytest.skip("PostgreSQL server binaries are absent (Debian package `postgresql`; `make postgres`)")
    model, digest = exported
    df, schema = raw_tables()[0]
    with pg.postgres_server() as url:
        engine = sa.create_engine(url)
        write_omop(engine, df.head(15), schema, FeatureDictionary.from_toml(DICTIONARY_PATH), cdm_schema="cdm")
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE SCHEMA results"))
        (tmp_path / "omop.toml").write_text(tomli_w.dumps({**OMOP_SOURCE, "omop": {**OMOP_SOURCE["omop"],
                                                                                     "cdm_schema": "cdm"}}))
        res = _run(tmp_path, model, url, tmp_path / "omop.toml", "--omop-table", "results.clinograph_risk")
        assert res.exit_code == 0, res.output
        with engine.connect() as conn:
            got = pd.read_sql("SELECT * FROM results.clinograph_risk", conn)
        engine.dispose()
    risks = pd.read_csv(tmp_path / "risks.csv", dtype={"patient_id": str}, float_precision="round_trip")
    assert tuple(got.columns) == RESULT_COLUMNS and len(got) == 15 and (got["model_sha256"] == digest).all()
    assert dict(zip(got["person_id"], got["score"], strict=True)) == \
        dict(zip(risks["patient_id"].astype(int), risks["risk"], strict=True))


def test_a_fhir_source_read_by_id_gets_patient_references(tmp_path, exported):
    from clinograph.sdk.datasets.ehr import ALARM_SYSTEM, LABEL_CODE, write_fhir
    from clinograph.sdk.ontology import FeatureDictionary

    model, digest = exported
    df, schema = raw_tables()[0]
    write_fhir(tmp_path / "fhir", df.head(12), schema, FeatureDictionary.from_toml(DICTIONARY_PATH))
    (tmp_path / "fhir.toml").write_text(tomli_w.dumps({"site": "north", "fhir": {
        "label_code": LABEL_CODE, "systems": {ALARM_SYSTEM: "ALARM"}}}))
    res = _run(tmp_path, model, tmp_path / "fhir", tmp_path / "fhir.toml", "--fhir-out", str(tmp_path / "ra.ndjson"))
    assert res.exit_code == 0, res.output
    risks = pd.read_csv(tmp_path / "risks.csv", dtype={"patient_id": str}, float_precision="round_trip")
    _, parsed = _resources(tmp_path / "ra.ndjson")
    assert {r.subject.reference: float(r.prediction[0].probabilityDecimal) for r in parsed} == \
        {f"Patient/{p}": r for p, r in zip(risks["patient_id"], risks["risk"], strict=True)}
    assert all(r.method.coding[0].code == digest for r in parsed) and len(parsed) == 12
