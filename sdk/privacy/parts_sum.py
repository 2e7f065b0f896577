"""A hospital's clipped sum x = Σ_p min(1, C'/‖g_p‖)·g_p in float64 from the per-patient engine's
parts, without forming each patient's gradient row (concept models under distributed DP).

:func:`~.distributed_sum.clipped_sum` reads a [B, d] matrix of per-patient rows: forming and
reading it was most of a concept round (1 680 × 14 869 at the concept demo's largest hospital).
:func:`parts_clipped_sum` takes what the engine's one forward and one ``autograd.grad`` already
hold (:meth:`~.per_patient.PerPatientClipper.parts`): for a one-position Linear weight the layer's
input a_p and output gradient b_p (g_p = b_p a_pᵀ, never formed; its bias's g_p is b_p itself), for
every other parameter its formed rows r_p (the concept scores' few-position weights and their
biases). All in float64:

- ‖g_p‖² = Σ_weights (‖a_p‖² + [bias])·‖b_p‖² + Σ_rows ‖r_p‖² (ghost norms: Goodfellow 2015; Li et
  al. 2022),
- f_p = C'/‖g_p‖ if ‖g_p‖ > C' else 1,
- x = Σ_weights (f∘b)ᵀa (and Σ_p f_p b_p for the bias) + Σ_rows f·r (one product a weight; Bu et al.
  2023's book-keeping).

Not a second backward of Σ_p f_p·ℓ_p (which would give the same x in exact arithmetic): its output
gradients would be recomputed with f_p inside, so their rounding would not be bounded relative to
the g_p the norms were taken of; here the norms and the sum read the same tensors.

**The reference vectors.** g_p is the REAL vector b_p a_pᵀ (exact product of the engine's float32
a_p, b_p) on the weights and the float32 rows r_p as formed: each a function of patient p's row
and the model only, which is all the sensitivity argument needs (docs/privacy.md, "Rounding the
hospital's sum"). The norm and the sum are computed by different code from the SAME a_p, b_p,
r_p, so both are compared with the same g_p.

**The error bound** (Higham 2002: a sum of n terms in any order, FMA or not, puts each term through
at most n roundings (1 + δ), |δ| <= u = 2⁻⁵³; γ_k = k·u/(1 − k·u); eq. 3.5: |fl(Σ x_i y_i) − Σ x_i y_i|
<= γ_n·Σ|x_i y_i|):

1. *Norms.* ‖g_p‖² = Σ_weights (‖a_p‖² + [bias])·‖b_p‖² + Σ_rows ‖r_p‖² (a one-position layer's bias
   gradient is its b_p: squared once, summed from the same f∘b). Every term (a_j²·b_o², b_o², r_k²)
   is nonnegative and passes through at most d_in + d_out + K + 2 <= 2·d + 3 roundings (the squares,
   the sums over d_in and d_out, a bias's + 1, the product, the sum over the K <= d parts;
   d_in + d_out <= d_in·d_out + 1 <= d + 1), so the computed square
   is ‖g_p‖²·(1 + θ), |θ| <= γ_{2d+4}: a RELATIVE bound, because no term can cancel another. With the
   square root's and the division's roundings, f_p·‖g_p‖ <= C'·(1 + u)/((1 − u)·√(1 − γ_{2d+4}))
   <= C'·(1 + γ_{2d+8}) whether the clip binds or not (a zero gradient: f_p = 1, nothing added).
   This is why the path needs the parts in float32 (or narrower) lifted to float64: a float32
   value's square, and a product of two, are exact in float64 and stay far inside its normal range
   (squares >= 2⁻²⁹⁸), so nothing underflows -- a float64 a_p could square to 0 and make the
   norm, hence the clip, vanish. The parts' dtypes are checked (:data:`NARROW`); otherwise None.
2. *Sum.* Entry (o, j) of a weight's sum is Σ_p fl(f_p·b_po)·a_pj: |error| <= γ_{B+1}·Σ_p f_p·|g_p,oj|;
   a row part's f·r: <= γ_B·Σ_p f_p·|r_pk|. So ‖x̂ − x‖₂ <= γ_{B+1}·Σ_p f_p‖g_p‖ <= γ_{N+1}·N·C'·(1 + γ_{2d+8})
   for B <= N = :data:`~.distributed_sum.SUM_MAX_ROWS`, with x = Σ_p f_p g_p at the computed f_p. No
   underflow term: with float32 inputs (nonzero magnitudes in [2⁻¹⁴⁹, 2¹²⁸)) and d < 2³⁰, ‖g_p‖ < 2²⁸⁷,
   so f_p >= C'·2⁻²⁸⁷ and a nonzero product f_p·b·a >= C'·2⁻⁵⁸⁵, normal for C' in :data:`CLIP_RANGE`;
   nothing overflows (|b·a| < 2²⁵⁶, B <= 2¹⁷). d is the released dimension, at least the engine's
   P (the caller releases each trained parameter once, whole).
3. *The other patients' factors.* The batches D and D' = D + {q} compute every common patient's
   norm anew, and nothing promises the same rounding (a reduction may be ordered by batch size):
   f_p and f'_p may differ. Both norms are within the relative bound of step 1, φ(n) = min(1, C'/n)
   is nonincreasing with φ(n)/φ(n') <= n'/n, so |f_p − f'_p|·‖g_p‖ <= 2·γ_{2d+8}·C': at most
   2N·γ_{2d+8}·C' over the batch.
4. *Scaling and release* (:func:`~.distributed_sum.noised_clipped_sum`, unchanged): as for the rows'
   sum, ‖y − y'‖₂ <= s·C'·(1 + γ_{2d+8})·(1 + 3(N+1)·γ_{N+1} + 2N·γ_{2d+8}) for neighbouring batches,
   y = fl(s·x̂); clipping at C' = C·(1 − η), η = 2·((2N+1)·γ_{2d+8} + 3(N+1)·γ_{N+1})
   (:func:`parts_sum_clip`) makes it <= C·s, with the factor-2 margin the coins' own rounding uses
   (docs/privacy.md). The rows' η (:func:`~.distributed_sum.sum_clip`) is 2·((2N+1)·γ_{d+4} +
   3(N+1)·γ_{N+1}): the same steps over d + 4 roundings a norm (it had no step 3 until session 54's
   review: it assumed a patient's norm computed the same in both batches, which ``np.einsum`` does
   not give: a block of one row is reduced another way than a block of several). At the concept
   demo's d = 14 869: η = 1.1444270e-5 for the rows before, 1.2309992e-5 now, 1.3175718e-5 for the
   parts: the sums' 6(N+1)·γ_{N+1} = 1.1444266e-5, step 3's 4N·γ_{2d+8} =
   1.73e-6 (rows: 4N·γ_{d+4} = 8.7e-7), the norms' 2·γ_{2d+8} = 6.6e-12. The clip shrinks by 1.3e-5.

Assumed, as by the rows' path before it (not new here): patient p's computed a_p, b_p and r_p do
not depend on the other patients of the batch (the engine's batched float32 forward and backward
give each row the same values whatever rows surround it), so a neighbouring batch changes one g_p
only. BLAS does not promise it; checked on this machine's torch CPU build at the concept demo's
largest hospital (1 680 patients, a C-GM model): removing any of five patients left every other
patient's parts bit for bit the same; a test keeps checking it at 257 patients
(tests/sdk/privacy/test_parts_sum.py). It does NOT hold at the smallest batches (session 54's
review, one thread, C-GM model): going from 2-5 patients to one fewer changed a common patient's
reference g_p by up to 1.4e-7 of its norm (torch's float32 kernels differ with the batch's size
there; from 5 to 700 patients no change was seen). That adds at most 4·1.4e-7·C' = 5.6e-7·C' to a
move, inside η's factor-2 margin (>= 5.7e-6·C'), but it is measured, not bounded.
"""

