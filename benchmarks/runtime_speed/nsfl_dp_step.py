"""One NS-FL DP-SGD step (per-patient gradients, clipping, noise) for the linear and the piecewise
value encoding (and its factorised ``piecewise_gated`` form), in this process, interleaved, on the same batch of the demo's largest hospital (ALARM
north, 2400 patients, 23 features a star): the book-keeping engine (``grad_sample_mode = "star"``, the
DP trainer's default: per-patient gradients, their clipped sum and CSPRNG noise) and Opacus' hooks
(``"hooks"``: ``GradSampleModule`` forward + backward, ``DPOptimizer`` clip + CSPRNG noise + step). Beside
them the non-DP indexed step (``forward_neighbourhood``, the ordinary trainer's) at ``k_similar`` 0
and 5, alone (``non_dp_k*``) and as the trainer's whole step with Adam (``non_dp_adam_k*``; issue 35
item 3's measure). DP is refused with ``similar_to`` (privacy.md), so the DP arms run at k = 0 only.

    python -m benchmarks.runtime_speed.nsfl_dp_step            # 30 repetitions, writes results/nsfl_dp_step.json
    python -m benchmarks.runtime_speed.nsfl_dp_step --quick    # 5 repetitions, prints

Reported per arm: medians of wall time and of the thread's CPU time (``cpu_*``, ``time.thread_time``;
on the shared machine other sessions' load inflates wall time more than CPU time), and the median of
each repetition's own CPU-time ratio (``cpu_*_over_linear_paired``). The ``part_*`` arms time
the star engine's parts alone (clipped sum, noise, assign + SGD step, an Adam step), and ``dp_floor``
is what a DP step of each encoding would cost if only its parameter-proportional work (noise, Adam)
exceeded the linear encoding's (issue 35 item 3).

Since session 51 the DP arms here are not the deployed step (they draw float64 noise every step and step
with SGD; the DP trainer draws float32 noise 16 steps ahead and steps with fused Adam), so ``dp_floor``
overprices the noise: ``benchmarks/dp_step/dp_step.py --tasks nsfl_static nsfl_piecewise`` times the
deployed step (README, "Session 52").
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, emit, machine, median, out_path  # noqa: E402

ENCODINGS = ("linear", "piecewise", "piecewise_gated")


def _model(n: int, encoding: str):
    from clinograph.sdk.model import NSFLConfig, NSFLModel

    model = NSFLModel(n, NSFLConfig(hidden=32, init_seed=0, value_encoding=encoding, linear_shape=True))
    if model.l1_of_patient.U is not None:  # U (or G) starts at zero: give it weights (every side computes all)
        with torch.no_grad():
            model.l1_of_patient.U.weight.normal_(0, 0.1)
            model.l2_of_patient.U.weight.normal_(0, 0.1)
    return model


def _dp_sides(model, fi, x, m, y) -> tuple[dict, int]:
    """The two DP steps on ``model`` (its unused star parameters frozen, as DPTrainer does), and the
    number of trainable parameters (each patient's gradient has that many entries)."""
    from clinograph.sdk.privacy.noise import install_secure_noise, secure_gaussian
    from clinograph.sdk.privacy.per_patient import PerPatientClipper, star_probe
    from clinograph.sdk.privacy.trainer import star_loss, unused_star_parameters
    from clinograph.sdk.training.optim import adam as product_adam
    from opacus.grad_sample import get_gsm_class
    from opacus.optimizers import DPOptimizer

    frozen = set(unused_star_parameters(model))
    for n, p in model.named_parameters():
        p.requires_grad_(n not in frozen)
    probe = star_probe(model.n_features)
    clipper = PerPatientClipper(model, probe=probe)
    sgd = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)

    def star() -> None:
        out = clipper.clipped_sum(fi, x, m, labels=y, clip_norm=1.0)
        noise = secure_gaussian(1.0, torch.Size([clipper.dim]), torch.float64)
        clipper.assign((out.summed + noise.to(out.summed.dtype)) / len(y))
        sgd.step()

    # the star step's parts, timed alone: per-patient forward/backward + norms + clipped sum; the noise
    # (∝ parameters); the assignment + SGD step; and an Adam step (the DP trainer's optimiser, ∝ parameters)
    held = clipper.clipped_sum(fi, x, m, labels=y, clip_norm=1.0).summed
    adam = product_adam([p for p in model.parameters() if p.requires_grad], lr=0.0)
    parts = {"part_clipped_sum": lambda: clipper.clipped_sum(fi, x, m, labels=y, clip_norm=1.0),
             "part_noise": lambda: secure_gaussian(1.0, torch.Size([clipper.dim]), torch.float64),
             "part_assign_sgd_step": lambda: (clipper.assign(held / len(y)), sgd.step()),
             "part_adam_step": adam.step}

    from clinograph.sdk.privacy import part_rules

    if hasattr(part_rules, "register_opacus_samplers"):  # the piecewise encoding's KnotLinear (a "before" run
        part_rules.register_opacus_samplers()  # on main 3af28ff has plain nn.Linear leaves only)
    gsm = get_gsm_class("hooks")(model, batch_first=True, loss_reduction="mean")
    dp_opt = DPOptimizer(torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0),
                         noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=len(y))
    install_secure_noise(dp_opt)  # as DPTrainer: the CSPRNG noise
    gsm.remove_hooks()

    def hooks() -> None:
        gsm.add_hooks(loss_reduction="mean", batch_first=True)
        try:
            dp_opt.zero_grad(set_to_none=True)
            star_loss(gsm(fi, x, m), y).backward()
            dp_opt.step()
        finally:
            gsm.remove_hooks()

    return {"dp_star_engine": star, "dp_opacus_hooks": hooks, **parts}, clipper.dim


