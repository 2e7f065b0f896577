"""One DP-SGD step against one plain step, per task that trains with DP, same batch, same process.

    python -m benchmarks.dp_step.dp_step            # 40 repetitions, writes results/dp_step.json
    python -m benchmarks.dp_step.dp_step --quick    # 5 repetitions, writes results/dp_step_quick.json
    python -m benchmarks.dp_step.dp_step --batches 64   # one batch size only

Per task, at each batch of :data:`BATCHES` (64, the [privacy] default; 672, the demo's local-DP
federation's expected batch at its largest hospital; 32, a small lifelines-table hospital's; a
source with fewer rows than the batch is cycled), the model at its default [model] settings:

- ``nsfl_static``: :class:`~clinograph.sdk.model.nsfl.NSFLModel` on the stars of the demo's largest
  hospital (ALARM north, 2400 patients).
- ``nsfl_temporal``: :class:`~clinograph.sdk.model.temporal.TemporalNSFL` (``temporal = "attention"``,
  window 12) on the snapshot sequences of the first time-series hospital.
- ``survival``: :class:`~clinograph.sdk.model.heads.SurvivalNSFLModel` (8 hazard intervals) on the
  ALARM north stars with synthetic follow-up (the labels do not change the cost).
- ``modalities``: :class:`~clinograph.sdk.model.modalities.ModalityNSFL` (stars plus the PPG waveform
  through its ``Conv1d`` encoder) on the first modality-gap hospital (mm_full_a, every patient with a
  waveform).
- ``concepts``: a C-GM :class:`~clinograph.sdk.concepts.model.ConceptModel` with ``BlockLinear``
  node modules, as the concepts demo builds it (MLP encoder 64 → 32, hidden 32, emb 8), on its
  north hospital.

Each side is the product's step: **plain** = ``zero_grad``, forward, the task's mean loss, backward,
Adam step; **DP** = what the local-DP trainer does at every step (:func:`clinograph.sdk.privacy.
per_patient.dp_sgd_step`: per-patient gradients, clipped to C = 1, summed, plus CSPRNG noise
σC in the parameters' dtype, over the expected batch, Adam step); **dp_noise64** = the same DP step
with its noise drawn in float64 (the sampler before the float32 path: the noise change measured
inside one process). Both sides train the same parameters (those the DP trainer trains: the star
path's, ``similar_to`` frozen), start from the same weights, and are timed interleaved within every
repetition in a random order, each side as a block of 1 + ``WARM`` consecutive steps, as training
takes them. The block's first step (after another side or task: its model's memory out of cache) is
reported apart (``cpu_cold_*``); the other ``WARM`` = 16 are timed together and their mean is one sample
of the steady state the main figures use (16: the engine draws its noise 16 steps ahead,
:class:`~clinograph.sdk.privacy.noise.NoiseRows`, so every 16 consecutive DP steps pay exactly one draw;
timing steps one by one, a median would hide the draw). Why blocks: a step
right after a step of the same model runs from cache, one after another model's does not, and with
one step a side the order alone moved a ratio by up to 0.1 (a fixed order favoured whichever DP
variant followed the other). Reported: medians,
``ratio`` = DP median / plain median, ``per_rep_ratio_median`` (the median of the ratios inside each
repetition, robust to load drift), ``noise_ms`` / ``noise64_ms``, one CSPRNG noise draw of the
trained parameters alone in the parameters' dtype / in float64, ``noise_rows_ms`` a step's share of the
engine's draws ahead (:class:`~clinograph.sdk.privacy.noise.NoiseRows`); the same from the thread's CPU time (``cpu_*``, ``time.thread_time``),
which other processes' load on the shared machine inflates less than wall time (a step waits for a
core). Torch single-threaded. Asserts nothing.
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

#: the expected batches a deployed DP path steps on: the [privacy] default B = 64 (a hospital with >= 64
#: training patients, e.g. the demo's, temporal, concepts and modality hospitals); the demo's local-DP
#: federation's (B = 1024 at hospital north: 2400 patients, 1344 training, q = 1/2: 672); and a small
#: hospital of the lifelines tables under the default B (15-63 training patients: 32)
BATCHES = (64, 672, 32)
#: steps timed together after a block's first (cold) one: a multiple of the steps whose noise the engine
#: draws at once (:data:`clinograph.sdk.privacy.noise.NOISE_STEPS`), so every block pays its share of one draw
WARM = 16


def _frozen_like_dp(model) -> None:
    """Freeze what the DP trainer freezes (parameters the star path never reaches; with deep = false
    the GNN the star path skips, on a main that has :func:`skipped_star_parameters`)."""
    from clinograph.sdk.privacy import trainer

    frozen = set(trainer.unused_star_parameters(model))
    if hasattr(trainer, "skipped_star_parameters"):
        frozen |= set(trainer.skipped_star_parameters(model))
    for n, p in model.named_parameters():
        p.requires_grad_(n not in frozen)


def _adam(model) -> torch.optim.Optimizer:
    """The trainers' optimizer (:func:`clinograph.sdk.training.optim.adam`: fused Adam), on both sides."""
    from clinograph.sdk.training.optim import adam

    return adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)


