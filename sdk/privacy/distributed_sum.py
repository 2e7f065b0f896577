"""Distributed DP with the hospital's clipped sum rounded once (concept models): the same released
sensitivity as rounding each patient's row, d coins a round instead of B·d.

:func:`~.distributed.noised_sum` rounds every sampled patient's scaled, clipped row randomly to
integers and sums them: one coin per patient and coordinate (25 M at the concept demo's largest
hospital), most of a concept round. :func:`noised_rounded_sum` forms the hospital's clipped sum
x = s·Σ_p min(1, C'/‖g_p‖)·g_p in float64 and rounds x once, randomly (unbiased; the coins of
:class:`~clinograph.secure.dp.RoundedRowSums`), then adds the same Skellam share.

Why the accountant is unchanged (docs/privacy.md, "Rounding the hospital's sum"): the Skellam bound
(K) of :mod:`clinograph.secure.dp.skellam` holds for any pair of integer sums whose difference
has L2 norm <= Δ2 = C·s + √d and L1 norm <= min(√d·Δ2, Δ2²) (S). Rounding randomly has the law of
floor(x + U), U uniform on [0, 1)^d; coupling two neighbouring sums through the same U gives
integer vectors whose every coordinate differs by less than |x_i − x'_i| + 1, so their L2
distance is at most ‖x − x'‖ + √d, and the released law is a U-mixture of Skellam shifts, whose
Rényi divergence is at most the worst shift's (joint convexity of exp((α−1)·D_α)). So (S) holds
as soon as ‖x − x'‖ <= C·s for the computed, floating-point x: :func:`sum_clip` clips at
C' = C·(1 − η), η covering the float64 errors of the norms, the clip factors, the sum of up to
:data:`SUM_MAX_ROWS` rows and the scaling (Higham 2002, eq. 3.5: |fl(Σ a_i) − Σ a_i| <= γ_n·Σ|a_i|
for a sum of n products in any order, γ_n = n·u/(1 − n·u), u = 2^-53).

:func:`noised_clipped_sum` rounds and shares a clipped sum computed elsewhere within the same
kind of bound: concept models form theirs from the per-patient engine's parts without any row
(:func:`~.parts_sum.parts_clipped_sum`, its own η: :func:`~.parts_sum.parts_sum_clip`).

A hospital with more training patients than :data:`SUM_MAX_ROWS` rounds each row
(:func:`~.distributed.noised_sum`, the same bound (S)); the choice depends on the training-set
size, public already as the FedSGD weight q·n.
"""

from __future__ import annotations

import numpy as np
from clinograph.secure.dp import CsprngUniform, DistributedPolicy, RoundedRowSums, skellam_noise

from clinograph.core.errors import PrivacyError

from .distributed import DPStep, declared_step

#: the most patients a hospital's sum is formed over in float64 (:func:`sum_clip`'s error bound
#: assumes it); a hospital with more training patients rounds each patient's row instead
SUM_MAX_ROWS = 1 << 17

#: rows of the [patients, coordinates] matrix read at a time: about 1 MiB of float64. The clipped sum
#: of 1 680 × 14 869 rows took 0.036 / 0.028 / 0.025 / 0.023 / 0.37 s (CPU, medians of 7, loaded
#: machine) at 256 KiB / 512 KiB / 1 MiB / 2 MiB / 4 MiB blocks
SUM_CHUNK_BYTES = 1 << 20

NOT_FINITE = ("A patient's row of the distributed step is not finite (NaN or inf gradient); its contribution "
               "would be unbounded. Nothing is sent.")


def gamma(k: int) -> float:
    """Higham's γ_k = k·u/(1 − k·u), u = 2⁻⁵³ (float64's unit roundoff)."""
    u = 2.0 ** -53
    return k * u / (1.0 - k * u)


