"""Use a trained model: NSFLTask.predict_table, export (safetensors + signed description), and
`clinograph predict` on new patients (no label column), with the signature and the dictionary
checked. The refusals of tampered or code-carrying models: test_cli_predict_trust.py."""

import json

import numpy as np
import pandas as pd
import pytest
import tomli_w
from clinograph.sdk.config import HospitalConfig
from clinograph.sdk.datasets.alarm import DICTIONARY_PATH
from clinograph.sdk.federation.build import build_task
from clinograph.sdk.ingest import ingest
from clinograph.sdk.model.load import load_exported, predict_exported
from sdk_helpers import raw_tables, small_tables
from typer.testing import CliRunner

from clinograph.cli import app
from clinograph.core.errors import SchemaError
from clinograph.core.identity import Identity

runner = CliRunner()
HOSPITAL = Identity.generate("north")  # the exporting hospital's signing identity
KEY = HOSPITAL.public.b64()


@pytest.fixture(scope="module")
def trained():
    t = small_tables()[0]
    cfg = HospitalConfig.model_validate({"model": {"hidden": 8}, "graph": {"k_similar": 0},
                                         "personal": {"modules": ["head/task"]}})
    task = build_task(t, dictionary=t.dictionary, config=cfg)
    task.train(round_=0, epochs=2, plan_options={})
    task.finish()
    return task


def test_predict_table_gives_the_task_risks_for_the_same_patients(trained):
    got = trained.predict_table(trained.table)
    assert got.shape == (trained.table.n_patients,)
    np.testing.assert_allclose(got, trained.predict(), atol=1e-5)  # k_similar = 0: star path = training path


def test_export_loads_without_the_federation_and_matches(tmp_path, trained):
    path, sidecar = trained.export(tmp_path / "model.safetensors", signer=HOSPITAL)
    info = json.loads(json.loads(sidecar.read_text())["description"])
    assert info["dictionary_hash"] == trained.table.dictionary.digest()
    assert info["features"] == trained.table.dictionary.node_ids() and info["site"] == trained.table.site
    loaded = load_exported(path, trusted=HOSPITAL.public, insecure_untrusted_model=True)
    assert loaded.description.model == trained.config.model
    # the round trip gives the in-memory model's risks exactly (same weights, same float32 graph)
    np.testing.assert_array_equal(predict_exported(loaded, trained.table), trained.predict_table(trained.table))


def _predict(tmp_path, model_path, table, schema, dictionary=DICTIONARY_PATH, key=KEY, extra=()):
    """Write ``table`` and ``schema`` under ``tmp_path`` and run `clinograph predict` on them."""
    table.to_csv(tmp_path / "new.csv", index=False)
    (tmp_path / "schema.toml").write_text(tomli_w.dumps(schema.model_dump(mode="json", exclude_none=True)))
    return runner.invoke(app, ["predict", "--insecure-untrusted-model", "--model", str(model_path), "--table", str(tmp_path / "new.csv"),
                               "--schema", str(tmp_path / "schema.toml"), "--dictionary", str(dictionary),
                               "--out", str(tmp_path / "risks.csv"), *(["--trusted-key", key] if key else []),
                               *extra])


def test_cli_predict_writes_risks_for_unlabelled_new_patients(tmp_path, trained):
    path, _ = trained.export(tmp_path / "model.safetensors", signer=HOSPITAL)
    df, schema = raw_tables()[0]
    res = _predict(tmp_path, path, df.drop(columns=[schema.label]).head(25), schema)
    assert res.exit_code == 0, res.output
    out = pd.read_csv(tmp_path / "risks.csv")
    assert list(out.columns) == ["patient_id", "risk"] and len(out) == 25
    expected = trained.predict_table(ingest(df.head(25), schema=schema, dictionary=trained.table.dictionary))
    np.testing.assert_allclose(out["risk"].to_numpy(), expected, atol=1e-5)


def test_cli_predict_refuses_another_dictionary(tmp_path, trained):
    path, _ = trained.export(tmp_path / "model.safetensors", signer=HOSPITAL)
    other = tmp_path / "dictionary.toml"
    other.write_text(DICTIONARY_PATH.read_text().replace('version = 1', 'version = 2', 1))
    df, schema = raw_tables()[0]
    res = _predict(tmp_path, path, df, schema, dictionary=other)
    assert res.exit_code == 2 and "Dictionary mismatch" in res.output and "Traceback" not in res.output


def test_predict_table_refuses_a_table_on_another_dictionary(trained):
    other = small_tables()[0]
    from clinograph.sdk.datasets.real_tables import lung_dictionary

    with pytest.raises(SchemaError, match="Dictionary mismatch"):
        trained.predict_table(type(other)(**{**other.__dict__, "dictionary": lung_dictionary()}))


def test_cli_predict_escapes_ids_a_spreadsheet_would_run_as_formulas(tmp_path, trained):
    path, _ = trained.export(tmp_path / "model.safetensors", signer=HOSPITAL)
    df, schema = raw_tables()[0]
    new = df.drop(columns=[schema.label]).head(4).copy()
    new[schema.patient_id] = ["=cmd|' /C calc'!A0", "-12", "@SUM(A1)", "p4"]
    res = _predict(tmp_path, path, new, schema)
    assert res.exit_code == 0, res.output
    assert "2 patient id(s) starting with" in res.output
    ids = pd.read_csv(tmp_path / "risks.csv", dtype=str)["patient_id"].tolist()
    assert ids == ["'=cmd|' /C calc'!A0", "-12", "'@SUM(A1)", "p4"]


def test_cli_predict_refuses_to_overwrite_its_input_table(tmp_path, trained):
    # before: --out equal to --table overwrote the hospital's table with the risks
    path, _ = trained.export(tmp_path / "model.safetensors", signer=HOSPITAL)
    df, schema = raw_tables()[0]
    df.head(5).to_csv(tmp_path / "new.csv", index=False)
    before = (tmp_path / "new.csv").read_bytes()
    (tmp_path / "schema.toml").write_text(tomli_w.dumps(schema.model_dump(mode="json", exclude_none=True)))
    res = runner.invoke(app, ["predict", "--insecure-untrusted-model", "--model", str(path), "--table", str(tmp_path / "new.csv"),
                              "--schema", str(tmp_path / "schema.toml"), "--dictionary", str(DICTIONARY_PATH),
                              "--out", str(tmp_path / "." / "new.csv"), "--trusted-key", HOSPITAL.public.b64()])
    assert res.exit_code == 2 and "is the table file: writing the risks would overwrite it" in res.output
    assert (tmp_path / "new.csv").read_bytes() == before


def test_cli_predict_names_schema_columns_the_new_table_lacks(tmp_path, trained):
    path, _ = trained.export(tmp_path / "model.safetensors", signer=HOSPITAL)
    df, schema = raw_tables()[0]
    res = _predict(tmp_path, path, df.drop(columns=[schema.label, "HR"]).head(5), schema)
    assert res.exit_code == 0, res.output
    assert "the site schema maps 1 column(s) the table does not have: 'HR'; their features are missing" in res.output