def _rows(n: int, b: int) -> torch.Tensor:
    """Row indices of a batch of ``b`` (the source's first rows, cycled when it has fewer: the cost
    depends on the batch's shape, not on which patients fill it)."""
    return torch.arange(b) % n


def _noise64(std, shape, dtype):  # noqa: ARG001 - the noise as drawn before the float32 path (float64)
    from clinograph.sdk.privacy.noise import secure_gaussian

    return secure_gaussian(std, shape, torch.float64)


def _star_sides(model, inputs, labels, loss_mean, engine, b, *, freeze: bool = True) -> dict:
    """Plain and DP steps for a star-path model (static, temporal, survival)."""
    from clinograph.sdk.privacy import per_patient

    if freeze:
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

    return {"plain": plain, "dp": lambda: _dp_step(clipper, dp_opt, inputs, labels, b),
            "dp_noise64": lambda: _dp_step(clipper, dp_opt, inputs, labels, b, noise=_noise64),
            "trainable_parameters": clipper.dim, "dtype": clipper.params[0].dtype}


def _dp_step(clipper, opt, inputs, labels, b, noise=None) -> None:
    from clinograph.sdk.privacy import per_patient

    if hasattr(per_patient, "dp_sgd_step"):
        per_patient.dp_sgd_step(clipper, opt, inputs, labels=labels, noise_multiplier=1.0, clip_norm=1.0,
                                expected_batch=b, noise=noise)
        return
    # main before issue 30: DPTrainer._star_step, inlined
    from clinograph.sdk.privacy.noise import secure_gaussian

    out = clipper.clipped_sum(*inputs, labels=labels, clip_norm=1.0)
    noise = secure_gaussian(1.0, torch.Size([clipper.dim]), torch.float64)
    clipper.assign((out.summed + noise.to(out.summed.dtype)) / b)
    opt.step()


def _noise_draw(dim: int, dtype: torch.dtype):
    from clinograph.sdk.privacy.noise import secure_gaussian

    return lambda: secure_gaussian(1.0, torch.Size([dim]), dtype)


def _noise_rows(dim: int, dtype: torch.dtype):
    try:
        from clinograph.sdk.privacy.noise import NoiseRows
    except ImportError:  # a main before the noise was drawn ahead: one draw a step
        return _noise_draw(dim, dtype)
    return NoiseRows(dim, dtype).next


def nsfl_static(b: int) -> dict:
    from clinograph.sdk.graph import star_batch
    from clinograph.sdk.model.nsfl import NSFLConfig, NSFLModel
    from clinograph.sdk.privacy.per_patient import PerPatientClipper
    from clinograph.sdk.privacy.trainer import star_loss

    from research.demo_quality.demo_quality import demo_tables

    d, tables = demo_tables(0, 1.0)
    table = next(t for t in tables if t.site == "north")
    s = star_batch(table, k_similar=0)
    idx = _rows(len(s.labels), b)
    inputs = (s.feature_index[idx], s.values[idx], s.mask[idx])
    model = NSFLModel(len(d.node_ids()), NSFLConfig())
    return {**_star_sides(model, inputs, s.labels[idx].float(), star_loss, PerPatientClipper, b),
            "data": "ALARM demo, hospital north, stars [B, K]", "row_shape": list(inputs[0].shape[1:])}


