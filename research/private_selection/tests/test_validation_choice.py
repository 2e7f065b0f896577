"""The validation-only choice of the production DP setting (research/private_selection/validation_choice.py):
the grid is configured as written, and the choice reads validation AUROC only."""

import pytest

pytest.importorskip("lifelines")


def test_choose_reads_validation_only_and_weighs_every_table_alike():
    from research.private_selection.validation_choice import choose

    run = lambda v, t: {"validation_auroc": v, "auroc": t}  # noqa: E731
    grid = {"a": {"big": [run(0.80, 0.50)] * 5, "tiny": [run(0.50, 0.99), run(float("nan"), 0.99)]},
            "b": {"big": [run(0.70, 0.99)] * 5, "tiny": [run(0.70, 0.10)]}}
    got = choose(grid)
    assert got["chosen"] == "b"  # (0.70 + 0.70) / 2 > (0.80 + 0.50) / 2, whatever test says
    assert got["validation_auroc"]["a"] == pytest.approx(0.65)  # a NaN seed (one class in validation) is skipped


def test_the_grid_entries_are_configured_as_listed(tmp_path, monkeypatch):
    import clinograph.sdk.privacy.calibration as calibration

    from research.private_selection.validation_choice import GRID, grid_config
    from research.real_tables.real_tables import load

    # the SDK's calibration is tested where it lives; here: that each entry asks it for its own rounds
    monkeypatch.setattr(calibration, "distributed_noise_multiplier",
                        lambda cfg, *, dim, n_hospitals, target_epsilon, rounds: rounds / target_epsilon)
    c, tables = load("lung")
    cfgs = {n: grid_config(n, "lung", 0, epsilon=3.0, tables=tables, dictionary=c.dictionary, work=tmp_path / n)
            for n in GRID}
    for name, cfg in cfgs.items():
        p, f = cfg.privacy, cfg.federation
        assert p.mode == "distributed" and p.sample_rate == 1.0 and p.min_honest == 2 and p.epsilon_budget == 3.0
        assert f.strategy == "fedsgd" and not cfg.selection.enabled and p.noise_multiplier > 0, name
        if GRID[name][0] != "preset":
            assert (f.rounds, p.clip_norm, f.server_lr) == GRID[name][0], name
    assert [n for n, cfg in cfgs.items() if cfg.model.deep] == ["default_preset", "gnn_demo_preset", "default_dplr"]
    assert cfgs["gnn_demo_preset"].model.hidden == 8 and cfgs["default_preset"].model.hidden == 32
    assert [cfgs[n].privacy.noise_multiplier for n in ("wide_r25", "wide", "wide_r100", "default_preset")] == \
        [25 / 3, 50 / 3, 100 / 3, 60 / 3]  # σ calibrated over each entry's own rounds (the preset's: 60)


def test_the_choice_compares_every_entry_on_the_same_seeds():
    from research.private_selection.validation_choice import FIVE, common_seeds

    run = {"validation_auroc": 0.5, "auroc": 0.5}
    grid = {"a": {c: [run] * 5 for c in FIVE}, "b": {c: [run] * (3 if c == "lung" else 5) for c in FIVE}}
    cut = common_seeds(grid)
    assert [len(cut[k]["lung"]) for k in "ab"] == [3, 3] and [len(cut[k]["gbsg2"]) for k in "ab"] == [5, 5]


def test_halving_keeps_the_better_half_on_the_tables_run_first():
    from research.private_selection.validation_choice import halve

    run = lambda v: {"validation_auroc": v, "auroc": 1.0 - v}  # noqa: E731
    scores = {"a": 0.5, "b": 0.9, "c": 0.7, "d": 0.6, "e": 0.8}
    grid = {k: {"x": [run(v)] * 3, "y": [run(v)] * 3, "z": [run(0.0)]} for k, v in scores.items()}
    got = halve(grid, ["x", "y"])  # z (not in the list) is not read
    assert got["kept"] == ["b", "e", "c"] and got["validation_auroc"]["d"] == 0.6
