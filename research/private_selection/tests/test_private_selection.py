"""The private-selection study's pieces (research/private_selection): the DP-LR reference, the
ledger reader on a real private-choice run's audit trail, and the noise-level arithmetic."""

import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lifelines")


@pytest.fixture(scope="module")
def lung():
    from research.real_tables.real_tables import load

    return load("lung")


def test_dp_lr_pooled_noise_falls_with_epsilon_and_learns_without_noise(lung):
    from research.model_quality import sdk_config, splits_for
    from research.private_selection.private_selection import dp_lr_pooled, mean_auroc

    c, tables = lung
    splits = splits_for(tables, sdk_config(seed=0))
    tight, loose = (dp_lr_pooled(tables, splits, epsilon=e, seed=0) for e in (1.0, 1e4))
    assert set(tight) == {t.site for t in tables}
    sig = lambda per: next(iter(per.values()))["sigma"]  # noqa: E731
    assert sig(tight) > 10 * sig(loose) > 0
    assert mean_auroc(loose) > 0.55  # near-noiseless DP-GD learns the (weak) lung signal


def test_a_private_choice_run_reports_its_choice_and_epsilon_parts(lung, tmp_path):
    from research.private_selection.private_selection import (
        noise_level,
        run_arm,
        sdk_dp_config,
        stored,
    )

    c, tables = lung
    cfg = sdk_dp_config("lung", 0, epsilon=3.0, selection=True, work=tmp_path)
    cfg = cfg.model_copy(update={"federation": cfg.federation.model_copy(update={"rounds": 2})})
    run = run_arm(tables, c.dictionary, cfg, choose=True)
    assert run["chosen"] in {"wide", "wide_shape", "linear", "shape"}
    assert set(run["ledger"]) == {t.site for t in tables}
    for part in run["ledger"].values():
        assert 0 < part["epsilon_selection"] < part["epsilon"] <= 3.0
        assert 0 < part["epsilon_training"] < part["epsilon"]
        assert part["sigma_s"] > 0 and part["release_count"] == part["entries"]
    kept = stored(run)  # what the result file keeps: means over hospitals, no per-hospital metrics
    assert "final" not in kept and 0 <= kept["auroc"] <= 1
    assert kept["ledger"]["hospitals"] == 3 and kept["ledger"]["epsilon"] <= kept["ledger"]["epsilon_max"] <= 3.0
    ref = {"validation_losses": [0.9, 0.70, 0.68, 0.69], "candidates": [{"validation_loss": 0.6},
                                                                        {"validation_loss": 0.7}]}
    noise = noise_level(run, ref, n_val=40, hospitals=3, clip=1.0)
    sigma_s = next(iter(run["ledger"].values()))["sigma_s"]
    assert noise["released_loss_std"] == pytest.approx(sigma_s * math.sqrt(3) / 40)
    assert noise["nodp_candidate_loss_range"] == pytest.approx(0.1)
    assert noise["nodp_round_loss_std"] == pytest.approx(np.std([0.70, 0.68, 0.69]))


def test_a_run_without_dp_reports_no_ledger(lung, tmp_path):
    from research.private_selection.private_selection import run_arm, sdk_dp_config

    c, tables = lung
    cfg = sdk_dp_config("lung", 0, epsilon=None, selection=False, work=Path(tmp_path))
    cfg = cfg.model_copy(update={"federation": cfg.federation.model_copy(update={"rounds": 2})})
    run = run_arm(tables, c.dictionary, cfg, choose=False)
    assert run["ledger"] == {} and run["chosen"] is None and len(run["round_seconds"]) == 2


def test_round_cost_times_every_pair_in_one_process(lung, tmp_path):
    from research.private_selection.private_selection import round_cost

    c, tables = lung
    out = round_cost("lung", tables, c.dictionary, rounds=2, work=tmp_path)
    assert set(out["median_seconds"]) == {"no_dp", "local_dp_eps3", "no_dp_one_epoch", "distributed_eps3"}
    assert all(len(v) == 2 and min(v) > 0 for v in out["seconds"].values())
    assert out["ratio_local_dp"] == pytest.approx(out["median_seconds"]["local_dp_eps3"] / out["median_seconds"]["no_dp"])
