"""One DP-SGD step against one plain step, per task that trains with DP, same batch, same process.

    python -m benchmarks.dp_step.dp_step            # 30 repetitions, writes results/dp_step.json
    python -m benchmarks.dp_step.dp_step --quick    # 5 repetitions, writes results/dp_step_quick.json

Per task (batch 64, the [privacy] default B; the model at its default [model] settings):

- ``nsfl_static``: :class:`~clinograph.sdk.model.nsfl.NSFLModel` on the stars of the demo's largest
  hospital (ALARM north, 2400 patients).
- ``nsfl_temporal``: :class:`~clinograph.sdk.model.temporal.TemporalNSFL` (``temporal = "attention"``,
  window 12) on the snapshot sequences of the first time-series hospital.
- ``survival``: :class:`~clinograph.sdk.model.heads.SurvivalNSFLModel` (8 hazard intervals) on the
  ALARM north stars with synthetic follow-up (the labels do not change the cost).
- ``modalities``: :class:`~clinograph.sdk.model.modalities.ModalityNSFL` (stars plus the PPG waveform
  through its ``Conv1d`` encoder) on the first modality-gap hospital (mm_full_a, every patient with a waveform); the engine only
  (the modality task refuses ``[privacy]`` today: its DP trainer is not wired).
- ``concepts``: a C-GM :class:`~clinograph.sdk.concepts.model.ConceptModel` with ``BlockLinear``
  node modules, as the concepts demo builds it (MLP encoder 64 → 32, hidden 32, emb 8), on its
  north hospital.

Each side is the product's step: **plain** = ``zero_grad``, forward, the task's mean loss, backward,
Adam step; **DP** = what the local-DP trainer does at every step (:func:`clinograph.sdk.privacy.
per_patient.dp_sgd_step`: per-patient gradients, clipped to C = 1, summed, plus CSPRNG noise
σC, over the expected batch, Adam step). Both sides train the same parameters (those the DP trainer
trains: the star path's, ``similar_to`` frozen), start from the same weights, and are timed
interleaved within every repetition; reported: medians, ``ratio`` = DP median / plain median,
``per_rep_ratio_median`` (the median of the ratios inside each repetition, robust to load drift) and
``noise_ms``, the CSPRNG noise draw alone (four Box-Muller normals a parameter, part of the DP step);
the same from the thread's CPU time (``cpu_*``, ``time.thread_time``), which other processes' load on
the shared machine does not inflate (wall time does: a step waits for a core).
Torch single-threaded. Asserts nothing.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, emit, machine, median, out_path  # noqa: E402

B = 64


def _frozen_like_dp(model) -> None:
    """Freeze what the DP trainer freezes (parameters the star path never reaches)."""
    from clinograph.sdk.privacy.trainer import unused_star_parameters

    frozen = set(unused_star_parameters(model))
    for n, p in model.named_parameters():
        p.requires_grad_(n not in frozen)


def _adam(model) -> torch.optim.Optimizer:
    return torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)


def _star_sides(model, inputs, labels, loss_mean, engine) -> dict:
    """Plain and DP steps for a star-path model (static, temporal, survival)."""
    from clinograph.sdk.privacy import per_patient

    _frozen_like_dp(model)
    plain_model = copy.deepcopy(model)
    plain_opt, dp_opt = _adam(plain_model), _adam(model)
    row_shape = tuple(inputs[0].shape[1:])
    probe = per_patient.star_probe(model.n_features, row_shape=row_shape)
    clipper = engine(model, probe=probe)

    def plain() -> None:
        plain_opt.zero_grad(set_to_none=True)
        loss_mean(plain_model(*inputs), labels).backward()
        plain_opt.step()

    def dp() -> None:
        _dp_step(clipper, dp_opt, inputs, labels)

    return {"plain": plain, "dp": dp, "trainable_parameters": clipper.dim}


def _dp_step(clipper, opt, inputs, labels) -> None:
    from clinograph.sdk.privacy import per_patient

    if hasattr(per_patient, "dp_sgd_step"):
        per_patient.dp_sgd_step(clipper, opt, inputs, labels=labels, noise_multiplier=1.0, clip_norm=1.0,
                                expected_batch=B)
        return
    # main before issue 30: DPTrainer._star_step, inlined
    from clinograph.sdk.privacy.noise import secure_gaussian

    out = clipper.clipped_sum(*inputs, labels=labels, clip_norm=1.0)
    noise = secure_gaussian(1.0, torch.Size([clipper.dim]), torch.float64)
    clipper.assign((out.summed + noise.to(out.summed.dtype)) / B)
    opt.step()


def _noise_draw(dim: int):
    from clinograph.sdk.privacy.noise import secure_gaussian

    return lambda: secure_gaussian(1.0, torch.Size([dim]), torch.float64)


def nsfl_static() -> dict:
    from clinograph.sdk.graph import star_batch
    from clinograph.sdk.model.nsfl import NSFLConfig, NSFLModel
    from clinograph.sdk.privacy.per_patient import PerPatientClipper
    from clinograph.sdk.privacy.trainer import star_loss

    from research.demo_quality.demo_quality import demo_tables

    d, tables = demo_tables(0, 1.0)
    table = next(t for t in tables if t.site == "north")
    s = star_batch(table, k_similar=0)
    idx = torch.arange(B)
    inputs = (s.feature_index[idx], s.values[idx], s.mask[idx])
    model = NSFLModel(len(d.node_ids()), NSFLConfig())
    return {**_star_sides(model, inputs, s.labels[idx].float(), star_loss, PerPatientClipper),
            "data": "ALARM demo, hospital north, stars [64, K]", "row_shape": list(inputs[0].shape[1:])}


def nsfl_temporal() -> dict:
    from clinograph.sdk.datasets import timeseries as ts
    from clinograph.sdk.graph.temporal import snapshot_batch
    from clinograph.sdk.ingest import ingest
    from clinograph.sdk.model.nsfl import NSFLConfig
    from clinograph.sdk.model.temporal import TemporalNSFL
    from clinograph.sdk.privacy.per_patient import PerPatientClipper
    from clinograph.sdk.privacy.trainer import star_loss

    d = ts.load_dictionary()
    site = ts.make_timeseries_sites(seed=0)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = ingest(site.table, schema=site.schema, dictionary=d)
    cfg = NSFLConfig(temporal="attention")
    sb = snapshot_batch(table, window=cfg.temporal_window, carry_forward=cfg.temporal_carry_forward)
    idx = torch.arange(B)
    inputs = (sb.feature_index[idx], sb.values[idx], sb.mask[idx])
    model = TemporalNSFL(len(d.node_ids()), cfg)
    return {**_star_sides(model, inputs, sb.labels[idx].float(), star_loss, PerPatientClipper),
            "data": f"time-series hospital {site.hospital.site}, "
                    "snapshot sequences [64, T, K]", "row_shape": list(inputs[0].shape[1:])}


def survival() -> dict:
    from clinograph.sdk.graph import star_batch
    from clinograph.sdk.model.heads import SurvivalNSFLModel
    from clinograph.sdk.model.nsfl import NSFLConfig
    from clinograph.sdk.privacy.survival import HazardClipper, hazard_loss_sum
    from clinograph.sdk.training.survival import interval_targets

    from research.demo_quality.demo_quality import demo_tables

    d, tables = demo_tables(0, 1.0)
    table = next(t for t in tables if t.site == "north")
    s = star_batch(table, k_similar=0)
    idx = torch.arange(B)
    rng = np.random.default_rng(0)  # synthetic follow-up: public, no patient data; the cost ignores it
    breaks = np.linspace(30.0, 240.0, 8)
    se, ee = interval_targets(rng.exponential(120.0, B), rng.integers(0, 2, B), breaks)
    labels = torch.as_tensor(np.concatenate([se, ee], axis=1), dtype=torch.float32)
    inputs = (s.feature_index[idx], s.values[idx], s.mask[idx])
    model = SurvivalNSFLModel(len(d.node_ids()), NSFLConfig(), intervals=len(breaks))

    def loss_mean(logits, y):
        return hazard_loss_sum(logits, y) / y.shape[0]

    return {**_star_sides(model, inputs, labels, loss_mean, HazardClipper),
            "data": "ALARM demo north stars, 8 hazard intervals, synthetic follow-up"}


def concepts() -> dict:
    from clinograph.sdk.concepts import dp as cdp
    from clinograph.sdk.concepts.encoders import MLPEncoder
    from clinograph.sdk.concepts.graph import ConceptGraph
    from clinograph.sdk.concepts.model import ConceptModel, fcm_loss
    from clinograph.sdk.concepts.modules import ConceptHParams
    from clinograph.sdk.demo.concepts import CONCEPTS, TASK, hospital_sites

    sites, cards, _ = hospital_sites(seed=0, scale=1.0)
    site = next(s for s in sites if s.name == "north")
    graph = ConceptGraph.from_edges(nodes=list(site.nodes), edges=list(site.edges), task=TASK,
                                    cards={v: cards[v] for v in site.nodes})
    torch.manual_seed(0)
    model = ConceptModel(kind="cgm", encoder=MLPEncoder(int(site.inputs.shape[1]), 32, (64,)), graph=graph,
                         z_dim=32, hp=ConceptHParams(hidden=32, emb=8))
    plain_model = copy.deepcopy(model)
    plain_opt, dp_opt = _adam(plain_model), _adam(model)
    idx = torch.arange(B)
    x = site.inputs[idx]
    labels = {v: y[idx] for v, y in site.labels.items() if v in site.nodes}
    kw = {"supervised": set(labels), "has_task": TASK in labels, "task": TASK, "gamma": 0.8}
    names = cdp.trainable_names(model)

    def plain() -> None:
        plain_opt.zero_grad(set_to_none=True)
        fcm_loss(plain_model(x, interventions={}), labels, **kw).backward()
        plain_opt.step()

    def dp() -> None:
        cdp.dp_sgd_step(model, dp_opt, names, x, labels, {}, noise_multiplier=1.0, clip=1.0, expected_batch=B, **kw)

    dim = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"plain": plain, "dp": dp, "trainable_parameters": dim,
            "data": f"concepts demo, hospital north, {len(CONCEPTS)} nodes, inputs [64, {int(x.shape[1])}]"}


def modalities() -> dict:
    from clinograph.sdk.datasets import timeseries as ts
    from clinograph.sdk.graph import star_batch
    from clinograph.sdk.ingest import ingest
    from clinograph.sdk.model.modalities import ModalityNSFL
    from clinograph.sdk.model.nsfl import NSFLConfig
    from clinograph.sdk.privacy.per_patient import PerPatientClipper

    d = ts.load_dictionary()
    site = ts.make_timeseries_sites(seed=0, hospitals=ts.MODALITY_GAP_HOSPITALS[:1])[0]  # mm_full_a: waveforms
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = ingest(site.table, schema=site.schema, dictionary=d)
    w, has = ts.waveform_matrix(site, table.patient_ids)
    s = star_batch(table, k_similar=0)
    idx = torch.arange(B)
    inputs = (s.feature_index[idx], s.values[idx], s.mask[idx], torch.as_tensor(w[:B], dtype=torch.float32),
              torch.as_tensor(has[:B], dtype=torch.bool))
    y = s.labels[idx].float()
    model = ModalityNSFL(len(d.node_ids()), NSFLConfig(), modalities=("waveform",))

    def objective(mo, inp, labels):
        logits = mo.forward_modal(inp[0], inp[1], inp[2], [inp[3]], [inp[4]])
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum")

    objective(model, inputs, y).backward()
    for p in model.parameters():  # what the batch never reaches (similar_to) is frozen, as under DP
        p.requires_grad_(p.grad is not None)
        p.grad = None
    plain_model = copy.deepcopy(model)
    plain_opt, dp_opt = _adam(plain_model), _adam(model)
    clipper = PerPatientClipper(model, objective=objective)

    def plain() -> None:
        plain_opt.zero_grad(set_to_none=True)
        (objective(plain_model, inputs, y) / B).backward()
        plain_opt.step()

    def dp() -> None:
        _dp_step(clipper, dp_opt, inputs, y)

    return {"plain": plain, "dp": dp, "trainable_parameters": clipper.dim,
            "data": f"time-series hospital {site.hospital.site}: stars + PPG "
                    f"waveform [64, {int(inputs[3].shape[1])}] ({int(inputs[4].sum())} of 64 have it); the engine "
                    "only (the modality task refuses [privacy] today)"}


TASKS = {"nsfl_static": nsfl_static, "nsfl_temporal": nsfl_temporal, "survival": survival, "concepts": concepts,
         "modalities": modalities}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_convention(ap)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--label", default="", help="what this run measures (e.g. 'before: main 6b286bf')")
    a = ap.parse_args()
    reps = 5 if a.quick else a.reps
    torch.set_num_threads(1)
    cases = {}
    for name, build in TASKS.items():
        try:
            cases[name] = build()
        except TypeError as e:  # the "before" run on main: an engine without objectives (modalities)
            print(f"{name}: not measured ({e})", file=sys.stderr)
    for case in cases.values():  # the noise alone (σC for every trained parameter): a floor of the DP step
        case["noise"] = _noise_draw(case["trainable_parameters"])
    for case in cases.values():  # warm-up
        for _ in range(3):
            case["plain"]()
            case["dp"]()
    load_before = os.getloadavg()
    sides = ("plain", "dp", "noise")
    times = {(name, side): [] for name in cases for side in sides}
    cpu = {(name, side): [] for name in cases for side in sides}
    for _ in range(reps):  # interleaved: both sides of every task see the same load
        for name, case in cases.items():
            for side in sides:
                c0, t0 = time.thread_time(), time.perf_counter()
                case[side]()
                times[(name, side)].append(time.perf_counter() - t0)
                cpu[(name, side)].append(time.thread_time() - c0)
    rows = []
    for name, case in cases.items():
        plain, dp = times[(name, "plain")], times[(name, "dp")]
        row = {"task": name, "batch": B, "data": case["data"], "trainable_parameters": case["trainable_parameters"],
               "plain_ms": 1000 * median(plain), "dp_ms": 1000 * median(dp), "ratio": median(dp) / median(plain),
               "noise_ms": 1000 * median(times[(name, "noise")]),
               "cpu_plain_ms": 1000 * median(cpu[(name, "plain")]), "cpu_dp_ms": 1000 * median(cpu[(name, "dp")]),
               "cpu_ratio": median(cpu[(name, "dp")]) / median(cpu[(name, "plain")]),
               "cpu_noise_ms": 1000 * median(cpu[(name, "noise")]),
               "per_rep_ratio_median": median([d / p for d, p in zip(dp, plain, strict=True)])}
        rows.append(row)
        print(row, flush=True)
    emit({"benchmark": "dp_step", "label": a.label, "reps": reps,
          "statistic": "median seconds of one step x1000; ratio = DP median / plain median",
          "machine": machine(), "load_average_before_timing": list(load_before),
          "load_average_after": list(os.getloadavg()), "rows": rows}, out=out_path(__file__, a))


if __name__ == "__main__":
    main()
