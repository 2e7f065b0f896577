"""Choosing the model per federation (sdk/federation/candidates.py): the lower federated
validation loss wins, ties go to the simpler candidate, the audit trail records the choice and
verifies, a bad candidate list is a ConfigError naming the entry and the fix."""

import json
import math

import pytest
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.candidates import candidate_configs, choose
from clinograph.sdk.federation.simulate import simulate
from clinograph.secure.audit import verify_audit_dir
from sdk_helpers import small_tables

from clinograph.core.errors import ConfigError


def cfg(candidates, rounds=3, elimination="none", **extra):
    """``elimination = "none"``: every candidate trains the whole run (test_candidate_elimination.py: the default)."""
    return SimulationConfig.model_validate({
        "federation": {"rounds": rounds, "secure_mode": "masked", "min_clients": 2, "local_epochs": 1},
        "model": {"hidden": 8}, "graph": {"k_similar": 0}, "training": {"lr": 0.03, "batch_size": 32},
        "selection": {"patience": 5, "candidates": candidates, "elimination": elimination}, **extra})


def test_choice_follows_the_lower_validation_loss_and_is_audited(tmp_path):
    tables = small_tables()
    # the first (simpler) candidate barely moves from the initial model: clearly worse
    res = simulate(tables, tables[0].dictionary, cfg([{"name": "frozen", "training": {"lr": 1e-7}},
                                                               {"name": "learns"}]),
                            audit_dir=tmp_path / "audit")
    rows = {r["name"]: r for r in res.choice["candidates"]}
    assert rows["learns"]["validation_loss"] < rows["frozen"]["validation_loss"] - 1e-3
    assert res.choice["chosen"] == "learns"
    assert res.selection["validation_loss"] == pytest.approx(rows["learns"]["validation_loss"])
    verdict = verify_audit_dir(tmp_path / "audit")
    assert verdict.ok, verdict.problems
    entries = [json.loads(x) for x in (tmp_path / "audit" / "audit.jsonl").read_text().splitlines()]
    chosen = [e["payload"] for e in entries if e["kind"] == "model_chosen"]
    assert len(chosen) == 1 and chosen[0]["chosen"] == "learns"
    assert [c["name"] for c in chosen[0]["candidates"]] == ["frozen", "learns"]
    assert json.loads(chosen[0]["candidates"][0]["overrides"]) == {"training": {"lr": 1e-7}}
    assert sum(e["kind"] == "model_selected" for e in entries) == 2  # one run per candidate
    kinds = [e["kind"] for e in entries]
    assert kinds.index("model_chosen") > max(i for i, k in enumerate(kinds) if k == "model_selected")


def test_ties_go_to_the_simpler_candidate_and_a_missing_loss_never_wins():
    assert choose([0.60, 0.59995, 0.7], min_delta=1e-4) == 0
    assert choose([0.60, 0.59, 0.58], min_delta=1e-4) == 2
    assert choose([None, 0.7, math.nan], min_delta=0.0) == 1
    with pytest.raises(ConfigError, match="No candidate produced"):
        choose([None, math.nan], min_delta=0.0)


def test_default_candidates_for_binary_nsfl_and_none_under_dp():
    names = [c.name for c in candidate_configs(cfg(None))]
    assert names == ["wide", "wide_shape", "linear", "shape"]
    cands = {c.name: c.config for c in candidate_configs(cfg(None))}
    assert cands["shape"].model.linear_shape and cands["shape"].split == cfg(None).split  # identical splits
    assert not cands["wide"].model.deep and not cands["wide_shape"].model.deep and cands["linear"].model.deep
    assert cands["wide"].training.wide_lr_factor == 5.0 and cands["linear"].training.wide_lr_factor == 1.0
    # a config that chooses the model itself runs that one model
    assert candidate_configs(cfg(None, training={"lr": 0.03, "batch_size": 32, "wide_lr_factor": 2.0})) == []
    assert candidate_configs(cfg(None, model={"hidden": 8, "deep": False})) == []
    assert candidate_configs(cfg([])) == []
    dp = cfg(None, privacy={"enabled": True, "noise_multiplier": 1.0})
    assert candidate_configs(dp) == []
    with pytest.raises(ConfigError, match="needs model selection"):
        candidate_configs(cfg([{"name": "a"}, {"name": "b"}], privacy={"enabled": True, "noise_multiplier": 1.0}))


@pytest.mark.parametrize(("entry", "match"), [
    ({"model": {"linear_shape": True}}, r"entry 1 has no valid `name`"),
    ({"name": "x", "model": {"linear_shap": True}}, r"entry 1 \('x'\) does not give a valid config \(model.linear_shap"),
    ({"name": "x", "split": {"seed": 3}}, r"entry 1 \('x'\) overrides 'split', which a candidate may not"),
    ({"name": "x", "model": 3}, r"overrides 'model'"),
])
def test_a_bad_candidate_names_the_entry_and_the_fix(entry, match):
    with pytest.raises(ConfigError, match=match) as err:
        candidate_configs(cfg([entry]))
    assert "[[selection.candidates]]" in str(err.value)  # the fix


