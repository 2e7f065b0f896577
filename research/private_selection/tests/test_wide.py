"""The wide arms (research/private_selection/wide.py): distributed DP on the wide path at the
DP-LR reference's fixed settings, and local DP on the same model."""

import pytest

pytest.importorskip("lifelines")


@pytest.fixture(scope="module")
def lung():
    from research.real_tables.real_tables import load

    return load("lung")


def test_the_wide_arms_are_configured_as_the_dp_lr_reference(lung, tmp_path):
    from research.private_selection.private_selection import DP_LR
    from research.private_selection.wide import arm_configs

    c, tables = lung
    cfgs = arm_configs("lung", 0, epsilons=(1.0, 3.0), tables=tables, dictionary=c.dictionary, work=tmp_path)
    assert set(cfgs) == {"distributed_wide_eps1", "distributed_wide_eps3", "distributed_wide_hK_eps3",
                         "local_dp_wide_eps1", "local_dp_wide_eps3"}
    for name, cfg in cfgs.items():
        assert cfg.model.deep is False and cfg.privacy.enabled and not cfg.selection.enabled, name
    d1, d3, dk = (cfgs[k] for k in ("distributed_wide_eps1", "distributed_wide_eps3", "distributed_wide_hK_eps3"))
    for cfg in (d1, d3, dk):
        p, f = cfg.privacy, cfg.federation
        assert p.mode == "distributed" and p.sample_rate == 1.0 and p.clip_norm == DP_LR["clip"]
        assert f.strategy == "fedsgd" and f.server_lr == DP_LR["lr"] and f.rounds == DP_LR["steps"]
    assert d3.privacy.min_honest == 2 and dk.privacy.min_honest == len(tables) == dk.federation.masked_threshold == 3
    # σ is the honest set's: the same at h = 2 and h = K; a smaller ε needs more of it
    assert d1.privacy.noise_multiplier > d3.privacy.noise_multiplier == pytest.approx(dk.privacy.noise_multiplier)
    assert cfgs["local_dp_wide_eps3"].privacy.mode != "distributed"


def test_a_distributed_wide_run_spends_at_most_its_epsilon(lung, tmp_path):
    from research.private_selection.private_selection import run_arm, stored
    from research.private_selection.wide import distributed_wide_config

    c, tables = lung
    cfg = distributed_wide_config("lung", 0, epsilon=3.0, min_honest=2, tables=tables, dictionary=c.dictionary,
                                  work=tmp_path)
    cfg = cfg.model_copy(update={"federation": cfg.federation.model_copy(update={"rounds": 2})})
    kept = stored(run_arm(tables, c.dictionary, cfg, choose=False))
    assert kept["rounds_run"] == 2 and 0 <= kept["auroc"] <= 1
    assert kept["ledger"]["hospitals"] == len(tables) and 0 < kept["ledger"]["epsilon_max"] <= 3.0


def test_the_largest_min_honest_is_what_the_masking_graph_allows():
    from research.private_selection.wide import largest_min_honest

    assert [largest_min_honest(n) for n in (2, 3, 4, 5)] == [2, 3, 3, 5]


def test_markdown_judges_the_done_when_on_the_mean_over_cohorts():
    from research.private_selection.wide import STUDY_ROWS, markdown

    row = lambda a: {"auroc_mean": a, "auroc_sd": 0.0, "noise_multiplier": 5.0,  # noqa: E731
                     "epsilon_mean_over_hospitals": 2.9}
    payload = {"cohorts": {c: {"seeds": [0], "summary": {"distributed_wide_eps3": row(a3), "local_dp_wide_eps1": row(a1)}}
                           for c, a3, a1 in (("x", 0.70, 0.60), ("y", 0.66, 0.50))}}
    study = {"cohorts": {c: {"summary": {k: row(0.70 if k == "reference" else 0.67) for k in STUDY_ROWS}}
                         for c in ("x", "y")}}
    text = markdown(payload, study)
    assert "| distributed_wide_eps3 | 0.680 (-0.020) | met |" in text  # within 0.03 of 0.70, ≥ 0.67
    assert "| local_dp_wide_eps1 | 0.550 (-0.150) | not met |" in text