def nsfl_piecewise(b: int) -> dict:
    """:func:`nsfl_static` with ``[model] value_encoding = "piecewise"`` (issue 35 item 3 on the deployed
    DP step: its ``dp`` against ``nsfl_static``'s in one run, ``--tasks nsfl_static nsfl_piecewise``)."""
    from clinograph.sdk.graph import star_batch
    from clinograph.sdk.model.nsfl import NSFLConfig, NSFLModel
    from clinograph.sdk.privacy.per_patient import PerPatientClipper
    from clinograph.sdk.privacy.trainer import star_loss

    from research.demo_quality.demo_quality import demo_tables

    d, tables = demo_tables(0, 1.0)
    table = next(t for t in tables if t.site == "north")
    s = star_batch(table, k_similar=0)
    idx = _rows(len(s.labels), b)
    inputs = (s.feature_index[idx], s.values[idx], s.mask[idx])
    model = NSFLModel(len(d.node_ids()), NSFLConfig(value_encoding="piecewise"))
    with torch.no_grad():  # U starts at zero (the linear encoding exactly); trained weights are not zero
        model.l1_of_patient.U.weight.normal_(0, 0.1)
        model.l2_of_patient.U.weight.normal_(0, 0.1)
    return {**_star_sides(model, inputs, s.labels[idx].float(), star_loss, PerPatientClipper, b),
            "data": "ALARM demo, hospital north, stars [B, K]; value_encoding = piecewise",
            "row_shape": list(inputs[0].shape[1:])}


def nsfl_wide(b: int, *, skip: bool = True) -> dict:
    """The DP default model (``[model] deep = false``: the wide path alone) on nsfl_static's batch.
    ``skip = False``: the GNN computed and gated to zero, every parameter trained -- what main did
    before session 48 (same forward, same engine), so before and after run in one process."""
    from clinograph.sdk.graph import star_batch
    from clinograph.sdk.model.nsfl import NSFLConfig, NSFLModel
    from clinograph.sdk.privacy.per_patient import PerPatientClipper
    from clinograph.sdk.privacy.trainer import star_loss, unused_star_parameters

    from research.demo_quality.demo_quality import demo_tables

    d, tables = demo_tables(0, 1.0)
    table = next(t for t in tables if t.site == "north")
    s = star_batch(table, k_similar=0)
    idx = _rows(len(s.labels), b)
    inputs = (s.feature_index[idx], s.values[idx], s.mask[idx])
    model = NSFLModel(len(d.node_ids()), NSFLConfig(deep=False))
    if not skip:
        model.skip_gnn = False
        frozen = set(unused_star_parameters(model))
        for n, p in model.named_parameters():
            p.requires_grad_(n not in frozen)
        sides = _star_sides(model, inputs, s.labels[idx].float(), star_loss, PerPatientClipper, b, freeze=False)
    else:
        sides = _star_sides(model, inputs, s.labels[idx].float(), star_loss, PerPatientClipper, b)
    return {**sides, "data": "ALARM demo, hospital north, stars [B, K]; deep = false"
            + ("" if skip else " computing the GNN (before session 48)"), "row_shape": list(inputs[0].shape[1:])}


def nsfl_wide_gnn(b: int) -> dict:
    """:func:`nsfl_wide` as before session 48 (the GNN computed and gated to zero)."""
    return nsfl_wide(b, skip=False)


def nsfl_temporal(b: int) -> dict:
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
    idx = _rows(len(sb.labels), b)
    inputs = (sb.feature_index[idx], sb.values[idx], sb.mask[idx])
    model = TemporalNSFL(len(d.node_ids()), cfg)
    return {**_star_sides(model, inputs, sb.labels[idx].float(), star_loss, PerPatientClipper, b),
            "data": f"time-series hospital {site.hospital.site} ({len(sb.labels)} patients), "
                    "snapshot sequences [B, T, K]", "row_shape": list(inputs[0].shape[1:])}