from __future__ import annotations

import torch

from clinograph.core.errors import PrivacyError

from .distributed_sum import NOT_FINITE, SUM_MAX_ROWS, gamma
from .ghost import Formed, LinearWeight
from .per_patient import PerPatientClipper

#: the parts' dtypes the bound covers: lifted to float64 exactly, with squares and products far from
#: float64's underflow and overflow (module docstring, step 1)
NARROW = frozenset({torch.float32, torch.float16, torch.bfloat16})

#: the clips C' for which no product f_p·b·a of the sum underflows (module docstring, step 2)
CLIP_RANGE = (2.0 ** -400, 2.0 ** 400)


def parts_sum_clip(clip: float, dim: int) -> float:
    """C' = C·(1 − η), η = 2·((2N+1)·γ_{2d+8} + 3·(N+1)·γ_{N+1}), N = :data:`SUM_MAX_ROWS`: clipped at C',
    the float64 sum of :func:`parts_clipped_sum`, scaled by s, moves by at most C·s in L2 when one
    patient is added or removed (module docstring). η ≈ 1.32e-5 at d = 14 869."""
    a = (2 * SUM_MAX_ROWS + 1) * gamma(2 * int(dim) + 8)
    b = 3.0 * (SUM_MAX_ROWS + 1) * gamma(SUM_MAX_ROWS + 1)
    return float(clip) * (1.0 - 2.0 * (a + b))


