"""FedNSL as the registered task ``fednsl``: built from a table and a config like every task, so
``simulate()`` and the SuperNode factory build the same hospital (the loopback Flower equivalence
is tests/integration/test_tasks_over_flower.py); the rule space pinned by the server is checked by
every hospital; what FedNSL cannot take is refused with its reason."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tomli_w
from typer.testing import CliRunner

from clinograph.core.errors import ConfigError, ProtocolError

pytest.importorskip("lifelines")

SETTINGS = {"task": "fednsl", "fednsl": {"max_len": 1, "steps": 5, "draws": 8}, "graph": {"k_similar": 0}}


@pytest.fixture(scope="module")
def cohort():
    from clinograph.sdk.datasets.real_tables import cohort_tables

    return cohort_tables("lung", form="binary")


def _tables(cohort):
    from clinograph.sdk.ingest import ingest

    return [ingest(df, schema=s, dictionary=cohort.dictionary) for df, s in cohort.hospitals]


def _config(**over):
    from clinograph.sdk.config import HospitalConfig, merge_sections

    return HospitalConfig.model_validate(merge_sections(SETTINGS, over))


def _task(cohort, config):
    from clinograph.sdk.federation.build import build_task

    return build_task(_tables(cohort)[0], dictionary=cohort.dictionary, config=config)


def test_a_hospital_refuses_a_plan_pinning_another_rule_space(cohort):
    from clinograph.sdk.fednsl.registration import rule_space_for

    config = _config()
    task = _task(cohort, config)
    own = rule_space_for(config, dictionary=cohort.dictionary).sha256()
    assert task.rule_space_sha256 == own
    with pytest.raises(ProtocolError, match="pins rule space 000000000000"):
        task.train(round_=0, epochs=1, plan_options={"strategy.rule_space_sha256": "0" * 64})
    with pytest.raises(ProtocolError, match="not fednsl_rules"):
        task.train(round_=0, epochs=1, plan_options={})
    out = task.train(round_=0, epochs=1, plan_options={"strategy.rule_space_sha256": own, "strategy.seed": 0})
    assert np.isfinite(out.loss)


def test_the_space_depends_on_the_settings(cohort):
    from clinograph.sdk.fednsl.registration import rule_space_for

    one = rule_space_for(_config(), dictionary=cohort.dictionary)
    two = rule_space_for(_config(fednsl={"max_len": 2}), dictionary=cohort.dictionary)
    assert one.sha256() != two.sha256() and two.n_bodies > one.n_bodies


def test_model_init_modules_equal_the_hospitals_own(cohort):
    """What `clinograph model init` writes (no table) is what every hospital's task holds."""
    from clinograph.sdk.tasks import create_task

    from clinograph.core.spec import ModuleKind

    config = _config()
    written = create_task("fednsl").modules(config, dictionary=cohort.dictionary)
    held = _task(cohort, config).modules
    assert written.spec().digest() == held.spec().digest()
    for name, value in written.state(ModuleKind.SHARED).items():
        assert np.array_equal(value, held.state(ModuleKind.SHARED)[name])


def test_what_fednsl_cannot_take_is_refused_at_once(cohort):
    config = _config(privacy={"enabled": True, "state_dir": "/tmp/x"}, selection={"enabled": True})
    with pytest.raises(ConfigError) as err:
        _task(cohort, config)
    assert "[privacy]" in str(err.value) and "[selection] enabled = true" in str(err.value)


def test_no_model_selection_and_no_default_candidates(cohort):
    from clinograph.sdk.federation.candidates import candidate_configs

    config = _config()
    assert config.selection_active() is False and candidate_configs(config) == []
    with pytest.raises(ConfigError, match="needs model selection"):
        candidate_configs(_config(selection={"candidates": [{"name": "a"}]}))


def test_simulate_names_the_strategy_the_task_needs(cohort, tmp_path):
    from clinograph.sdk.config import SimulationConfig, merge_sections
    from clinograph.sdk.federation.simulate import simulate

    config = SimulationConfig.model_validate(merge_sections(SETTINGS, {
        "output": str(tmp_path / "out"), "federation": {"rounds": 1, "min_clients": 2, "strategy": "fedavg"}}))
    with pytest.raises(ConfigError, match="strategy = 'fednsl_rules'"):
        simulate(_tables(cohort), cohort.dictionary, config, audit_dir=tmp_path / "audit")


def test_simulate_pins_the_rule_space_and_audits_the_rules(cohort, tmp_path):
    import json

    from clinograph.sdk.config import SimulationConfig, merge_sections
    from clinograph.sdk.federation.simulate import simulate
    from clinograph.sdk.fednsl.registration import rule_space_for

    config = SimulationConfig.model_validate(merge_sections(SETTINGS, {
        "output": str(tmp_path / "out"), "federation": {"rounds": 2, "min_clients": 2, "strategy": "fednsl_rules"}}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        simulate(_tables(cohort), cohort.dictionary, config, audit_dir=tmp_path / "audit")
    entries = [json.loads(line) for line in (tmp_path / "audit" / "audit.jsonl").read_text().splitlines()]
    rules = [e["payload"] for e in entries if e["kind"] == "rules"]
    sha = rule_space_for(config.hospital_config(), dictionary=cohort.dictionary).sha256()
    assert len(rules) == 2 and {r["rule_space_sha256"] for r in rules} == {sha}
    assert (tmp_path / "out" / "rule_space.json").exists()


def test_ckks_is_refused_for_a_strategy_that_reads_the_sum():
    from clinograph.secure.runtime.build import InitialModel, build_server
    from clinograph.secure.runtime.config import FederationSection

    from clinograph.core.identity import Identity

    fed = FederationSection(id="f", secure_mode="ckks", strategy="dag_voting",
                            strategy_options={"concepts": "a,b", "task": "b", "seed": 0})
    server = Identity.generate("server")
    with pytest.raises(ConfigError, match="never sees the sum"):
        build_server(federation=fed, identity=server, enrolled={}, initial=InitialModel.model_construct(),
                     audit=None, dp_policy=None)  # type: ignore[arg-type]


def test_model_init_writes_the_rule_space_and_prints_the_pin(cohort, tmp_path):
    from clinograph.sdk.fednsl.registration import rule_space_for

    from clinograph.cli import app

    (tmp_path / "dictionary.toml").write_text(tomli_w.dumps(cohort.dictionary.model_dump(mode="json",
                                                                                         exclude_none=True)))
    (tmp_path / "hospital.toml").write_text(tomli_w.dumps({**SETTINGS, "dictionary": "dictionary.toml"}))
    out = tmp_path / "server" / "initial_model.json"
    r = CliRunner().invoke(app, ["model", "init", "--config", str(tmp_path / "hospital.toml"), "--out", str(out)])
    assert r.exit_code == 0, r.output
    sha = rule_space_for(_config(), dictionary=cohort.dictionary).sha256()
    assert (tmp_path / "server" / "rule_space.json").exists()
    import tomllib

    printed = tomllib.loads(r.output[r.output.index("[federation]"):])["federation"]  # paste-able as printed
    assert printed["strategy"] == "fednsl_rules" and printed["strategy_options"]["rule_space_sha256"] == sha
    assert printed["strategy_options"]["rule_space"] == str((tmp_path / "server" / "rule_space.json").resolve())