def sum_clip(clip: float, dim: int) -> float:
    """C' = C·(1 − η) with η = 2·((2N+1)·γ_{d+4} + 3·(N+1)·γ_{N+1}), N = :data:`SUM_MAX_ROWS`: clipped
    at C', the float64 sum of at most N rows (:func:`clipped_sum`), scaled by s, moves by at most C·s
    in L2 when one row is added or removed (module docstring; docs/privacy.md). η ≈ 1.2e-5 at
    d = 14 869. The 2N·γ_{d+4}: the two batches compute every other patient's norm anew, and
    nothing makes it round the same -- ``np.einsum`` reduces a block of one row another way than a
    block of several: at d = 14 869 (8 rows a block) the last patient of 9, alone in its block, and
    the same patient of 8 (the first removed), in a full block, got two different norms here -- so
    each other patient's f_p·‖g_p‖ may differ by 2·γ_{d+4}·C' between them (as for the parts:
    :mod:`.parts_sum`, step 3). Without it the factor-2 margin covered that only below d ≈ 196 000."""
    a = (2 * SUM_MAX_ROWS + 1) * gamma(int(dim) + 4)
    b = 3.0 * (SUM_MAX_ROWS + 1) * gamma(SUM_MAX_ROWS + 1)
    return float(clip) * (1.0 - 2.0 * (a + b))


def clipped_sum(rows, *, clip: float) -> np.ndarray:
    """Σ_p min(1, clip/‖g_p‖)·g_p over the rows of ``rows`` ([B, d] float64 array or unclipped
    :class:`~.distributed.PatientRows`, read a block at a time into one buffer), float64 [d].

    Raises:
        PrivacyError: a row is not finite, or there are more than :data:`SUM_MAX_ROWS` rows.
    """
    n, dim = rows.shape
    if n > SUM_MAX_ROWS:
        raise PrivacyError(f"A clipped sum over {n} patients exceeds the {SUM_MAX_ROWS} its float64 error bound covers; "
                           "round each patient's row (noised_sum).")
    total = np.zeros(dim)
    step = max(1, SUM_CHUNK_BYTES // max(1, 8 * dim))
    block = np.empty((min(step, n), dim))
    read = getattr(rows, "read_into", None)
    for lo in range(0, n, step):
        hi = min(lo + step, n)
        if read is not None:
            part = read(lo, hi, block)
        else:
            part = block[:hi - lo]
            part[...] = rows[lo:hi]
        norms = np.sqrt(np.einsum("ij,ij->i", part, part))
        if not np.isfinite(norms).all():
            raise PrivacyError(NOT_FINITE)
        total += np.minimum(1.0, clip / np.maximum(norms, 1e-300)) @ part
    return total


def noised_rounded_sum(rows, *, policy: DistributedPolicy, scale: float, batch: int,
                       source: CsprngUniform | None = None) -> DPStep:
    """z = round(s·Σ_p clip_{C'}(g_p)) + Sk(μ/h) over ``rows`` (unclipped; B may be 0), the sum
    rounded once, randomly, and the share on every coordinate; declared and checked as
    :func:`~.distributed.noised_sum` does (same policy, same accountant: module docstring)."""
    dim = int(rows.shape[1])
    return noised_clipped_sum(clipped_sum(rows, clip=sum_clip(policy.clip_norm, dim)), policy=policy, scale=scale,
                              batch=batch, source=source)


def noised_clipped_sum(x: np.ndarray, *, policy: DistributedPolicy, scale: float, batch: int,
                       source: CsprngUniform | None = None) -> DPStep:
    """z = round(s·x) + Sk(μ/h) for a hospital's float64 clipped sum ``x`` [d] computed within the
    bound of its clip (:func:`clipped_sum` at :func:`sum_clip`, or
    :func:`~.parts_sum.parts_clipped_sum` at :func:`~.parts_sum.parts_sum_clip`): rounded once,
    randomly, then the share on every coordinate; declared and checked as
    :func:`~.distributed.noised_sum` does."""
    src = source or CsprngUniform()
    dim = int(x.shape[0])
    x = np.asarray(x, dtype=np.float64) * scale
    try:
        signal = RoundedRowSums(1, dim)(x.reshape(1, dim), source=src)
    except ValueError:
        raise PrivacyError(NOT_FINITE) from None
    z = signal + skellam_noise(policy.share_variance(scale), dim, source=src)
    return declared_step(z, policy=policy, scale=scale, batch=batch)