def _sq(rows: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vecdot(rows, rows)


def parts_clipped_sum(engine: PerPatientClipper, *inputs: object, labels: object,
                      clip: float) -> torch.Tensor | None:
    """Σ_p min(1, clip/‖g_p‖)·g_p over the engine's parameters (flat, :attr:`PerPatientClipper.params`
    order, zeros where the batch never reached a parameter), float64 [P], computed from the engine's
    parts (module docstring); None when the bound does not cover this step (a part not in
    :data:`NARROW`, ``clip`` outside :data:`CLIP_RANGE`, 2³⁰ parameters or more): form the rows instead.

    Raises:
        PrivacyError: more than :data:`SUM_MAX_ROWS` patients, or a patient's gradient is not finite.
    """
    b = int(inputs[0].shape[0])  # type: ignore[attr-defined]
    if not CLIP_RANGE[0] <= float(clip) <= CLIP_RANGE[1] or engine.dim >= 1 << 30:
        return None
    if b > SUM_MAX_ROWS:
        raise PrivacyError(f"A clipped sum over {b} patients exceeds the {SUM_MAX_ROWS} its float64 error bound "
                           "covers; round each patient's row (noised_sum).")
    out = torch.zeros(engine.dim, dtype=torch.float64)
    if b == 0:
        return out
    parts = engine.parts(*inputs, labels=labels)
    with torch.inference_mode():
        # one-position weights (with their bias: g_p(bias) = b_p, the same tensor) and formed rows; a
        # bias whose weight is not among the parts (a weight the engine does not train) is a row
        ones = {id(part) for part in parts.values() if type(part) is LinearWeight and part.flat2d is not None}
        biases = {id(part.bias_of): i for i, part in parts.items()
                  if type(part) is Formed and part.bias_of is not None and id(part.bias_of) in ones
                  and part.g is part.bias_of.flat2d[1]}
        lifted: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(float32 tensor) -> (float64, ‖row‖²)

        def lift(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if id(t) not in lifted:  # a layer input read by several layers is lifted and squared once
                t64 = t.reshape(b, -1).double()
                lifted[id(t)] = (t64, _sq(t64))
            return lifted[id(t)]

        weights: list[tuple[int, int | None, torch.Tensor, torch.Tensor]] = []
        rows: list[tuple[int, torch.Tensor]] = []
        taken = set(biases.values())
        for i, part in sorted(parts.items()):
            if type(part) is LinearWeight and part.flat2d is not None:
                if any(t.dtype not in NARROW for t in part.flat2d):
                    return None
                weights.append((i, biases.get(id(part)), *part.flat2d))
            elif i not in taken:
                r = part.per_sample()
                if r.dtype not in NARROW:
                    return None
                rows.append((i, r))
        n2 = torch.zeros(b, dtype=torch.float64)
        for _, j, a, g in weights:  # ‖a‖²·‖b‖², + ‖b‖² for the bias: (‖a‖² + 1)·‖b‖²
            sa, sg = lift(a)[1], lift(g)[1]
            n2.add_((sa + 1.0 if j is not None else sa) * sg)
        flat = torch.cat([r.reshape(b, -1).double() for _, r in rows], 1) if rows else None
        if flat is not None:
            n2.add_(_sq(flat))
        if not bool(torch.isfinite(n2).all()):
            raise PrivacyError(NOT_FINITE)
        norms = n2.sqrt()
        f = torch.where(norms > clip, clip / norms, torch.ones_like(norms))
        start = [0]
        for size in engine.sizes:
            start.append(start[-1] + size)
        for i, j, a, g in weights:
            fg = lift(g)[0] * f[:, None]  # fl(f_p·b_po), shared by the weight's and the bias's sums
            out[start[i]:start[i + 1]] = torch.mm(fg.T, lift(a)[0]).view(-1)
            if j is not None:
                out[start[j]:start[j + 1]] = fg.sum(0)
        if flat is not None:
            at = 0
            summed = f @ flat
            for i, _ in rows:
                out[start[i]:start[i + 1]] = summed[at:at + engine.sizes[i]]
                at += engine.sizes[i]
    if not bool(torch.isfinite(out).all()):
        raise PrivacyError(NOT_FINITE)
    return out
