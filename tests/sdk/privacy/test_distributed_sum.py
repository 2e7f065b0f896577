"""The hospital's clipped sum rounded once (sdk/privacy/distributed_sum.py): the sensitivity the
Skellam accountant assumes (Δ2 <= C·s + √d, Δ1 <= min(√d·Δ2, Δ2²): secure/dp/skellam.py eq. (S))
holds for it -- the coupling of the two roundings, and the float64 errors of the sum under the
shrunk clip C' -- and its rounding is unbiased."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from clinograph.sdk.privacy import distributed_sum
from clinograph.sdk.privacy.distributed import PatientRows
from clinograph.sdk.privacy.distributed_sum import clipped_sum, noised_rounded_sum, sum_clip
from clinograph.secure.dp import (
    CsprngUniform,
    DistributedPolicy,
    RoundedRowSums,
    sensitivities,
    skellam_noise,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from clinograph.core.errors import PrivacyError

POLICY = DistributedPolicy(mechanism="skellam", noise_multiplier=1.0, clip_norm=1.0, sample_rate=1.0, min_honest=2,
                           rounds=5, max_epsilon=50.0, delta=1e-5)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 60), st.floats(0.0, 50.0), st.integers(0, 2 ** 32 - 1))
def test_coupled_roundings_of_neighbouring_sums_stay_within_the_accountants_sensitivity(dim, length, seed):
    """Randomised rounding has the law of floor(x + U); through the same U, two sums whose
    difference has L2 norm L <= C·s give integer vectors within the accountant's (Δ2, Δ1) at
    C·s = L. Near-integer x with tiny shifts (every coordinate crosses) shows the √d term is needed."""
    rng = np.random.default_rng(seed)  # test inputs, not secrets
    x = rng.normal(size=dim) * 1e3
    step = rng.normal(size=dim)
    step *= length / max(np.linalg.norm(step), 1e-300)
    for _ in range(20):
        u = rng.uniform(size=dim)
        v, w = np.floor(x + u), np.floor(x + step + u)
        l2, l1 = sensitivities(clip=1.0, scale=max(length, 1e-9), dim=dim)
        assert np.linalg.norm(v - w) <= l2 + 1e-9 and np.abs(v - w).sum() <= l1 + 1e-9
    crossing = np.floor(x) + 1 - 1e-9  # every coordinate just below an integer, shifted by 2e-9
    u = np.full(dim, 1e-10)
    assert np.linalg.norm(np.floor(crossing + 2e-9 + u) - np.floor(crossing + u)) == pytest.approx(np.sqrt(dim))


def test_the_shrunk_clip_keeps_one_patients_move_of_the_float64_sum_within_c_s():
    """Adding one row to the float64 clipped sum moves s·x by at most C·s at the clip C' = sum_clip(C, d);
    at C itself the float errors push it past C·s (rows of very different norms, a patient removed
    from the middle so the blocks shift): the shrink is needed, and enough."""
    rng = np.random.default_rng(1)  # test inputs, not secrets
    scale, d, past = 16384.0, 40, []
    for _ in range(60):
        g = rng.normal(size=(300, d)) * np.exp(rng.uniform(-3, 8, size=(300, 1)))
        without = np.delete(g, rng.integers(0, 300), axis=0)
        for clip in (1.0, sum_clip(1.0, d)):
            move = np.linalg.norm(clipped_sum(g, clip=clip) * scale - clipped_sum(without, clip=clip) * scale)
            past.append((clip, move > scale))
    assert any(beyond for clip, beyond in past if clip == 1.0)
    assert not any(beyond for clip, beyond in past if clip < 1.0)
    assert 0 < 1 - sum_clip(1.0, 14869) < 2e-5  # about 0.2 ring units a clipped patient at s = 2^14


@pytest.mark.parametrize("dim", [1, 14869, 10**6, 2**29])
def test_the_rows_clip_covers_the_other_patients_norms_rounded_anew_in_each_batch(dim):
    """The neighbouring batches compute every other patient's norm anew, and np.einsum reduces a block
    of one row another way than a block of several (at d = 14 869, 8 rows a block, the last patient of
    9 and the same patient of 8 got two different norms on this machine): each f_p·‖g_p‖ may then
    differ by 2·γ_{d+4}·C'. The
    move is at most s·C'·((1 + γ_{d+4})·(1 + 3(N+1)·γ_{N+1}) + 2N·γ_{d+4}) (the module docstring's terms
    and that one, as parts_sum's step 3); sum_clip's η must keep it <= C·s at every d. The η of old
    (2·(γ_{d+4} + 3(N+1)·γ_{N+1}), which assumed the norms equal) fails from d ≈ 196 000."""
    n, g = distributed_sum.SUM_MAX_ROWS, distributed_sum.gamma
    shrunk = sum_clip(1.0, dim)
    move = shrunk * ((1 + g(dim + 4)) * (1 + 3 * (n + 1) * g(n + 1)) + 2 * n * g(dim + 4))
    assert move <= 1.0


def test_the_clipped_sum_reads_patient_rows_as_the_whole_matrix(monkeypatch):
    monkeypatch.setattr(distributed_sum, "SUM_CHUNK_BYTES", 8 * 9 * 4)  # blocks of 4 rows over 10
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(10, 3, 2, generator=gen) * torch.linspace(0.05, 1, 10)[:, None, None]
    b = torch.randn(10, 4, generator=gen) * 0.1
    rows = PatientRows([(4, a[:, 1:]), (1, None), (4, b)], n=10)
    dense = np.concatenate([a[:, 1:].reshape(10, -1).double().numpy(), np.zeros((10, 1)), b.double().numpy()], 1)
    norms = np.linalg.norm(dense, axis=1)
    assert (norms > 0.9).any() and (norms < 0.9).any()
    want = (dense * np.minimum(1.0, 0.9 / norms)[:, None]).sum(0)
    assert np.allclose(clipped_sum(rows, clip=0.9), want, rtol=1e-13, atol=1e-15)


def test_the_noised_sum_is_one_unbiased_rounding_plus_the_share():
    """z = round(s·clipped sum) + Sk(μ/h) with the coins of RoundedRowSums and the share drawn after
    them (same key, same integers); over 400 keys the rounding's mean is the sum (within 6 s.e.)."""
    rng = np.random.default_rng(5)  # test inputs, not secrets
    g = rng.normal(size=(30, 12)) * 0.3
    scale = 1000.0
    x = clipped_sum(g, clip=sum_clip(1.0, 12)) * scale
    key = bytes(range(32))
    step = noised_rounded_sum(g, policy=POLICY, scale=scale, batch=30, source=CsprngUniform(_key=key))
    src = CsprngUniform(_key=key)
    want = RoundedRowSums(1, 12)(x.reshape(1, -1).copy(), source=src)
    assert np.array_equal(step.z, want + skellam_noise(POLICY.share_variance(scale), 12, source=src))
    assert step.batch == 30 and step.declaration.share_variance == POLICY.share_variance(scale)
    rounds = np.stack([RoundedRowSums(1, 12)(x.reshape(1, -1).copy(), source=CsprngUniform(_key=i.to_bytes(2, "big") * 16))
                       for i in range(400)])
    assert np.all((rounds == np.floor(x)) | (rounds == np.floor(x) + 1))
    frac = x - np.floor(x)
    assert np.all(np.abs(rounds.mean(0) - x) <= 6 * np.sqrt(frac * (1 - frac) / 400) + 1e-9)


def test_a_non_finite_row_or_too_many_rows_is_refused(monkeypatch):
    g = np.ones((3, 4))
    g[1, 2] = np.nan
    with pytest.raises(PrivacyError, match="not finite"):
        noised_rounded_sum(g, policy=POLICY, scale=1000.0, batch=3)
    monkeypatch.setattr(distributed_sum, "SUM_MAX_ROWS", 2)
    with pytest.raises(PrivacyError, match="exceeds the 2 its float64 error bound covers"):
        clipped_sum(np.ones((3, 4)), clip=1.0)