def survival(b: int) -> dict:
    from clinograph.sdk.graph import star_batch
    from clinograph.sdk.model.heads import SurvivalNSFLModel
    from clinograph.sdk.model.nsfl import NSFLConfig
    from clinograph.sdk.privacy.survival import HazardClipper, hazard_loss_sum
    from clinograph.sdk.training.survival import interval_targets

    from research.demo_quality.demo_quality import demo_tables

    d, tables = demo_tables(0, 1.0)
    table = next(t for t in tables if t.site == "north")
    s = star_batch(table, k_similar=0)
    idx = _rows(len(s.labels), b)
    rng = np.random.default_rng(0)  # synthetic follow-up: public, no patient data; the cost ignores it
    breaks = np.linspace(30.0, 240.0, 8)
    se, ee = interval_targets(rng.exponential(120.0, b), rng.integers(0, 2, b), breaks)
    labels = torch.as_tensor(np.concatenate([se, ee], axis=1), dtype=torch.float32)
    inputs = (s.feature_index[idx], s.values[idx], s.mask[idx])
    model = SurvivalNSFLModel(len(d.node_ids()), NSFLConfig(), intervals=len(breaks))

    def loss_mean(logits, y):
        return hazard_loss_sum(logits, y) / y.shape[0]

    return {**_star_sides(model, inputs, labels, loss_mean, HazardClipper, b),
            "data": "ALARM demo north stars, 8 hazard intervals, synthetic follow-up"}


def concepts(b: int) -> dict:
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
    idx = _rows(int(site.inputs.shape[0]), b)
    x = site.inputs[idx]
    labels = {v: y[idx] for v, y in site.labels.items() if v in site.nodes}
    kw = {"supervised": set(labels), "has_task": TASK in labels, "task": TASK, "gamma": 0.8}
    names = cdp.trainable_names(model)

    def plain() -> None:
        plain_opt.zero_grad(set_to_none=True)
        fcm_loss(plain_model(x, interventions={}), labels, **kw).backward()
        plain_opt.step()

    def dp(noise=None) -> None:
        cdp.dp_sgd_step(model, dp_opt, names, x, labels, {}, noise_multiplier=1.0, clip=1.0, expected_batch=b,
                        noise=noise, **kw)

    dim = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"plain": plain, "dp": dp, "dp_noise64": lambda: dp(_noise64), "trainable_parameters": dim,
            "dtype": next(model.parameters()).dtype,
            "data": f"concepts demo, hospital north ({int(site.inputs.shape[0])} patients), {len(CONCEPTS)} nodes, "
                    f"inputs [B, {int(x.shape[1])}]"}


def modalities(b: int) -> dict:
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
    idx = _rows(len(s.labels), b)
    inputs = (s.feature_index[idx], s.values[idx], s.mask[idx], torch.as_tensor(w[idx.numpy()], dtype=torch.float32),
              torch.as_tensor(has[idx.numpy()], dtype=torch.bool))
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
        (objective(plain_model, inputs, y) / b).backward()
        plain_opt.step()

    return {"plain": plain, "dp": lambda: _dp_step(clipper, dp_opt, inputs, y, b),
            "dp_noise64": lambda: _dp_step(clipper, dp_opt, inputs, y, b, noise=_noise64),
            "trainable_parameters": clipper.dim, "dtype": clipper.params[0].dtype,
            "data": f"time-series hospital {site.hospital.site} ({len(s.labels)} patients): stars + PPG "
                    f"waveform [B, {int(inputs[3].shape[1])}] ({int(inputs[4].sum())} of {b} have it)"}


TASKS = {"nsfl_static": nsfl_static, "nsfl_piecewise": nsfl_piecewise, "nsfl_wide": nsfl_wide, "nsfl_wide_gnn": nsfl_wide_gnn, "nsfl_temporal": nsfl_temporal, "survival": survival, "concepts": concepts,
         "modalities": modalities}


