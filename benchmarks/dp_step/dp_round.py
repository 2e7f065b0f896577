"""One DP round against one non-DP round of the same federation, per task (issue 30's Done-when).

    python -m benchmarks.dp_step.dp_round            # 3 repetitions, writes results/dp_round.json
    python -m benchmarks.dp_step.dp_round --quick    # 1 repetition, smaller hospitals

What a hospital deploys, end to end: :func:`clinograph.sdk.federation.simulate.simulate_one`
(the real server, real hospitals, masked aggregation, the in-process transport) on one task's
federation, for ``ROUNDS`` rounds; a round's seconds are the simulation's own ``round_seconds``
(from the round's opening to its aggregate: every hospital's local work -- serial here, in
parallel in a deployment -- plus masking, unmasking and the server's checks; the set-up before the
first round and the test evaluation after each round are outside it). Reported per arm: the median
over the rounds after the first (warm) of every repetition.

Arms per task (the same hospitals, model and seed on every arm; only ``[privacy]`` and what it
requires differ):

- ``plain``: no DP, ``fedavg``, one local epoch of minibatches (B = 64);
- ``local``: local DP-SGD (Poisson batches of expected size 64, one epoch, clip 1, σ 1): the
  ``local`` cell of the DP matrix at this size;
- ``plain_full_batch``: no DP, ``fedsgd``, one local step over every training patient (B = n):
  the non-DP round of the same work as distributed DP's;
- ``distributed``: distributed DP (q = 1, one full-batch per-patient step, clip 1, Skellam shares
  in the masked sum, the server's noise checks; NS-FL rounds each patient's row, concepts the
  hospital's clipped sum once, :mod:`clinograph.sdk.privacy.distributed_sum`);
- ``distributed_per_row`` (concepts only): the same with each patient's row rounded (what a
  concept hospital past ``SUM_MAX_ROWS`` patients does; every one did before);
- ``distributed_rows`` (concepts only): the hospital's sum rounded once but formed from per-patient
  rows (what every concept hospital did before the sum from the engine's parts,
  :mod:`clinograph.sdk.privacy.parts_sum`).

Ratios: ``local / plain`` and ``distributed / plain_full_batch`` (the same work with and without
DP), and ``distributed / plain`` (against the default non-DP round); for concepts also
``distributed_per_row`` and ``distributed_rows`` over both. The goal is ≤ 2. ``--clock cpu`` times
the concept rounds by this process's CPU seconds (every hospital and the server run in it), which
other processes' load does not stretch (fsync waits are left out).

Tasks (the DP matrix's rows; tests/sdk/privacy/test_dp_matrix.py): ``static`` (ALARM demo
hospitals), ``temporal`` (the first three time-series hospitals, attention window 4), ``survival``
(the lung cohort in survival form), ``modalities`` (three modality-gap hospitals with PPG
waveforms), ``concepts`` (the concepts demo's hospitals and C-GM model through its voted run,
:func:`clinograph.sdk.concepts.federation.run_concept_federation`; a round's seconds are the time
between two rounds' ends; an arm the runtime refuses is recorded with its reason). Arms interleaved within a repetition; torch single-threaded. Asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from clinograph.core.errors import ConfigError, ProtocolError  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, emit, machine, median, out_path  # noqa: E402

ROUNDS = 3
#: [model] deep on every arm (--deep false: the DP default model, the wide path alone)
DEEP = True
ARMS = ("plain", "local", "plain_full_batch", "distributed", "distributed_rows", "distributed_per_row")
#: the arm only concepts run: distributed DP with each patient's row rounded (what a concept hospital past
#: distributed_sum.SUM_MAX_ROWS patients does, and every concept hospital did before issue 30's fix)
PER_ROW = "distributed_per_row"
#: the other arm only concepts run: the hospital's clipped sum from formed per-patient rows (concept_rows, then
#: distributed_sum.noised_rounded_sum), what a concept hospital did before the sum from the engine's parts
#: (sdk/privacy/parts_sum.py, session 54) and does where that path does not apply
ROWS = "distributed_rows"
CONCEPT_ONLY = (PER_ROW, ROWS)
#: --clock: how a concept round is timed (wall: time.perf_counter; cpu: time.process_time, this process's CPU
#: seconds -- every hospital and the server run in it -- which other processes' load does not stretch; fsync
#: waits and other sleeps are left out)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
CLOCK = "wall"
#: --gnn-computed: the DP arms again with the GNN computed (deep = false as before session 48)
GNN_ARMS = ("local_gnn", "distributed_gnn")


def _privacy(arm: str, state: Path) -> dict:
    if arm.startswith("plain"):
        return {"enabled": False}
    common = {"enabled": True, "epsilon_budget": 100.0, "noise_multiplier": 1.0, "clip_norm": 1.0,
              "state_dir": str(state)}
    if arm == "local":
        return {**common, "batch_size": 64}
    return {**common, "mode": "distributed", "sample_rate": 1.0, "min_honest": 2}  # distributed, distributed_rows, distributed_per_row


def _config(task: str, arm: str, work: Path, n_max: int):
    from clinograph.sdk.config import SimulationConfig
    from clinograph.sdk.datasets import timeseries as ts

    # deep written: the same model on every arm (under [privacy] an unwritten deep is the wide path alone)
    model: dict = {"hidden": 16, "init_seed": 0, "deep": DEEP}
    extra: dict = {}
    if task == "temporal":
        model |= {"temporal": "attention", "temporal_window": 4}
    if task == "modalities":
        model |= {"modalities": ["waveform"]}
        extra["dictionary"] = str(ts.DICTIONARY_PATH)
    if task == "survival":
        extra["target"] = {"kind": "survival", "time_unit": "mo", "breaks": [3, 6, 12, 24, 36], "horizon": 12}
    full = arm in ("plain_full_batch", "distributed")
    return SimulationConfig.model_validate({
        "federation": {"rounds": ROUNDS, "secure_mode": "masked", "local_epochs": 1, "min_clients": 2,
                       "strategy": "fedsgd" if full else "fedavg", "seed": 0},
        "model": model, "graph": {"k_similar": 0},
        "training": {"batch_size": n_max if full else 64, "seed": 0},
        "privacy": _privacy(arm, work / "state"), "selection": {"enabled": False, "candidates": []},
        "output": str(work / "out"), **extra})


def _federations(quick: bool) -> dict:
    """task -> (tables, dictionary, task_factory or None)."""
    from clinograph.sdk.datasets import timeseries as ts
    from clinograph.sdk.datasets.alarm import (
        DEFAULT_HOSPITALS,
        load_dictionary,
        make_hospital_tables,
    )
    from clinograph.sdk.datasets.real_tables import cohort_tables
    from clinograph.sdk.federation.modality_task import build_modality_task
    from clinograph.sdk.ingest import ingest

    from clinograph.core.identity import Identity

    scale = 0.2 if quick else 1.0
    d = load_dictionary()
    alarm = tuple(replace(h, n_patients=max(60, int(h.n_patients * scale))) for h in DEFAULT_HOSPITALS)
    static = [ingest(df, schema=s, dictionary=d) for df, s in make_hospital_tables(seed=0, hospitals=alarm)]
    lung = cohort_tables("lung", form="survival")
    survival = [ingest(df, schema=s, dictionary=lung.dictionary) for df, s in lung.hospitals]

    def shrink(specs):
        return tuple(replace(h, n_patients=max(30, int(h.n_patients * scale))) for h in specs)

    dts, temporal = ts.ingested_sites(shrink(ts.DEFAULT_TS_HOSPITALS[:3]), seed=1)
    dmm, modal = ts.ingested_sites(shrink(tuple(ts.MODALITY_GAP_HOSPITALS[i] for i in (0, 1, 4))), seed=2)
    signals = {t.site: s for t, s in modal}

    def modal_factory(table, hconf):
        return build_modality_task(table, dictionary=dmm, config=hconf, signals=signals[table.site],
                                   state_dir=Path(hconf.privacy.state_dir or hconf.output) / table.site,
                                   identity=Identity.generate(table.site))

    return {"concepts": quick, "static": (static, d, None), "temporal": ([t for t, _ in temporal], dts, None),
            "survival": (survival, lung.dictionary, None), "modalities": ([t for t, _ in modal], dmm, modal_factory)}


def _concept_round_seconds(arm: str, quick: bool) -> list[float]:
    from clinograph.sdk.concepts import distributed_training
    from clinograph.sdk.concepts.encoders import MLPEncoder
    from clinograph.sdk.concepts.federation import run_concept_federation
    from clinograph.sdk.concepts.modules import ConceptHParams
    from clinograph.sdk.concepts.task import ConceptTraining
    from clinograph.sdk.config import FederationSection, PrivacySection
    from clinograph.sdk.demo.concepts import CONCEPTS, TASK, hospital_sites
    from clinograph.secure.audit import AuditTrail

    from clinograph.core.identity import Identity

    sites, cards, digest = hospital_sites(seed=0, scale=0.2 if quick else 1.0)
    full = arm in ("plain_full_batch", "distributed", *CONCEPT_ONLY)
    n_max = max(len(s.split.train) for s in sites)
    fed = FederationSection(id="dp-round", rounds=ROUNDS, secure_mode="masked", local_epochs=1, seed=0,
                            strategy="fedsgd" if full else "fedavg", min_clients=len(sites))
    ends: list[float] = []
    once, parts = distributed_training.SUM_MAX_ROWS, distributed_training.concept_sum
    clock = CLOCKS[CLOCK]
    with tempfile.TemporaryDirectory(prefix="dpr") as tmp:
        server = Identity.generate("server")
        audit = AuditTrail(Path(tmp) / "audit", identity=server)
        try:
            distributed_training.SUM_MAX_ROWS = 0 if arm == PER_ROW else once
            if arm == ROWS:  # no sum from the parts: the rows are formed (concept_sum's None)
                distributed_training.concept_sum = lambda *args, **kwargs: None
            run_concept_federation(sites=sites, concepts=CONCEPTS, task=TASK, cards=cards, kind="cgm",
                                   encoder=lambda: MLPEncoder(int(sites[0].inputs.shape[1]), 32, (64,)), z_dim=32,
                                   federation=fed, audit=audit, server_identity=server, dictionary_hash=digest,
                                   hp=ConceptHParams(hidden=32, emb=8),
                                   training=ConceptTraining(batch_size=n_max if full else 64, lr=3e-3, seed=0),
                                   privacy=PrivacySection(**_privacy(arm, Path(tmp) / "state")),
                                   on_round=lambda *_: ends.append(clock()))
        finally:
            distributed_training.SUM_MAX_ROWS, distributed_training.concept_sum = once, parts
            audit.close()
    return [b - a for a, b in zip(ends, ends[1:], strict=False)]  # from one round's end to the next's


def _round_seconds(task: str, arm: str, fed) -> list[float]:
    from clinograph.sdk.federation.simulate import simulate

    if task == "concepts":
        return _concept_round_seconds(arm, fed)

    tables, dictionary, factory = fed
    n_max = max(len(t.patient_ids) for t in tables)
    with tempfile.TemporaryDirectory(prefix="dpr") as tmp:
        work = Path(tmp)
        cfg = _config(task, arm, work, n_max)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = simulate(tables, dictionary, cfg, audit_dir=work / "audit", task_factory=factory, choose=False)
    return [float(s) for s in res.timings["round_seconds"][1:]]  # the first round warms caches


@contextlib.contextmanager
def _gnn_computed():
    """Meanwhile, main before session 48 with deep = false: the star path runs the GNN (its output gated to zero)
    and DP trains every parameter on it (nothing skipped: the GNN's all-zero per-patient gradients are
    formed and noised). Prediction (forward_neighbourhood) skipped the GNN then too, as now."""
    from clinograph.sdk.model import nsfl
    from clinograph.sdk.privacy import distributed, trainer

    def forward_star(self, feature_index, values, mask):
        return (self._head(self.embed_star(feature_index, values, mask))
                + self.linear_star(feature_index, self._clip(values), mask))

    saved = nsfl.NSFLModel.forward_star, trainer.skipped_star_parameters
    nsfl.NSFLModel.forward_star = forward_star
    trainer.skipped_star_parameters = distributed.skipped_star_parameters = lambda model: []
    try:
        yield
    finally:
        nsfl.NSFLModel.forward_star = saved[0]
        trainer.skipped_star_parameters = distributed.skipped_star_parameters = saved[1]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_convention(ap, quick_help="1 repetition, hospitals at 0.2x")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tasks", nargs="*", default=["static", "temporal", "survival", "modalities", "concepts"])
    ap.add_argument("--deep", choices=("true", "false"), default="true",
                    help="[model] deep on every arm (false: the DP default model; static and survival only)")
    ap.add_argument("--gnn-computed", action="store_true",
                    help="with --deep false: also the DP arms as main before session 48 (the star path computes "
                         "the GNN gated to zero and DP trains it), interleaved, as arms local_gnn, distributed_gnn")
    ap.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                    help="how a concept round is timed: wall seconds, or this process's CPU seconds (cpu: not "
                         "stretched by other processes' load; the other tasks are timed by simulate(), wall)")
    args = ap.parse_args(argv)
    global DEEP, CLOCK
    DEEP = args.deep == "true"
    CLOCK = args.clock
    arms = ARMS + (GNN_ARMS if args.gnn_computed else ())
    torch.set_num_threads(1)
    reps = 1 if args.quick else args.reps
    feds = _federations(args.quick)
    load_before = os.getloadavg()
    seconds: dict[str, dict[str, list[float]]] = {t: {a: [] for a in arms} for t in args.tasks}
    refused: dict[str, dict[str, str]] = {t: {} for t in args.tasks}
    t0 = time.perf_counter()
    for _ in range(reps):
        for task in args.tasks:
            for arm in arms:  # interleaved: every arm sees the same load drift
                if arm in refused[task] or (arm in CONCEPT_ONLY and task != "concepts"):
                    continue
                try:
                    with _gnn_computed() if arm in GNN_ARMS else contextlib.nullcontext():
                        seconds[task][arm] += _round_seconds(task, arm.removesuffix("_gnn"), feds[task])
                except (ConfigError, ProtocolError) as err:  # a cell the runtime refuses (docs/privacy.md, "The DP matrix")
                    refused[task][arm] = str(err)[:300]
    rows = {}
    for task in args.tasks:
        med = {a: median(seconds[task][a]) for a in arms if seconds[task][a]}

        def ratio(a: str, b: str, med: dict = med) -> float | None:
            return med[a] / med[b] if a in med and b in med else None

        rows[task] = {"median_round_seconds": med, "round_seconds": seconds[task], "refused": refused[task],
                      "ratio_local_over_plain": ratio("local", "plain"),
                      "ratio_distributed_over_full_batch": ratio("distributed", "plain_full_batch"),
                      "ratio_distributed_over_plain": ratio("distributed", "plain")}
        if task == "concepts":
            rows[task]["ratio_per_row_over_full_batch"] = ratio(PER_ROW, "plain_full_batch")
            rows[task]["ratio_per_row_over_plain"] = ratio(PER_ROW, "plain")
            rows[task]["ratio_rows_over_full_batch"] = ratio(ROWS, "plain_full_batch")
            rows[task]["ratio_rows_over_plain"] = ratio(ROWS, "plain")
            rows[task]["clock"] = CLOCK
        if task != "concepts":
            rows[task]["patients"] = [len(t.patient_ids) for t in feds[task][0]]
    result = {"benchmark": "dp_round", "machine": machine(), "load_before": load_before, "load_after": os.getloadavg(),
              "rounds_per_run": ROUNDS, "repetitions": reps, "quick": args.quick,
              "seconds_total": time.perf_counter() - t0, "deep": DEEP, "gnn_computed": args.gnn_computed,
              "tasks": rows}
    emit(result, out=out_path(__file__, args))
    return result


if __name__ == "__main__":
    main()
