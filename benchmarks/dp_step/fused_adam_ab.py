"""PyTorch's per-tensor Adam loop against the fused Adam the trainers use
(:func:`clinograph.sdk.training.optim.adam`), each on both sides of :mod:`.dp_step` (plain and DP),
in one process: what the fused update saves a step, and what it does to the DP ÷ plain ratio.

    python -m benchmarks.dp_step.fused_adam_ab            # 60 repetitions, batch 64, every task
    python -m benchmarks.dp_step.fused_adam_ab --quick    # 10 repetitions

Four arms a task (plain and DP step, each with either optimizer), same batch, in a random order
each repetition, each arm as a block of one untimed step and two timed ones (the steady state of
:mod:`.dp_step`); medians of the thread's CPU time. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmarks.dp_step import dp_step  # noqa: E402
from research._common import add_convention, emit, machine, median, out_path  # noqa: E402


def _loop_adam(model) -> torch.optim.Optimizer:
    """PyTorch's default CPU Adam (a loop over the parameter tensors), as the trainers had it."""
    return torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)


def _task(name: str, b: int, reps: int) -> dict:
    fused_adam = dp_step._adam
    try:
        dp_step._adam = _loop_adam
        loop = dp_step.TASKS[name](b)
    finally:
        dp_step._adam = fused_adam
    fused = dp_step.TASKS[name](b)
    arms = {"plain_loop": loop["plain"], "dp_loop": loop["dp"], "plain_fused": fused["plain"], "dp_fused": fused["dp"]}
    for step in arms.values():
        for _ in range(10):
            step()
    cpu: dict[str, list[float]] = {k: [] for k in arms}
    for _ in range(reps):
        for k in random.sample(list(arms), len(arms)):
            arms[k]()  # the block's first step: after another arm, not timed
            for _ in range(2):
                t = time.thread_time()
                arms[k]()
                cpu[k].append(time.thread_time() - t)
    ms = {k: 1e3 * median(v) for k, v in cpu.items()}
    return {"task": name, "batch": b, "cpu_ms": ms, "ratio_loop": ms["dp_loop"] / ms["plain_loop"],
            "ratio_fused": ms["dp_fused"] / ms["plain_fused"], "load_average_after": list(os.getloadavg())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_convention(ap, quick_help="10 repetitions")
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    load = list(os.getloadavg())
    rows = [_task(name, a.batch, 10 if a.quick else a.reps) for name in dp_step.TASKS]
    emit({"benchmark": "fused_adam_ab", "machine": machine(), "load_average_before": load,
          "statistic": "median thread CPU ms of a steady-state step", "rows": rows},
         out=out_path(__file__, a))


if __name__ == "__main__":
    main()
