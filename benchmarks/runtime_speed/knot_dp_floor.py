"""The DP step's floor for the piecewise value encoding, from measured pieces (issue 35 item 3; session 53).

The per-patient engine runs the star path: every feature copy v of a star carries its own state h_v,
and U of both ``of_patient`` layers is applied to every copy at its two knots. Under DP the
per-patient gradients need, for every copy, the gradient into h_v (the feature embedding's
per-patient gradient flows through it): Σ_k B_k(x_v) U_kᵀ g_v with g_v = ∂L/∂m_v. Two readings of
what that costs, both timed here on the deployed shapes (ALARM north, B = 64 stars of K = 23
copies, d = 32, M = 13 knots; the piecewise model of ``benchmarks/dp_step``'s ``nsfl_piecewise``):

- **per copy** (the engine today, ``knot_sorted``): the forward Σ_k B_k U_k h_v and the input gradient
  Σ_k B_k U_kᵀ g_v as one [n_k, d] × [d, 2d] product per knot group (2·B·K·d² multiply-adds each), the
  knot sort, and U's clipped sum Σ_i c_i g_i the same way (``sorted_weight_grad``).
- **per patient / per feature** (an exact rewrite, not in the engine): a copy's message enters the loss
  only through α_v m_v (the aggregate) and a_src·m_v (its attention logit), so
  g_v = α_v G_p + δ_v a_src with G_p = ∂L/∂(Σ_v α_v m_v) one d-vector a patient and δ_v = ∂L/∂e_v one
  scalar a copy. Then Σ_k B_k U_kᵀ g_v = α_v·lerp_t(P_p,k, P_p,k+1) + δ_v·lerp_t(Q_k, Q_k+1) with
  P_p,k = U_kᵀ G_p (one [B, d] × [d, M·d] product: B·M·d² instead of 2·B·K·d²) and Q_k = U_kᵀ a_src;
  the forward's U_k h_v depends on the copy's feature only (h_v is its feature's state in the star
  model), so U(table) once a feature ([F, d] × [d, M·d]) and a gather and lerp a copy; U's clipped
  sum is Σ_f (Σ_{v: f_v = f} c_p B_k(x_v) g_v) h_fᵀ: a scatter of the copies' weighted g_v into
  [F·M, d] and one [M·d, F] × [F, d] product.

U's per-patient norm is timed as the engine takes it (``KnotWeight.norm2``: three Grams of the patient's
copies, h, B(x) and g) and with the h and g Grams shared with W's ghost norm (the same inputs and output
gradients: W, V and U are called on the same h_v and sum into the same m_v), the basis Gram alone.

Each rewrite is checked against the per-copy form here (``max_abs_diff``, float32). Also timed, in the
same process and interleaved: the deployed DP step (``per_patient.dp_sgd_step``, as
``benchmarks/dp_step``) and the plain step for both encodings, a step's share of the noise drawn ahead
(``NoiseRows``) and a fused Adam step over each model's trained parameters. Floors: linear DP step
+ the extra noise and Adam + 2 layers × the pieces a piecewise step cannot avoid in each reading.

    python -m benchmarks.runtime_speed.knot_dp_floor            # 20 repetitions, writes results/knot_dp_floor.json
    python -m benchmarks.runtime_speed.knot_dp_floor --quick    # 5 repetitions

Thread CPU time (``time.thread_time``), medians; the machine's load is recorded before and after.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402, N812

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, emit, machine, median, out_path  # noqa: E402

#: steps timed together in a DP / plain block (the engine draws its noise 16 steps ahead)
WARM = 16


def _pieces(model, fi, x, m) -> tuple[dict, dict]:
    """The per-copy and the rewritten pieces of one ``of_patient`` layer (layer 1's inputs), and their
    agreement. Returns ({name: callable}, {name: max_abs_diff})."""
    from clinograph.sdk.model.knot_sorted import (
        _per_knot,
        knot_pairs,
        knot_product,
        knot_weighted,
        sorted_weight_grad,
    )
    from clinograph.sdk.model.layers import hat_basis, hat_pair

    ra = model.l1_of_patient
    u = ra.U.weight.detach()  # [M·d, d], row block k = U_k
    n_k, d = ra.n_knots, u.shape[1]
    b, k_copies = fi.shape
    xc = model._clip(x)
    knots = ra.value_knots
    table = model.feature_init(torch.arange(model.n_features)).detach()  # [F, d]: every feature's state
    h = table[fi].reshape(-1, d)  # [N, d]: the copies' states, as the star path has them
    basis = hat_basis(xc, knots)  # [B, K, M]
    pairs = knot_pairs(basis)
    kk, t = hat_pair(xc, knots)  # [B, K]
    gen = torch.Generator().manual_seed(0)
    gp = torch.randn(b, d, generator=gen)  # G_p
    alpha = torch.softmax(torch.randn(b, k_copies, generator=gen), 1)
    delta = 0.1 * torch.randn(b, k_copies, generator=gen)
    a = ra.a_src.weight.detach()[0]  # [d]
    g = (alpha.unsqueeze(-1) * gp.unsqueeze(1) + delta.unsqueeze(-1) * a).reshape(-1, d)  # g_v [N, d]
    c = torch.rand(b, generator=gen)  # the clipping factors
    u_t = u.view(n_k, d, d).permute(1, 0, 2).reshape(d, n_k * d)  # [d, M·d]: column block k = U_k (rows: out)
    rows_b = torch.arange(b).unsqueeze(1) * n_k + kk  # patient p's knot k row in P [B·M, d]
    rows_f = fi * n_k + kk  # feature f's knot k row in U(table) [F·M, d]
    w0, w1 = (1 - t).unsqueeze(-1), t.unsqueeze(-1)

    def copy_forward():  # what KnotLinear(h, B(x)) does on the star path (no sort: timed apart)
        return knot_product(h, u, pairs)

    def copy_input_grad():  # KnotSortedProduct.backward
        return _per_knot(pairs, knot_weighted(pairs, g), u, transpose=False).index_select(0, pairs.inverse)

    def copy_clipped_sum():  # KnotWeight.clipped
        hs = h.index_select(0, pairs.order)
        cb = (g.view(b, k_copies, d) * c[:, None, None]).reshape(-1, d)
        return sorted_weight_grad(pairs, hs, knot_weighted(pairs, cb))

    def table_forward():  # U(table) once a feature, a two-row lerp a copy
        s = F.linear(table, u).view(-1, d)  # [F·M, d]
        return torch.lerp(s[rows_f], s[rows_f + 1], w1).reshape(-1, d)

    def patient_input_grad():  # α_v lerp(U_kᵀ G_p) + δ_v lerp(U_kᵀ a)
        p = (gp @ u_t).view(-1, d)  # [B·M, d]
        q = (a @ u_t).view(n_k, d)
        gu = torch.lerp(p[rows_b], p[rows_b + 1], w1) * alpha.unsqueeze(-1)
        return gu.add_(torch.lerp(q[kk], q[kk + 1], w1) * delta.unsqueeze(-1)).reshape(-1, d)

    def table_clipped_sum():  # Σ_f (Σ_v c B_k g_v) h_fᵀ
        cg = g.view(b, k_copies, d) * c[:, None, None]
        acc = table.new_zeros(table.shape[0] * n_k, d)
        acc.index_add_(0, rows_f.reshape(-1), (cg * w0).reshape(-1, d))
        acc.index_add_(0, (rows_f + 1).reshape(-1), (cg * w1).reshape(-1, d))
        return (acc.view(-1, n_k * d).T @ table).view(-1, d)  # [M·d, d]: the weight's layout

    from clinograph.sdk.privacy.ghost import KnotWeight

    h3, g3 = h.view(b, k_copies, d), g.view(b, k_copies, d)
    hh, gg = torch.bmm(h3, h3.transpose(1, 2)), torch.bmm(g3, g3.transpose(1, 2))

    def copy_norm2():  # KnotWeight.norm2: the h, B and g Grams of the patient's copies
        return KnotWeight(h3, basis, g3).norm2()

    def norm2_shared_grams():  # the same with the h and g Grams taken from W's ghost norm (same h_v, g_v)
        return (torch.bmm(basis, basis.transpose(1, 2)) * hh * gg).sum((1, 2))

    def sort():
        return knot_pairs(basis)

    def basis_of():
        return hat_basis(xc, knots)

    diffs = {"norm2": float((norm2_shared_grams() - copy_norm2()).abs().max()),
             "forward": float((table_forward() - copy_forward()).abs().max()),
             "input_grad": float((patient_input_grad() - copy_input_grad()).abs().max()),
             "clipped_sum": float((table_clipped_sum() - copy_clipped_sum()).abs().max())}
    scale = {"forward": float(copy_forward().abs().max()), "input_grad": float(copy_input_grad().abs().max()),
             "clipped_sum": float(copy_clipped_sum().abs().max())}
    arms = {"copy_sort": sort, "copy_basis": basis_of, "copy_forward": copy_forward,
            "copy_input_grad": copy_input_grad, "copy_clipped_sum": copy_clipped_sum,
            "table_forward": table_forward, "patient_input_grad": patient_input_grad,
            "table_clipped_sum": table_clipped_sum, "copy_norm2": copy_norm2,
            "norm2_shared_grams": norm2_shared_grams}
    return arms, {"max_abs_diff": diffs, "max_abs_value": scale}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_convention(ap)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    reps = 5 if a.quick else a.reps
    torch.set_num_threads(1)
    from benchmarks.dp_step.dp_step import (
        _adam,
        _frozen_like_dp,
        _noise_rows,
        nsfl_piecewise,
        nsfl_static,
    )

    cases = {"linear": nsfl_static(64), "piecewise": nsfl_piecewise(64)}
    steps = {}
    for enc, case in cases.items():
        steps[f"dp_{enc}"] = case["dp"]
        steps[f"plain_{enc}"] = case["plain"]
    from clinograph.sdk.graph import star_batch
    from clinograph.sdk.model.nsfl import NSFLConfig, NSFLModel

    from research.demo_quality.demo_quality import demo_tables

    d, tables = demo_tables(0, 1.0)
    table = next(t for t in tables if t.site == "north")
    s = star_batch(table, k_similar=0)
    idx = torch.arange(64)
    model = NSFLModel(len(d.node_ids()), NSFLConfig(value_encoding="piecewise"))
    with torch.no_grad():
        model.l1_of_patient.U.weight.normal_(0, 0.1)
    with torch.no_grad():
        pieces, check = _pieces(model, s.feature_index[idx], s.values[idx], s.mask[idx])
    lin_model = NSFLModel(len(d.node_ids()), NSFLConfig())
    dims = {enc: case["trainable_parameters"] for enc, case in cases.items()}
    extra = {}
    for enc, mo in (("linear", lin_model), ("piecewise", model)):
        extra[f"noise_share_{enc}"] = _noise_rows(dims[enc], torch.float32)
        _frozen_like_dp(mo)
        opt = _adam(mo)
        for p in mo.parameters():
            p.grad = torch.zeros_like(p) if p.requires_grad else None
        extra[f"adam_{enc}"] = opt.step
    timed = {**steps, **pieces, **extra}
    for _ in range(2):
        for fn in timed.values():
            fn()
    load_before = os.getloadavg()
    cpu: dict[str, list[float]] = {k: [] for k in timed}
    for _ in range(reps):
        for name, fn in timed.items():
            block = WARM if name in steps or name.startswith("noise_share") else 50
            fn()
            c0 = time.thread_time()
            for _ in range(block):
                fn()
            cpu[name].append(1000 * (time.thread_time() - c0) / block)
    ms = {k: median(v) for k, v in cpu.items()}
    two = 2  # of_patient layers
    extra_noise_adam = (ms["noise_share_piecewise"] - ms["noise_share_linear"]) + (ms["adam_piecewise"] - ms["adam_linear"])
    per_copy = ms["copy_forward"] + ms["copy_input_grad"]
    per_patient = ms["table_forward"] + ms["patient_input_grad"]
    lin = ms["dp_linear"]
    cheapest = (min(ms["copy_forward"] + ms["copy_sort"], ms["table_forward"])
                + min(ms["copy_input_grad"], ms["patient_input_grad"]) + ms["norm2_shared_grams"]
                + min(ms["copy_clipped_sum"], ms["table_clipped_sum"]))
    floors = {
        "per_copy_products": {"pieces_ms_a_layer": per_copy, "floor_ms": lin + extra_noise_adam + two * per_copy},
        "per_copy_products_sort_and_clipped_sum": {
            "pieces_ms_a_layer": per_copy + ms["copy_sort"] + ms["copy_clipped_sum"],
            "floor_ms": lin + extra_noise_adam + two * (per_copy + ms["copy_sort"] + ms["copy_clipped_sum"])},
        "per_patient_rewrite": {"pieces_ms_a_layer": per_patient, "floor_ms": lin + extra_noise_adam + two * per_patient},
        "per_patient_rewrite_and_table_clipped_sum": {
            "pieces_ms_a_layer": per_patient + ms["table_clipped_sum"],
            "floor_ms": lin + extra_noise_adam + two * (per_patient + ms["table_clipped_sum"])},
        # every piece of U's per-patient gradient, each in its cheapest measured form: the forward's U
        # rows, the input gradient, the norm's basis Gram (h and g Grams shared with W's), the clipped sum
        "cheapest_each": {"pieces_ms_a_layer": cheapest, "floor_ms": lin + extra_noise_adam + two * cheapest},
    }
    for f in floors.values():
        f["floor_over_linear_dp"] = f["floor_ms"] / lin
    out = {"benchmark": "knot_dp_floor", "reps": reps, "batch": 64, "shapes": {"K": int(s.feature_index.shape[1]),
           "d": model.config.hidden, "M": model.l1_of_patient.n_knots, "F": model.n_features},
           "statistic": "median thread CPU ms (steps: a block of 16 after one unmeasured; pieces: of 50)",
           "cpu_ms": ms, "measured_dp_piecewise_over_linear": ms["dp_piecewise"] / lin,
           "measured_plain_piecewise_over_linear": ms["plain_piecewise"] / ms["plain_linear"],
           "extra_noise_plus_adam_ms": extra_noise_adam, "floors": floors, "rewrite_check": check,
           "trainable_parameters": dims, "machine": machine(), "load_average_before_timing": list(load_before),
           "load_average_after": list(os.getloadavg())}
    for k, v in ms.items():
        print(f"{k:28s} {v:8.3f} ms")
    print({k: round(v["floor_over_linear_dp"], 3) for k, v in floors.items()}, check)
    emit(out, out=out_path(__file__, a))


if __name__ == "__main__":
    main()
