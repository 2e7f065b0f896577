"""Private model choice under distributed DP (sdk/privacy/distributed_trainer.py): the validation
patients' clipped losses as two more coordinates of the same noisy integer sum."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.build import initial_model_for
from clinograph.sdk.federation.candidates import distributed_rounds
from clinograph.sdk.federation.simulate import simulate
from clinograph.sdk.privacy.calibration import distributed_noise_multiplier
from clinograph.sdk.privacy.distributed import noisy_integer_sum, validation_rows
from clinograph.secure.dp import DistributedPolicy
from clinograph.secure.runtime.selection import released_loss_noise
from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=-1, max_value=1e9, allow_nan=False), max_size=30),
       st.floats(min_value=0.1, max_value=5), st.floats(min_value=0.1, max_value=10))
def test_a_validation_patients_row_is_within_the_clip_and_the_ratio_is_the_mean_clipped_loss(losses, clip, c):
    rows = validation_rows(np.asarray(losses), loss_clip=clip, clip_norm=c)
    assert rows.shape == (len(losses), 2)
    if losses:
        assert np.linalg.norm(rows, axis=1).max() <= c * (1 + 1e-12)
        expected = np.mean(np.clip(losses, 0, clip)) / clip
        assert rows[:, 0].sum() / rows[:, 1].sum() == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_the_released_loss_noise_is_the_spread_of_the_decoded_loss():
    """released_loss_noise against 300 draws of the federation's noisy sum of validation rows
    (three hospitals' Skellam shares at h = 2), decoded as the ratio the hospitals read."""
    policy = DistributedPolicy(mechanism="skellam", noise_multiplier=2.0, clip_norm=1.0, sample_rate=1.0,
                               min_honest=2, rounds=1, max_epsilon=10.0, delta=1e-5)
    rng = np.random.default_rng(0)
    losses = [rng.uniform(0.0, 1.5, n) for n in (40, 60, 50)]
    rows = [validation_rows(x, loss_clip=1.0, clip_norm=1.0) for x in losses]
    scale = 2.0**12
    draws = []
    for _ in range(300):
        z = sum(noisy_integer_sum(r, scale=scale, share_variance=policy.share_variance(scale))[0] for r in rows) / scale
        draws.append(z[0] / z[1])
    mean = float(np.mean(np.clip(np.concatenate(losses), 0.0, 1.0)))
    predicted = released_loss_noise(mean=mean, count=150.0, noise_multiplier=2.0, contributors=3, min_honest=2)
    assert float(np.std(draws)) == pytest.approx(predicted, rel=0.15)  # std of 300 draws: ±4 % (1 s.e.)
    assert float(np.mean(draws)) == pytest.approx(mean, abs=3 * predicted / np.sqrt(300))


def _config(tmp_path, *, candidates=None, sigma=1.0, budget=20.0) -> SimulationConfig:
    return SimulationConfig.model_validate({
        "federation": {"rounds": 3, "secure_mode": "masked", "local_epochs": 1, "min_clients": 2, "strategy": "fedsgd"},
        "model": {"hidden": 8}, "graph": {"k_similar": 0},
        "privacy": {"enabled": True, "mode": "distributed", "epsilon_budget": budget, "noise_multiplier": sigma,
                    "clip_norm": 1.0, "sample_rate": 1.0, "min_honest": 2, "state_dir": str(tmp_path / "state")},
        "selection": {"enabled": True, "candidates": candidates}, "output": str(tmp_path / "out")})


def test_a_distributed_dp_run_keeps_its_round_on_the_noisy_validation_sum_within_the_promise(tables, dictionary,
                                                                                           tmp_path):
    """Every round's sum, the scoring round's included, passes the server's noise test (the
    validation coordinates carry the share); the kept round is chosen; σ calibrated over the
    rounds plus the scoring round keeps every hospital within its budget, nothing refused."""
    cfg = _config(tmp_path, candidates=[])
    dim = sum(m.size for m in initial_model_for(cfg.hospital_config(), dictionary=dictionary).spec.shared)
    sigma = distributed_noise_multiplier(cfg, dim=dim, n_hospitals=len(tables), target_epsilon=8.0,
                                         rounds=distributed_rounds(cfg))
    assert distributed_rounds(cfg) == 3 + 2
    cfg = _config(tmp_path, candidates=[], sigma=sigma, budget=8.0)
    res = simulate(tables, dictionary, cfg, audit_dir=tmp_path / "audit")
    entries = [json.loads(x) for x in (tmp_path / "audit" / "audit.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in entries]
    assert "hospital_refused" not in kinds and "update_rejected" not in kinds and "round_aborted" not in kinds
    checks = [e["payload"] for e in entries if e["kind"] == "noise_check"]
    assert len(checks) == 4  # three training rounds and the scoring round, each passed (a failure voids)
    selected = next(e["payload"] for e in entries if e["kind"] == "model_selected")
    assert selected["rounds_evaluated"] == 4 and 0 <= selected["round"] <= 3
    # each hospital read the released loss's noise back from the module's move (Σ w, η, a) and the
    # round's contributors, and all signed the same: the formula at the true Σ n_val up to the
    # released count's own noise (σ·√2·√(K/h)/Σ n_val ≈ 8 % a round here; 4 % over the four rounds)
    assert "disagreeing" not in selected and len(selected["noises"]) == 4
    n_val = sum(len(h.client.task.split.validation) for h in res.hospitals.values())
    ratios = [noise / released_loss_noise(mean=loss, count=n_val, noise_multiplier=sigma, contributors=len(tables),
                                          min_honest=2)
              for loss, noise in zip(selected["losses"], selected["noises"], strict=True)]
    assert 0.85 < float(np.exp(np.mean(np.log(ratios)))) < 1.18  # a factor √2 (a = C/√2) or K (Σ w) off fails
    ledgers = [e["payload"] for e in entries if e["kind"] == "ledger"]
    assert max(p["epsilon"] for p in ledgers) <= 8.0


def test_the_default_candidates_run_under_distributed_dp(tables, dictionary, tmp_path):
    simulate(tables, dictionary, _config(tmp_path, budget=40.0), audit_dir=tmp_path / "audit")  # 17 rounds at σ = 1
    entries = [json.loads(x) for x in (tmp_path / "audit" / "audit.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in entries]
    assert "model_chosen" in kinds and "hospital_refused" not in kinds and "update_rejected" not in kinds
    chosen = next(e["payload"] for e in entries if e["kind"] == "model_chosen")
    assert len(chosen["candidates"]) == 4
