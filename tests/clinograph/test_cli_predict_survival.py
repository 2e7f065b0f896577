"""`clinograph predict` with an exported survival model: one risk column a horizon, named by it,
equal to the task's own prediction; new patients need no follow-up columns; bad input ends in
a message and exit code 2, never a traceback."""

import functools

import numpy as np
import pandas as pd
import pytest
import tomli_w
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.nsfl_task import NSFLTask
from clinograph.sdk.federation.split import hospital_split
from clinograph.sdk.ingest import ingest
from typer.testing import CliRunner

from clinograph.cli import app
from clinograph.core.identity import Identity

pytest.importorskip("lifelines")
runner = CliRunner()
ME = Identity.generate("north")
TARGET = {"kind": "survival", "time_unit": "mo", "breaks": [3, 6, 12, 24, 36], "horizon": 12}


@functools.cache
def setting():
    from clinograph.sdk.datasets.real_tables import cohort_tables

    c = cohort_tables("lung", form="survival")
    df, schema = c.hospitals[0]
    t = ingest(df, schema=schema, dictionary=c.dictionary)
    conf = SimulationConfig.model_validate({
        "federation": {"rounds": 1, "min_clients": 2}, "model": {"hidden": 8}, "graph": {"k_similar": 0},
        "training": {"lr": 0.02, "batch_size": 32}, "target": TARGET}).hospital_config()
    split = hospital_split(t.labels, site=t.site, test_fraction=0.3, validation_fraction=0.2, seed=0)
    task = NSFLTask(t, dictionary=c.dictionary, config=conf, split=split)
    task.trainer.train(task.model, round_=0, epochs=2, plan_options={})
    task.finish()
    return task, df, schema, c.dictionary


def files(tmp_path, df, schema, dictionary):
    df.to_csv(tmp_path / "new.csv", index=False)
    (tmp_path / "schema.toml").write_text(tomli_w.dumps(schema.model_dump(mode="json", exclude_none=True)))
    (tmp_path / "dictionary.toml").write_text(tomli_w.dumps(dictionary.model_dump(mode="json", exclude_none=True)))
    return tmp_path / "new.csv", tmp_path / "schema.toml", tmp_path / "dictionary.toml"


def invoke(model, table, schema, dictionary, out, *extra):
    return runner.invoke(app, ["predict", "--insecure-untrusted-model", "--model", str(model), "--table", str(table), "--schema", str(schema),
                               "--dictionary", str(dictionary), "--out", str(out), "--trusted-key", ME.public.b64(),
                               *extra])


def test_survival_risk_assessments_and_omop_rows_carry_one_risk_a_horizon(tmp_path):
    import hashlib
    import json

    from fhir.resources.R4B.riskassessment import RiskAssessment

    task, df, schema, d = setting()
    path, _ = task.export(tmp_path / "surv.safetensors", signer=ME, horizons=[6, 12, 30])
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    table, sch, dic = files(tmp_path, df.drop(columns=[schema.survival.time, schema.survival.event]).head(8),
                            schema, d)
    res = invoke(path, table, sch, dic, tmp_path / "risks.csv", "--fhir-out", str(tmp_path / "ra.ndjson"),
                 "--fhir-subject", "urn:oid:1.2.3.4", "--omop-out", str(tmp_path / "omop.csv"))
    assert res.exit_code == 0, res.output
    risks = pd.read_csv(tmp_path / "risks.csv", dtype={"patient_id": str}, float_precision="round_trip")
    lines = (tmp_path / "ra.ndjson").read_text().splitlines()
    parsed = {r.subject.identifier.value: r for r in (RiskAssessment.parse_raw(x) for x in lines)}
    assert len(parsed) == 8 and all(json.loads(x)["method"]["coding"][0]["code"] == digest for x in lines)
    for _, row in risks.iterrows():
        preds = parsed[row["patient_id"]].prediction
        assert [(float(p.whenRange.high.value), p.whenRange.high.code, p.whenRange.high.system) for p in preds] == \
            [(6.0, "mo", "http://unitsofmeasure.org"), (12.0, "mo", "http://unitsofmeasure.org"),
             (30.0, "mo", "http://unitsofmeasure.org")]
        assert [float(p.probabilityDecimal) for p in preds] == [row["risk_6mo"], row["risk_12mo"], row["risk_30mo"]]
    omop = pd.read_csv(tmp_path / "omop.csv", dtype={"person_source_value": str}, float_precision="round_trip")
    assert len(omop) == 24 and set(omop["horizon_unit"]) == {"mo"} and (omop["model_sha256"] == digest).all()
    wide = omop.pivot(index="person_source_value", columns="horizon", values="score")
    for _, row in risks.iterrows():
        assert wide.loc[row["patient_id"]].tolist() == [row["risk_6mo"], row["risk_12mo"], row["risk_30mo"]]


def test_cli_predict_writes_a_risk_column_a_horizon(tmp_path):
    task, df, schema, d = setting()
    path, _ = task.export(tmp_path / "surv.safetensors", signer=ME, horizons=[6, 12, 30])
    new = df.drop(columns=[schema.survival.time, schema.survival.event]).head(20)
    table, sch, dic = files(tmp_path, new, schema, d)
    res = invoke(path, table, sch, dic, tmp_path / "risks.csv")
    assert res.exit_code == 0, res.output
    out = pd.read_csv(tmp_path / "risks.csv")
    assert list(out.columns) == ["patient_id", "risk_6mo", "risk_12mo", "risk_30mo"] and len(out) == 20
    expected = task.predict_table(ingest(df.head(20), schema=schema, dictionary=d))  # the configured 12 months
    np.testing.assert_allclose(out["risk_12mo"].to_numpy(), expected, atol=1e-9)
    assert np.all(out["risk_6mo"] <= out["risk_12mo"]) and np.all(out["risk_12mo"] <= out["risk_30mo"])
    # the follow-up columns, when present, change nothing (never features)
    (tmp_path / "with").mkdir()
    table2, _, _ = files(tmp_path / "with", df.head(20), schema, d)
    res = invoke(path, table2, sch, dic, tmp_path / "risks2.csv")
    assert res.exit_code == 0, res.output
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "risks2.csv"), out)


def test_cli_predict_survival_bad_input_is_a_message(tmp_path):
    task, df, schema, d = setting()
    path, sidecar = task.export(tmp_path / "surv.safetensors", signer=ME)
    table, sch, dic = files(tmp_path, df.head(5), schema, d)
    res = invoke(tmp_path / "missing.safetensors", tmp_path / "missing.csv", sch, dic, tmp_path / "r.csv")
    assert res.exit_code == 2 and "--model" in res.output and "--table" in res.output
    assert "Traceback" not in res.output
    good = sidecar.read_text()
    sidecar.write_text('{"format": "something-else"}')
    res = invoke(path, table, sch, dic, tmp_path / "r.csv")
    assert res.exit_code == 2 and "is not a signed model description" in res.output and "Traceback" not in res.output
    (tmp_path / "junk.safetensors").write_text("not a model")
    (tmp_path / "junk.safetensors.json").write_text(good)
    res = invoke(tmp_path / "junk.safetensors", table, sch, dic, tmp_path / "r.csv")
    assert res.exit_code == 2 and "SHA-256" in res.output and "Traceback" not in res.output