def test_a_repeated_name_and_a_bad_toml_candidate(tmp_path):
    with pytest.raises(ConfigError, match=r"entry 2 \('a'\): the name is used twice"):
        candidate_configs(cfg([{"name": "a"}, {"name": "a"}]))
    p = tmp_path / "c.toml"
    p.write_text('[[selection.candidates]]\nname = "shape"\nmodel = { linear_shape = true }\n'
                 '[[selection.candidates]]\nname = "bad"\nmodel = { hidden = -1 }\n')
    with pytest.raises(ConfigError, match=r"entry 2 \('bad'\) does not give a valid config \(model.hidden"):
        candidate_configs(SimulationConfig.from_toml(p))


def test_simulate_runs_the_default_candidates_like_the_cli(tmp_path):
    """One runtime: the SDK's ``simulate()`` and ``clinograph simulate`` run the same federation
    for the same config -- the default candidates for binary NS-FL, each run closed by its own
    run_ended, then the choice -- and ``simulate_one`` runs exactly one model."""
    from clinograph.sdk.federation.simulate import simulate, simulate_one

    tables = small_tables()
    res = simulate(tables, tables[0].dictionary, cfg(None, rounds=2), audit_dir=tmp_path / "a")
    names = ["wide", "wide_shape", "linear", "shape"]
    assert res.choice["chosen"] in names
    assert [c["name"] for c in res.choice["candidates"]] == names
    kinds = [json.loads(x)["kind"] for x in (tmp_path / "a" / "audit.jsonl").read_text().splitlines()]
    assert kinds.count("run_ended") == 4 and kinds[-1] == "model_chosen"
    assert kinds.index("model_chosen") > max(i for i, k in enumerate(kinds) if k == "run_ended")
    assert verify_audit_dir(tmp_path / "a").ok
    one = simulate_one(tables, tables[0].dictionary, cfg(None, rounds=2), audit_dir=tmp_path / "b")
    assert one.choice == {}
    # simulate_one ignores the candidates: the config's own model, the same as the "linear" candidate
    assert one.final == res.metrics_by_candidate["linear"]
    # the public field: every candidate, every hospital, the test metrics of its own run
    assert list(res.metrics_by_candidate) == names
    assert all(set(m) == {t.site for t in tables} for m in res.metrics_by_candidate.values())
    assert res.metrics_by_candidate[res.choice["chosen"]] == res.final
    assert one.metrics_by_candidate == {}


def test_restarts_expand_each_candidate_with_new_seeds_and_the_first_wins_ties():
    base = cfg([{"name": "a"}, {"name": "b", "model": {"linear_shape": True}}])
    c = base.model_copy(update={"selection": base.selection.model_copy(update={"restarts": 3})})
    cands = candidate_configs(c)
    assert [x.name for x in cands] == ["a", "a-init1", "a-init2", "b", "b-init1", "b-init2"]
    by = {x.name: x for x in cands}
    seed0, tseed0 = base.model.init_seed, base.training.seed
    assert by["a"].config.model.init_seed == seed0 and by["a-init2"].config.model.init_seed == seed0 + 2000
    assert by["b-init1"].config.training.seed == tseed0 + 1000 and by["b-init1"].config.model.linear_shape
    assert by["b-init1"].overrides == {"model": {"linear_shape": True, "init_seed": seed0 + 1000},
                                       "training": {"seed": tseed0 + 1000}}
    assert all(x.config.split == base.split for x in cands)  # identical splits: the losses are comparable
    # no candidates: the one model, restarted
    one = cfg([], selection={"patience": 5, "candidates": [], "restarts": 2})
    assert [x.name for x in candidate_configs(one)] == ["model", "model-init1"]


def test_restarts_are_refused_where_they_cannot_be_compared_or_are_too_many():
    with pytest.raises(ConfigError, match="restarts = 2 needs model selection"):
        candidate_configs(cfg(None, privacy={"enabled": True, "noise_multiplier": 1.0},
                              selection={"restarts": 2}))
    with pytest.raises(ConfigError, match="at most 16"):
        candidate_configs(cfg([{"name": f"c{i}"} for i in range(6)], selection={
            "candidates": [{"name": f"c{i}"} for i in range(6)], "restarts": 3}))
    with pytest.raises(Exception, match="restarts"):
        cfg(None, selection={"restarts": 0})
    clash = [{"name": "a"}, {"name": "a-init1"}]
    with pytest.raises(ConfigError, match="'a-init1' twice"):
        candidate_configs(cfg(clash, selection={"candidates": clash, "restarts": 2}))


def test_restarts_run_and_the_lowest_validation_loss_is_kept_and_audited(tmp_path):
    tables = small_tables()
    c = cfg([], rounds=2, selection={"patience": 5, "candidates": [], "restarts": 2})
    res = simulate(tables, tables[0].dictionary, c, audit_dir=tmp_path / "audit")
    rows = res.choice["candidates"]
    assert [r["name"] for r in rows] == ["model", "model-init1"]
    assert rows[0]["validation_loss"] != rows[1]["validation_loss"]  # another initialisation, another run
    best = min(rows, key=lambda r: r["validation_loss"])
    assert res.choice["chosen"] == best["name"]
    assert res.selection["validation_loss"] == pytest.approx(best["validation_loss"])
    assert verify_audit_dir(tmp_path / "audit").ok