def _adam_step(adam, loss_fn) -> None:
    adam.zero_grad(set_to_none=True)
    loss_fn().backward()
    adam.step()


def _floor(rows: list[dict], n_params: dict[str, int]) -> dict:
    """The DP step's floor for each encoding if everything but the parameter-proportional work were as
    cheap as the linear encoding's: linear DP step + (P_enc − P_lin) · (noise + Adam per parameter), the
    per-parameter costs those of the encoding's own noise and Adam parts (CPU medians)."""
    by = {r["step"]: r for r in rows}
    lin = by["dp_star_engine"]["cpu_linear_ms"]
    out = {}
    for e in ENCODINGS[1:]:
        per_param = (by["part_noise"][f"cpu_{e}_ms"] + by["part_adam_step"][f"cpu_{e}_ms"]) / n_params[e]
        floor = lin + (n_params[e] - n_params["linear"]) * per_param
        out[e] = {"noise_plus_adam_us_per_1000_parameters": 1000 * 1000 * per_param, "floor_ms": floor,
                  "floor_over_linear": floor / lin,
                  "measured_over_linear": by["dp_star_engine"][f"cpu_{e}_over_linear"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_convention(ap)
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    reps = 5 if a.quick else a.reps
    torch.set_num_threads(1)
    from clinograph.sdk.graph import star_batch
    from clinograph.sdk.training import bce
    from clinograph.sdk.training.optim import adam as product_adam

    from research.demo_quality.demo_quality import demo_tables

    d, tables = demo_tables(0, 1.0)
    table = next(t for t in tables if t.site == "north")
    batch = torch.arange(64)
    y = torch.tensor(table.labels[:64], dtype=torch.float32)
    stars = {k: star_batch(table, k_similar=k) for k in (0, 5)}
    s0 = stars[0]
    fi, x, m = s0.feature_index[batch], s0.values[batch], s0.mask[batch]
    sides: dict[tuple[str, str], object] = {}
    n_params: dict[str, int] = {}
    for enc in ENCODINGS:
        for k in (0, 5):
            mo = _model(len(d.node_ids()), enc)
            sides[(f"non_dp_k{k}", enc)] = lambda mo=mo, s=stars[k]: bce(mo.forward_neighbourhood(s, batch), y).backward()
        for k in (0, 5):  # the plain training step as the trainer takes it: forward, backward, Adam
            mo = _model(len(d.node_ids()), enc)
            sides[(f"non_dp_adam_k{k}", enc)] = functools.partial(_adam_step, product_adam(mo.parameters(), lr=0.0),
                                                                  lambda mo=mo, s=stars[k]: bce(mo.forward_neighbourhood(s, batch), y))
        dp, n_params[enc] = _dp_sides(_model(len(d.node_ids()), enc), fi, x, m, y)
        for name, fn in dp.items():
            sides[(name, enc)] = fn
    load_before = os.getloadavg()
    times: dict[tuple[str, str], list[float]] = {key: [] for key in sides}
    cpu: dict[tuple[str, str], list[float]] = {key: [] for key in sides}
    for _ in range(3):  # warm-up
        for fn in sides.values():
            fn()
    for _ in range(reps):  # interleaved: every side sees the same machine load
        for key, fn in sides.items():
            c0, t0 = time.thread_time(), time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t0)
            cpu[key].append(time.thread_time() - c0)
    rows = []
    for arm in dict.fromkeys(a for a, _ in sides):
        row = {"step": arm, "batch": 64, **{f"{e}_ms": 1000 * median(times[(arm, e)]) for e in ENCODINGS}}
        row.update({f"{e}_over_linear": row[f"{e}_ms"] / row["linear_ms"] for e in ENCODINGS[1:]})
        row.update({f"cpu_{e}_ms": 1000 * median(cpu[(arm, e)]) for e in ENCODINGS})
        row.update({f"cpu_{e}_over_linear": row[f"cpu_{e}_ms"] / row["cpu_linear_ms"] for e in ENCODINGS[1:]})
        # the median of each repetition's own ratio (the two sides a fraction of a repetition apart: under
        # a load that changes from one second to the next, steadier than the ratio of the two medians)
        row.update({f"cpu_{e}_over_linear_paired": median([c / lin for c, lin in zip(cpu[(arm, e)], cpu[(arm, "linear")],
                                                                                        strict=True)])
                    for e in ENCODINGS[1:]})
        rows.append(row)
        print(row, flush=True)
    emit({"benchmark": "nsfl_dp_step", "reps": reps, "dp_floor": _floor(rows, n_params),
          "statistic": "median seconds of one step, x1000 (wall; cpu_*: the thread's CPU time, which other "
                       "processes' load does not inflate)",
          "trainable_parameters_under_dp": n_params, "machine": machine(), "load_average_before_timing": list(load_before),
          "load_average_after": list(os.getloadavg()), "rows": rows}, out=out_path(__file__, a))


if __name__ == "__main__":
    main()
