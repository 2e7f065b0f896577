"""Survival model export (sdk/model/export.py): the safetensors weights and their signed
description give the hazard per interval, S(b_k) and the risk at each horizon exactly as the task
does in the SDK, loaded without the federation; wrong inputs are refused with
SchemaError/ConfigError/IntegrityError."""

import functools
import json

import numpy as np
import pytest
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.nsfl_task import NSFLTask
from clinograph.sdk.federation.split import hospital_split
from clinograph.sdk.ingest import ingest
from clinograph.sdk.ingest.survival import days_per
from clinograph.sdk.model.description import SURVIVAL_FORMAT
from clinograph.sdk.model.load import load_exported, predict_exported, predict_survival_exported
from clinograph.sdk.training.survival import risk_at

from clinograph.core.errors import ConfigError, IntegrityError, SchemaError
from clinograph.core.identity import Identity

pytest.importorskip("lifelines")

ME = Identity.generate("north")
TARGET = {"kind": "survival", "time_unit": "mo", "breaks": [3, 6, 12, 24, 36], "horizon": 18}


@functools.cache
def trained():
    from clinograph.sdk.datasets.real_tables import cohort_tables

    c = cohort_tables("lung", form="survival")
    t = ingest(*c.hospitals[0][:1], schema=c.hospitals[0][1], dictionary=c.dictionary)
    conf = SimulationConfig.model_validate({
        "federation": {"rounds": 1, "min_clients": 2}, "model": {"hidden": 8}, "graph": {"k_similar": 0},
        "training": {"lr": 0.02, "batch_size": 32}, "target": TARGET,
        "personal": {"modules": ["head/hazard_baseline"]}}).hospital_config()
    split = hospital_split(t.labels, site=t.site, test_fraction=0.3, validation_fraction=0.2, seed=0)
    task = NSFLTask(t, dictionary=c.dictionary, config=conf, split=split)
    task.trainer.train(task.model, round_=0, epochs=2, plan_options={})
    task.finish()
    return task, t.subset(split.test)


def test_survival_export_matches_the_sdk_prediction(tmp_path):
    task, new = trained()
    path, sidecar = task.export(tmp_path / "surv.safetensors", signer=ME)
    info = json.loads(json.loads(sidecar.read_text())["description"])
    assert info["format"] == SURVIVAL_FORMAT and info["dictionary_hash"] == new.dictionary.digest()
    assert info["features"] == new.dictionary.node_ids() and info["survival"]["breaks"] == [3, 6, 12, 24, 36]
    assert info["survival"]["horizons"] == [3, 6, 12, 18, 24, 36] and info["survival"]["time_unit"] == "mo"
    assert info["survival"]["risk_columns"][3] == "risk_18mo"
    loaded = load_exported(path, trusted=ME.public, insecure_untrusted_model=True)
    hazard, surv, risk = predict_survival_exported(loaded, new)
    curves = task.predict_survival_table(new)
    assert hazard.shape == (new.n_patients, 5) and risk.shape == (new.n_patients, 6)
    np.testing.assert_allclose(surv, curves, rtol=0, atol=1e-9)
    np.testing.assert_allclose(np.cumprod(1 - hazard, axis=1), curves, rtol=0, atol=1e-9)
    np.testing.assert_allclose(risk[:, 3], task.predict_table(new), rtol=0, atol=1e-9)  # the configured horizon
    logits = task._hazard_logits_table(new)
    for j, h in enumerate(info["survival"]["horizons"]):  # risk_at in days and the export in months agree
        np.testing.assert_allclose(risk[:, j], risk_at(logits, task.survival_target[0], h * days_per("mo")), atol=1e-9)
    with pytest.raises(SchemaError, match="survival model"):
        predict_exported(loaded, new)


def test_survival_export_refuses_bad_horizons_and_a_broken_sidecar(tmp_path):
    task, _ = trained()
    with pytest.raises(ConfigError, match=r"lie in \(0, 36\]"):
        task.export(tmp_path / "m.safetensors", signer=ME, horizons=[48])
    with pytest.raises(ConfigError, match="strictly increasing"):
        task.export(tmp_path / "m.safetensors", signer=ME, horizons=[12, 6])
    path, sidecar = task.export(tmp_path / "m.safetensors", signer=ME, horizons=[12])
    sidecar.write_text("{not json")
    with pytest.raises(IntegrityError, match="is not a signed model description"):
        load_exported(path, trusted=ME.public, insecure_untrusted_model=True)
