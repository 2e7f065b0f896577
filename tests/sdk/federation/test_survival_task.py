"""A time-to-event target through the one runtime: the NS-FL task with the discrete-time hazard
head ([target] kind = "survival"), federated (masked) like the binary head, selected on the
federated validation (hazard) loss, scoring C-index and horizon AUROC; predict_table gives the
risk at the horizon, predict_survival_table the curves; clear errors for what is not supported."""


import numpy as np
import pytest
from clinograph.sdk.config import HospitalConfig, SimulationConfig
from clinograph.sdk.federation.nsfl_task import NSFLTask
from clinograph.sdk.federation.simulate import simulate
from clinograph.sdk.federation.split import hospital_split
from clinograph.sdk.ingest import ingest
from sdk_helpers import SURVIVAL_TARGET, lung_survival

from clinograph.core.errors import ConfigError, SchemaError

pytest.importorskip("lifelines")

TARGET = SURVIVAL_TARGET
lung = lung_survival


def cfg(rounds=3, **over):
    return SimulationConfig.model_validate({
        "federation": {"rounds": rounds, "secure_mode": "masked", "min_clients": 2, "local_epochs": 1},
        "model": {"hidden": 8}, "graph": {"k_similar": 0}, "training": {"lr": 0.02, "batch_size": 32},
        "target": TARGET, **over})


def test_survival_federation_selects_on_validation_and_scores_concordance(tmp_path):
    d, tables = lung()
    res = simulate(tables, d, cfg(), audit_dir=tmp_path / "a")
    sel = res.selection
    assert sel["rounds_evaluated"] == [0, 1, 2, 3]
    assert sel["validation_loss"] == min(sel["validation_losses"]) <= sel["validation_losses"][1]
    assert sel["validation_losses"][0] > sel["validation_loss"]  # the hazard likelihood is learned
    for m in res.final.values():
        assert 0 <= m["cindex"] <= 1 and 0 <= m["auroc"] <= 1 and m["known"] <= m["n"]
    assert np.mean([m["cindex"] for m in res.final.values()]) > 0.5


def test_task_predicts_curves_and_risk_for_new_patients():
    d, tables = lung()
    t = tables[0]
    conf = cfg().hospital_config()
    split = hospital_split(t.labels, site=t.site, test_fraction=0.3, validation_fraction=0.2, seed=0)
    task = NSFLTask(t, dictionary=d, config=conf, split=split)
    assert "head/hazard_baseline" in task.modules.names()
    task.trainer.train(task.model, round_=0, epochs=2, plan_options={})
    task.finish()
    new = t.subset(split.test)
    curves = task.predict_survival_table(new)
    assert curves.shape == (new.n_patients, 5) and np.all(np.diff(curves, axis=1) <= 0)
    risk = task.predict_table(new)
    np.testing.assert_allclose(risk, 1 - curves[:, 2], atol=1e-6)  # horizon 12 months = third break


def test_initial_model_is_what_every_hospital_builds():
    from clinograph.sdk.federation.build import initial_model, initial_model_for

    d, tables = lung()
    conf = cfg().hospital_config()
    t = tables[1]
    split = hospital_split(t.labels, site=t.site, test_fraction=0.3, validation_fraction=0.2, seed=0)
    task = NSFLTask(t, dictionary=d, config=conf, split=split)
    a, b = initial_model_for(conf, dictionary=d), initial_model(task, dictionary=d)
    assert a.spec == b.spec and a.modules == b.modules and "head/hazard_baseline" in a.spec.names()


def test_unsupported_combinations_are_refused():
    d, tables = lung()
    t = tables[0]
    split = hospital_split(t.labels, site=t.site, test_fraction=0.3, validation_fraction=0.2, seed=0)
    HospitalConfig(target=TARGET, privacy={"enabled": True, "mode": "distributed"})  # runs: test_dp_matrix.py
    with pytest.raises(ValueError, match="only 'nsfl' has a survival head"):
        HospitalConfig(target=TARGET, task="agat")
    df, schema = _binary()
    binary_table = ingest(df, schema=schema, dictionary=d)
    with pytest.raises(ConfigError, match="has no time-to-event label"):
        NSFLTask(binary_table, dictionary=d, config=HospitalConfig(target=TARGET, graph={"k_similar": 0}), split=split)
    with pytest.raises(ValueError, match="needs breaks"):
        HospitalConfig(target={"kind": "survival"})
    with pytest.raises(ValueError, match="past the last break"):
        HospitalConfig(target={**TARGET, "horizon": 48})


def _binary():
    from clinograph.sdk.datasets.real_tables import cohort_tables

    df, s = cohort_tables("lung").hospitals[0]
    return df, s


def test_survival_schemas_under_a_binary_target_are_refused_naming_the_fix(tmp_path):
    from clinograph.sdk.federation.simulate import load_tables

    (tmp_path / "d.toml").write_text('name = "d"\nversion = 1\n[[features]]\nid = "age"\nname = "Age"\n'
                                     'kind = "numeric"\nunit = "a"\nreference_low = 18\nreference_high = 90\n')
    hospitals = []
    for site in ("a", "b"):
        (tmp_path / f"{site}.csv").write_text("pid,age,days,dead\np1,60,300,1\np2,70,20,0\n")
        (tmp_path / f"{site}.toml").write_text(f'site = "{site}"\npatient_id = "pid"\n[columns]\nage = '
                                               '{ feature = "age", unit = "a" }\n[survival]\ntime = "days"\nevent = "dead"\n')
        hospitals.append({"site": site, "table": tmp_path / f"{site}.csv", "schema": tmp_path / f"{site}.toml"})
    binary = SimulationConfig.model_validate({"dictionary": tmp_path / "d.toml", "hospitals": hospitals})
    with pytest.raises(SchemaError, match=r"'a', 'b' declare \[survival\].*\[target\] kind is 'binary'.*kind = \"survival\""):
        load_tables(binary)
    tables, _ = load_tables(cfg(dictionary=tmp_path / "d.toml", hospitals=hospitals))
    assert [t.survival.event.tolist() for t in tables] == [[1, 0], [1, 0]]
