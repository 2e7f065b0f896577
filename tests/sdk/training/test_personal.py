"""Personal layers (PFGL-Net Alg. 2's K_personal): never uploaded, fine-tuned locally, nothing else moves."""

import numpy as np
import pytest
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.simulate import build_simulation
from clinograph.sdk.graph.star import star_batch
from clinograph.sdk.model.nsfl import NSFLConfig, NSFLModel
from clinograph.sdk.training.local import TrainConfig
from clinograph.sdk.training.personal import fine_tune_personal, personal_module_map
from clinograph.secure.messages import ClientUpdate
from clinograph.secure.wire import load_payload, parse_envelope
from sdk_helpers import small_tables

from clinograph.core.errors import ConfigError
from clinograph.core.spec import ModuleKind


def _model(table, personal=("head/task",)):
    ids = table.dictionary.node_ids()
    model = NSFLModel(len(ids), NSFLConfig(hidden=8))
    return model, personal_module_map(model, ids, personal=personal)


def test_declared_set_plus_masks_is_personal_and_unknown_names_are_refused():
    table = small_tables()[0]
    _, mm = _model(table)
    personal = mm.names(ModuleKind.PERSONAL)
    assert "head/task" in personal and all(n == "head/task" or n.startswith("mask/") for n in personal)
    _, mm = _model(table, personal=())
    assert mm.kind("head/task") == ModuleKind.SHARED and mm.kind("mask/heart_rate") == ModuleKind.PERSONAL
    _, mm = _model(table, personal=("gnn/layer2/",))
    assert mm.kind("gnn/layer2/of_patient") == ModuleKind.PERSONAL and mm.kind("gnn/layer1/of_patient") == ModuleKind.SHARED
    with pytest.raises(ConfigError, match=r"Personal modules \['head/taks'\] are not in the model"):
        _model(table, personal=("head/taks",))


@pytest.mark.parametrize("personal", [("head/task",), ("head/task", "feature_embedding/heart_rate")])
def test_fine_tuning_changes_only_personal_modules(personal):
    table = small_tables()[0]
    model, mm = _model(table, personal=personal)
    stars = star_batch(table)
    shared0, personal0 = mm.state(ModuleKind.SHARED), mm.state(ModuleKind.PERSONAL)
    requires = [p.requires_grad for p in model.parameters()]
    fine_tune_personal(model, mm, stars=stars, train_idx=np.arange(table.n_patients), epochs=2,
                       config=TrainConfig(lr=0.05, batch_size=32))
    for n, v in mm.state(ModuleKind.SHARED).items():
        assert np.array_equal(v, shared0[n]), n  # bit-for-bit
    after = mm.state(ModuleKind.PERSONAL)
    assert not np.array_equal(after["head/task"], personal0["head/task"])
    if "feature_embedding/heart_rate" in personal:  # a row of a shared parameter
        assert not np.array_equal(after["feature_embedding/heart_rate"], personal0["feature_embedding/heart_rate"])
    assert [p.requires_grad for p in model.parameters()] == requires  # restored


def _cfg(strategy, rounds=2, **extra):
    return SimulationConfig.model_validate({
        "federation": {"rounds": rounds, "secure_mode": "masked", "strategy": strategy, "min_clients": 2,
                       "local_epochs": 1, **extra.pop("federation", {})},
        "model": {"hidden": 8}, "graph": {"k_similar": 0}, "training": {"lr": 0.01, "batch_size": 32}, **extra})


PFGL = {"personal": {"modules": ["head/task"], "fine_tune_epochs": 1}, "release": {"metrics": "quality"},
        "split": {"validation_fraction": 0.2}}


def test_pfgl_round_personal_modules_never_leave_and_dq_weights_lag_one_round(tmp_path):
    tables = small_tables()
    fed = build_simulation(tables, tables[0].dictionary, _cfg("dq_weighted", **PFGL), audit_dir=tmp_path / "a")
    clients = fed.hospitals
    parts = tuple(sorted(clients))
    fed.run_round()
    plan0 = clients["north"].plan
    assert {k: v for k, v in plan0.options.items() if k.startswith("weight/")} == pytest.approx(
        {f"weight/{c}": 1 / 3 for c in parts})  # round 0: no metrics yet -> uniform
    assert plan0.options["masked.max_weight"] == 1.0  # normalised weights: tight fixed-point bound
    import json

    entries = [json.loads(x) for x in (tmp_path / "a" / "audit.jsonl").read_text().splitlines()]
    released0 = next(e["payload"]["per_client"] for e in entries if e["kind"] == "metrics")
    assert set(released0) == set(parts) and all(set(v) == {"perf", "missing_rate"} for v in released0.values())
    # after round 0 every hospital fine-tuned its head on the new global model: shared = global, head its own
    heads = {n: c.task.modules.get("head/task") for n, c in clients.items()}
    assert not np.array_equal(heads["north"], heads["south"])
    for c in clients.values():
        for n, v in fed.server.state.items():
            assert np.allclose(c.task.modules.get(n), v)
    fed.run_round()
    fed.audit.close()
    # round-1 weights are exactly DQ from the metrics released in round 0 (eq. 3, first value, normalised)
    raw = {c: max(m["perf"] * (1 - m["missing_rate"]), 1e-3) for c, m in released0.items()}
    expected = {f"weight/{c}": raw[c] / sum(raw.values()) for c in parts}
    plan1 = clients["north"].plan
    assert {k: v for k, v in plan1.options.items() if k.startswith("weight/")} == pytest.approx(expected)
    assert fed.server.strategy.weights_used[1] == pytest.approx({c: expected[f"weight/{c}"] for c in parts})
    for c in clients.values():
        personal = c.task.modules.state(ModuleKind.PERSONAL)
        for data in c.outgoing:
            env = parse_envelope(data)
            assert b"head/task" not in env.payload and b"mask/" not in env.payload
            if env.kind == "client_update":
                names = {t.name for t in load_payload(env, ClientUpdate).modules}
                assert names <= set(fed.server.spec.names()) and "head/task" not in names
            for vec in personal.values():
                assert vec.astype("<f8").tobytes() not in data  # payload and binary attachments
                assert vec.astype("<f4").tobytes() not in data


def test_fedprox_mu_reaches_the_plan_and_weights_are_capped_sample_counts(tmp_path):
    tables = small_tables()
    fed = build_simulation(tables, tables[0].dictionary,
                           _cfg("fedprox", federation={"strategy_options": {"mu": 0.05}}), audit_dir=tmp_path / "q")
    fed.server.open_round(tuple(sorted(fed.hospitals)))
    plan = fed.server.current.plan
    assert plan.options["fedprox.mu"] == 0.05
    assert plan.options["weight.max"] == plan.options["masked.max_weight"] == 10_000.0
    assert not any(k.startswith("weight/") for k in plan.options)  # each hospital weighs by its sample count
    fed.audit.close()


def test_dp_with_fine_tuning_is_refused_at_configuration(tmp_path):
    tables = small_tables()
    config = _cfg("fedsgd", personal={"modules": ["head/task"], "fine_tune_epochs": 1},
                  privacy={"enabled": True, "noise_multiplier": 1.0})
    with pytest.raises(ConfigError, match="fine_tune_epochs > 0 with \\[privacy\\] enabled"):
        build_simulation(tables, tables[0].dictionary, config, audit_dir=tmp_path / "x")
