"""`clinograph check SCHEMA TABLE`: a local preview of what a table becomes -- CSV and EHR sources."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
import tomli_w
from clinograph.sdk.datasets.alarm import DICTIONARY_PATH
from clinograph.sdk.datasets.ehr import LABEL_CODE, write_fhir, write_meds
from clinograph.sdk.datasets.omop import ICU_VISIT, SHUNT_CONDITION, write_omop
from typer.testing import CliRunner

from clinograph.cli import app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sdk" / "ingest"))
from ehr_helpers import D, demo_hospitals  # noqa: E402


def _run(*args):
    return CliRunner().invoke(app, ["check", *map(str, args), "--dictionary", str(DICTIONARY_PATH)])


def _schema_file(tmp_path, schema):
    path = tmp_path / "site_schema.toml"
    path.write_text(tomli_w.dumps(schema.model_dump(mode="json", exclude_none=True)))
    return path


@pytest.mark.slow  # several `clinograph check` runs
def test_check_previews_a_csv_without_values_or_ids(tmp_path):
    table, schema = demo_hospitals()[0]
    table.to_csv(tmp_path / "north.csv", index=False, sep=";", decimal=",")
    r = _run(_schema_file(tmp_path, schema), tmp_path / "north.csv")
    assert r.exit_code == 0, r.output
    out = r.output
    assert "dialect: delimiter ';', decimal ','" in out
    assert f"patients: {len(table)}" in out
    assert "glucose" in out and "converted mg/dL -> mmol/L" in out and "<- column 'GLU'" in out
    assert "features this hospital does not observe" not in out  # north has every feature
    assert "Nothing was sent" in out
    assert "north-0000" not in out  # no patient id


def test_check_names_every_problem_and_refuses(tmp_path):
    table, schema = demo_hospitals()[0]
    table = table.assign(GLU=table["GLU"].astype(object))
    table.loc[0, "GLU"] = "ZQXCANARY"
    table.to_csv(tmp_path / "north.csv", index=False)
    r = _run(_schema_file(tmp_path, schema.model_copy(update={"ignore": ()})), tmp_path / "north.csv")
    assert r.exit_code == 2
    assert "refused:" in r.output and "Column 'GLU' (glucose): row 1: text where a number is expected" in r.output
    assert "ZQXCANARY" not in r.output


def test_check_previews_omop_meds_and_fhir_sources(tmp_path):
    table, schema = demo_hospitals()[3]
    engine = sa.create_engine(f"duckdb:///{tmp_path / 'omop.duckdb'}")
    write_omop(engine, table, schema, D)
    engine.dispose()
    (tmp_path / "omop.toml").write_text(tomli_w.dumps({"site": "west", "omop": {
        "cohort": {"visit_concept_ids": [ICU_VISIT]}, "patient_id": "person_source_value",
        "label": {"condition_concept_ids": [SHUNT_CONDITION], "window_days": 2.0}}}))
    r = _run(tmp_path / "omop.toml", tmp_path / "omop.duckdb")
    assert r.exit_code == 0, r.output
    assert "source: OMOP CDM v5.4" in r.output and "not in the dictionary" in r.output and "'OMOP/3012888'" in r.output

    write_meds(tmp_path / "meds", table, schema, D)
    (tmp_path / "meds.toml").write_text(tomli_w.dumps({"site": "west", "meds": {"labels": "meds/labels.parquet", "lookback_hours": 24.0}}))
    r = _run(tmp_path / "meds.toml", tmp_path / "meds")
    assert r.exit_code == 0, r.output
    assert "source: MEDS" in r.output and f"patients: {len(table)}" in r.output

    write_fhir(tmp_path / "fhir", table, schema, D)
    (tmp_path / "fhir.toml").write_text(tomli_w.dumps({"site": "west", "fhir": {"label_code": LABEL_CODE}}))
    r = _run(tmp_path / "fhir.toml", tmp_path / "fhir")
    assert r.exit_code == 0, r.output
    assert "source: FHIR R4" in r.output and "heart_rate" in r.output


def test_a_source_file_is_strict(tmp_path):
    (tmp_path / "bad.toml").write_text(tomli_w.dumps({"site": "w", "omop": {"cohort": {"visit_concept_ids": [1]}},
                                                      "meds": {}}))
    r = _run(tmp_path / "bad.toml", tmp_path)
    assert r.exit_code == 2 and "exactly one of [omop], [meds], [fhir]" in r.output


def test_check_turns_an_unexpected_error_into_exit_3_without_a_traceback(tmp_path, monkeypatch):
    import clinograph.commands.check as check_cmd

    def boom(*args, **kwargs):
        raise RuntimeError("ZQXCANARY-007 72.5")  # e.g. a library error quoting a cell

    monkeypatch.setattr(check_cmd, "preview", boom)
    monkeypatch.delenv("CLINOGRAPH_DEBUG", raising=False)
    r = _run(tmp_path / "s.toml", tmp_path / "t.csv")
    assert r.exit_code == 3 and "internal error (RuntimeError)" in r.output
    assert "ZQXCANARY" not in r.output and not isinstance(r.exception, RuntimeError)


def test_check_warns_when_every_label_is_one_class(tmp_path):
    table, schema = demo_hospitals()[0]
    table.assign(**{schema.label: 1}).to_csv(tmp_path / "t.csv", index=False)
    r = _run(_schema_file(tmp_path, schema), tmp_path / "t.csv")
    assert r.exit_code == 0, r.output
    assert "warning: every patient's label is 1" in r.output and "0 negative" in r.output


def test_check_warns_about_schema_columns_the_table_lacks(tmp_path):
    table, schema = demo_hospitals()[0]
    gone = next(iter(schema.columns))
    table.drop(columns=[gone]).to_csv(tmp_path / "t.csv", index=False)
    r = _run(_schema_file(tmp_path, schema), tmp_path / "t.csv")
    assert r.exit_code == 0, r.output
    assert f"warning: the site schema maps 1 column(s) the table does not have: {gone!r}" in r.output


def test_check_warns_about_mapped_columns_without_a_value(tmp_path):
    # before: one empty mapped column (a feature a small hospital does not measure) refused the whole table
    table, schema = demo_hospitals()[0]
    empty = next(iter(schema.columns))
    table.assign(**{empty: None}).to_csv(tmp_path / "t.csv", index=False)
    r = _run(_schema_file(tmp_path, schema), tmp_path / "t.csv")
    assert r.exit_code == 0, r.output
    assert f"warning: 1 mapped column(s) hold no value in any row: {empty!r}" in r.output


def test_check_prints_hostile_column_names_escaped(tmp_path):
    # before: an ignored column's name went raw to the terminal (ANSI escapes, bidi overrides)
    table, schema = demo_hospitals()[0]
    hostile = "note\x1b[2J\u202e"
    table.assign(**{hostile: "x"}).to_csv(tmp_path / "t.csv", index=False)
    r = _run(_schema_file(tmp_path, schema.model_copy(update={"ignore": (hostile,)})), tmp_path / "t.csv")
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.output and "\u202e" not in r.output and "columns ignored: 'note\\x1b[2J\\u202e'" in r.output


def test_check_names_the_columns_whose_cells_a_declared_missing_value_blanked(tmp_path):
    # before: only the total ("cells read as missing ([policy] missing_values): 3"): a sentinel such as 99 that
    # is also a real value somewhere (a heart rate of 99) was blanked there without the preview saying where
    from clinograph.commands.check import preview

    (tmp_path / "d.toml").write_text('name = "d"\nversion = 1\n[[features]]\nid = "heart_rate"\nname = "HR"\n'
                                     'kind = "numeric"\nunit = "/min"\nreference_low = 60\nreference_high = 100\n'
                                     '[[features]]\nid = "smoker"\nname = "Smoker"\nkind = "binary"\n')
    (tmp_path / "s.toml").write_text('site = "h"\npatient_id = "pid"\nlabel = "y"\n[columns.HR]\n'
                                     'feature = "heart_rate"\n[columns.smokes]\nfeature = "smoker"\n'
                                     '[policy]\nmissing_values = ["99"]\n')
    (tmp_path / "t.csv").write_text("pid,HR,smokes,y\na,99,1,0\nb,99.0,99,1\nc,70,0,0\n")
    lines = preview(tmp_path / "s.toml", str(tmp_path / "t.csv"), dictionary=tmp_path / "d.toml")
    assert "  cells read as missing ([policy] missing_values): 3 (by column: 'HR' 2, 'smokes' 1)" in lines


def test_check_reads_a_synthea_style_fhir_folder(tmp_path):
    """Synthea's FHIR R4 output as it writes it: a transaction Bundle a patient named after the
    patient, urn:uuid references, resources of many types, a blood-pressure panel of components,
    a date-only lab and a censored one, beside a hospitalInformation Bundle."""
    import json

    pid, ucum = "8f789d0b-3145-4cf2-8504-13159edaa747", "http://unitsofmeasure.org"

    def obs(code, when, **value):
        return {"resourceType": "Observation", "id": f"o-{code}", "status": "final",
                "code": {"coding": [{"system": "http://loinc.org", "code": code}]},
                "subject": {"reference": f"urn:uuid:{pid}"}, "effectiveDateTime": when, **value}

    def qty(v, unit, **extra):
        return {"valueQuantity": {"value": v, "unit": unit, "system": ucum, "code": unit, **extra}}

    resources = [
        {"resourceType": "Patient", "id": pid, "gender": "male", "birthDate": "1960-04-02"},
        {"resourceType": "Encounter", "id": "e1", "status": "finished", "class": {"code": "AMB"}},
        {"resourceType": "Condition", "id": "c1"}, {"resourceType": "MedicationRequest", "id": "m1"},
        {"resourceType": "Immunization", "id": "i1"}, {"resourceType": "Claim", "id": "cl1"},
        obs("8867-4", "2020-01-01T10:00:00-05:00", **qty(72, "/min")),
        {**obs("85354-9", "2020-01-01T10:00:00-05:00"), "component": [
            {"code": {"coding": [{"system": "http://loinc.org", "code": "8480-6"}]}, **qty(120, "mm[Hg]")}]},
        obs("2345-7", "2020-01-01", **qty(90, "mg/dL")),
        obs("2160-0", "2020-01-01T08:00:00-05:00", **qty(0.5, "mg/dL", comparator="<")),
        obs("72166-2", "2020-01-01T10:00:00-05:00", valueCodeableConcept={"text": "Never smoker"})]
    folder = tmp_path / "fhir"
    folder.mkdir()
    bundle = {"resourceType": "Bundle", "type": "transaction",
              "entry": [{"fullUrl": f"urn:uuid:{r['id']}", "resource": r} for r in resources]}
    (folder / f"Zqxname12_Doe34_{pid}.json").write_text(json.dumps(bundle))
    (folder / "hospitalInformation1671.json").write_text(json.dumps(
        {"resourceType": "Bundle", "type": "batch", "entry": [{"resource": {"resourceType": "Organization"}}]}))
    (tmp_path / "fhir.toml").write_text(tomli_w.dumps({"site": "syn", "fhir": {"censored": "half_bound"}}))
    r = _run(tmp_path / "fhir.toml", folder)
    assert r.exit_code == 0, r.output
    out = r.output
    assert "other resources skipped (Claim 1, Condition 1, Encounter 1, Immunization 1, MedicationRequest 1, " \
           "Organization 1): 6" in out
    assert "dated to the day only, read at 00:00 UTC of that day: 1" in out
    assert "censored values of 'creatinine' read as half the bound below a limit: 1" in out
    assert "without a numeric or boolean value: 1" in out
    assert all(f in out for f in ("heart_rate ", "systolic_bp ", "glucose ", "creatinine "))
    assert "Zqxname" not in out and pid not in out


def test_check_warns_about_a_column_far_from_its_reference_range(tmp_path):
    # a heart rate written in hundreds (0.72): physically possible, so it was read without a word
    table, schema = demo_hospitals()[0]
    col = next(c for c, cm in schema.columns.items() if cm.feature == "heart_rate")
    table.assign(**{col: table[col] / 100}).to_csv(tmp_path / "t.csv", index=False)
    r = _run(_schema_file(tmp_path, schema), tmp_path / "t.csv")
    assert r.exit_code == 0, r.output
    assert f"warning: column {col!r}: three quarters of its values lie more than 5 times below the reference range" in r.output


def test_check_counts_a_survival_tables_events_not_positives(tmp_path):
    """A [survival] table's labels are its events: check said 'labels: N positive, M negative'."""
    from clinograph.sdk.ontology.schema import SurvivalColumns

    table, schema = demo_hospitals()[0]
    n = len(table)
    table = table.assign(fu=[30.0 + i for i in range(n)], dead=[i % 3 == 0 for i in range(n)])
    table = table.drop(columns=[schema.label])
    schema = schema.model_copy(update={"label": None, "survival": SurvivalColumns(time="fu", event="dead")})
    table.to_csv(tmp_path / "t.csv", index=False)
    r = _run(_schema_file(tmp_path, schema), tmp_path / "t.csv")
    assert r.exit_code == 0, r.output
    events = sum(i % 3 == 0 for i in range(n))
    assert f"survival: {events} event(s), {n - events} censored (labels are the events)" in r.output
    assert "positive" not in r.output