def _row(name: str, b: int, case: dict, times: dict, cpu: dict, cold: dict) -> dict:
    def ms(d, side):
        return 1000 * median(d[(name, b, side)])

    def ratio(d, side):
        return median(d[(name, b, side)]) / median(d[(name, b, "plain")])

    return {"task": name, "batch": b, "data": case["data"], "trainable_parameters": case["trainable_parameters"],
            "plain_ms": ms(times, "plain"), "dp_ms": ms(times, "dp"), "ratio": ratio(times, "dp"),
            "noise_ms": ms(times, "noise"),
            "cpu_plain_ms": ms(cpu, "plain"), "cpu_dp_ms": ms(cpu, "dp"), "cpu_ratio": ratio(cpu, "dp"),
            "cpu_noise_ms": ms(cpu, "noise"), "cpu_noise_rows_ms": ms(cpu, "noise_rows"),
            "cpu_dp_noise64_ms": ms(cpu, "dp_noise64"), "cpu_ratio_noise64": ratio(cpu, "dp_noise64"),
            "cpu_noise64_ms": ms(cpu, "noise64"),
            "cpu_cold_plain_ms": ms(cold, "plain"), "cpu_cold_dp_ms": ms(cold, "dp"),
            "cpu_cold_ratio": ratio(cold, "dp"), "cpu_cold_ratio_noise64": ratio(cold, "dp_noise64"),
            "per_rep_ratio_median": median([d / p for d, p in zip(times[(name, b, "dp")], times[(name, b, "plain")],
                                                                   strict=True)])}  # pairs: the k-th warm steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_convention(ap)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    ap.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    ap.add_argument("--label", default="", help="what this run measures (e.g. 'before: main 6b286bf')")
    a = ap.parse_args()
    reps = 5 if a.quick else a.reps
    torch.set_num_threads(1)
    cases = {}
    for b in a.batches:
        for name, build in TASKS.items():
            if name not in a.tasks:
                continue
            try:
                cases[(name, b)] = build(b)
            except TypeError as e:  # the "before" run on an old main: an engine without objectives (modalities)
                print(f"{name}: not measured ({e})", file=sys.stderr)
    for case in cases.values():  # the noise alone (σC for every trained parameter): a floor of the DP step
        case["noise"] = _noise_draw(case["trainable_parameters"], case["dtype"])
        case["noise64"] = _noise_draw(case["trainable_parameters"], torch.float64)
        case["noise_rows"] = _noise_rows(case["trainable_parameters"], case["dtype"])
    sides = ("plain", "dp", "dp_noise64", "noise", "noise64", "noise_rows")
    for case in cases.values():  # warm-up
        for _ in range(3):
            for side in sides:
                case[side]()
    load_before = os.getloadavg()
    times = {(*key, side): [] for key in cases for side in sides}
    cpu = {(*key, side): [] for key in cases for side in sides}
    cold = {(*key, side): [] for key in cases for side in sides}  # CPU time of a block's first step
    shuffle = np.random.default_rng(0)  # the order of the sides: public, fixed (module docstring)
    for _ in range(reps):  # interleaved: both sides of every task see the same load
        for key, case in cases.items():
            for side in (sides[j] for j in shuffle.permutation(len(sides))):
                c0 = time.thread_time()  # a block of consecutive steps, as training takes them: the first (cold)
                case[side]()
                cold[(*key, side)].append(time.thread_time() - c0)
                c0, t0 = time.thread_time(), time.perf_counter()  # then WARM steps timed together (their mean)
                for _ in range(WARM):
                    case[side]()
                times[(*key, side)].append((time.perf_counter() - t0) / WARM)
                cpu[(*key, side)].append((time.thread_time() - c0) / WARM)
    rows = []
    for (name, b), case in cases.items():
        rows.append(_row(name, b, case, times, cpu, cold))
        print({k: v for k, v in rows[-1].items() if k != "data"}, flush=True)
    emit({"benchmark": "dp_step", "label": a.label, "reps": reps, "warm_steps_a_block": WARM, "batches": a.batches,
          "statistic": "median seconds of one step x1000; ratio = DP median / plain median",
          "machine": machine(), "load_average_before_timing": list(load_before),
          "load_average_after": list(os.getloadavg()), "rows": rows}, out=out_path(__file__, a))


if __name__ == "__main__":
    main()
