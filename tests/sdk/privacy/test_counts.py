"""Set-up sums under local DP (sdk/privacy/counts.py): per-patient clipped counts, Gaussian
noise at the accounted scale, the whole run within the hospital's budget."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clinograph.sdk.config import (
    GraphSection,
    NSFLConfig,
    PrivacySection,
    ScalingSection,
    SimulationConfig,
)
from clinograph.sdk.federation.coverage import clipped_coverage
from clinograph.sdk.federation.scaling import clipped_histograms, local_histograms, public_bins
from clinograph.sdk.federation.simulate import simulate
from clinograph.sdk.privacy import PrivacyLedger
from clinograph.sdk.privacy.counts import COVERAGE_THRESHOLD, SetupRelease, clipped_sum
from clinograph.secure.runtime.config import FederationSection
from hypothesis import given, settings
from hypothesis import strategies as st

from clinograph.core.identity import Identity

SIGNER = Identity.generate("alpha")
pairs = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 9)), max_size=40)


@settings(max_examples=80, deadline=None)
@given(pairs, st.lists(st.integers(0, 9), min_size=1, max_size=15))
def test_one_patient_moves_the_clipped_sum_by_at_most_one_in_l2(others, new_cells):
    """The sensitivity the ledger assumes: a patient (id 99) added with any observations, repeated
    cells included, moves Σ_i h̄_i by at most 1 in L2."""
    p = np.array([a for a, _ in others], dtype=np.int64)
    c = np.array([b for _, b in others], dtype=np.int64)
    before = clipped_sum(p, c, cells=10)
    after = clipped_sum(np.concatenate([p, np.full(len(new_cells), 99)]), np.concatenate([c, new_cells]), cells=10)
    assert np.linalg.norm(after - before) <= 1 + 1e-9


def test_the_clipped_histogram_keeps_the_shape_when_patients_observe_alike(tables):
    """Each patient observes each numeric feature once here: the clipped histogram is the exact
    one times a common weight per patient set, so quantiles (scale-free) barely move."""
    t = tables[0]
    bins = public_bins(t.dictionary, bins=50, span=5.0)
    exact, clipped = local_histograms(t, bins), clipped_histograms(t, bins)
    assert clipped.shape == exact.shape and (clipped <= exact + 1e-9).all()
    for row_e, row_c in zip(exact, clipped, strict=True):
        if row_e.sum() > 20:
            assert np.abs(row_e / row_e.sum() - row_c / row_c.sum()).max() < 0.05


def test_clipped_coverage_counts_patients_not_observations(tables):
    t = tables[0]
    cov = clipped_coverage(t)
    observed = set(np.asarray(t.observed_nodes()).tolist())
    assert {int(i) for i in np.flatnonzero(cov > 0)} == observed
    per_patient = np.bincount(np.unique(np.stack([t.patient, t.node]), axis=1)[0])
    assert cov.sum() == pytest.approx(np.sum(np.sqrt(per_patient[per_patient > 0])))  # Σ_i m_i / √m_i


def test_a_setup_release_is_accounted_and_has_the_accounted_noise(tmp_path):
    ledger = PrivacyLedger(tmp_path, site="alpha", budget_epsilon=1e9, delta=1e-5, signer=SIGNER)
    release = SetupRelease(ledger, noise_multiplier=2.0)
    draws = np.stack([release.release(np.zeros(500), round_=r) for r in range(40)])
    assert draws.std() == pytest.approx(2.0, rel=0.03)  # 20 000 draws: relative sd 0.5 %, so 6 sd (2 000 at 6 % was 3.8 sd)
    assert ledger.releases == [(2.0, 40, "setup")]
    assert ledger.epsilon_parts()["setup"] == ledger.epsilon() > 0
    cov = release.coverage(np.array([0.0, 1000.0]), round_=40)
    assert cov[1] == 1.0 and COVERAGE_THRESHOLD * 2.0 < 1000


def test_a_dp_federation_runs_its_set_up_sums_within_the_budget(tables, dictionary, tmp_path):
    """Federated scaling and the shared feature set under local DP: each hospital's two set-up
    releases are in its signed ledger entries, the run spends at most the budget, nothing refused."""
    cfg = SimulationConfig(
        federation=FederationSection(rounds=2, secure_mode="masked", local_epochs=1, min_clients=2),
        model=NSFLConfig(hidden=8, features="shared"), graph=GraphSection(k_similar=0),
        scaling=ScalingSection(source="federated"),
        privacy=PrivacySection(enabled=True, epsilon_budget=8.0, clip_norm=1.0, batch_size=16,
                               state_dir=tmp_path / "state"), output=tmp_path / "out")
    simulate(tables, dictionary, cfg, audit_dir=tmp_path / "audit")
    entries = [json.loads(x) for x in (tmp_path / "audit" / "audit.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in entries]
    assert "scaling_derived" in kinds and "feature_coverage" in kinds
    assert "hospital_refused" not in kinds and "update_rejected" not in kinds
    cov = next(e["payload"] for e in entries if e["kind"] == "feature_coverage")
    assert "noisy count" in cov["rule"]
    ledgers = [e["payload"] for e in entries if e["kind"] == "ledger"]
    for t in tables:
        mine = sorted((p for p in ledgers if p["client"] == t.site), key=lambda p: p["epsilon"])
        setup = [r for p in mine for r in p["releases"] if r["purpose"] == "setup"]
        assert len(setup) == 2 and mine[-1]["epsilon_setup"] > 0
        assert mine[-1]["epsilon"] <= 8.0 and mine[-1]["epsilon_training"] > 0