def test_check_reads_a_data_dirs_source_url_and_names_an_export_of_another_format(tmp_path):
    """A SuperNode's data-dir keeps an OMOP database URL in source.url (credentials off the command line).
    Before: `clinograph check schema.toml source.url` opened the file as a DuckDB database ("Cannot connect to the
    OMOP database duckdb:///source.url ... check the host, port, ... PGPASSFILE"). And a source file of one format
    over an export of another said only what its own format lacked."""
    (tmp_path / "omop.toml").write_text(tomli_w.dumps({"site": "west", "omop": {
        "cohort": {"visit_concept_ids": [ICU_VISIT]},
        "label": {"condition_concept_ids": [SHUNT_CONDITION], "window_days": 2.0}}}))
    (tmp_path / "source.url").write_text("postgresql+psycopg://reader:TopS3cret@127.0.0.1:1/cdm\n")
    (tmp_path / "source.url").chmod(0o600)  # a password: its owner's alone (tests/sdk/federation/test_node.py)
    r = _run(tmp_path / "omop.toml", tmp_path / "source.url")
    assert r.exit_code == 2
    assert "refused: Cannot connect to the OMOP database postgresql+psycopg://reader:***@127.0.0.1:1/cdm" in r.output
    assert "TopS3cret" not in r.output
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "person.csv").write_text("person_id\n")
    (tmp_path / "fhir.toml").write_text(tomli_w.dumps({"site": "west", "fhir": {"label_code": LABEL_CODE}}))
    r = _run(tmp_path / "fhir.toml", tmp_path / "export")
    assert r.exit_code == 2
    assert "holds no .ndjson, .ndjson.gz or .json file" in r.output
    assert "export looks like an OMOP CDM" in r.output and "the source file is [fhir]: write the source file's [omop]" \
        in " ".join(r.output.split())
