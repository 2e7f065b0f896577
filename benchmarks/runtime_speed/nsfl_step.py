"""One NS-FL training step (forward + backward) on the non-DP path: the feature copies' states
computed per copy (``per_copy``: the step before issue 15 session 8, and what ``forward_star``
and Opacus' hooks still do) against once per dictionary feature with the piecewise term read at
two knots (``indexed``: ``forward_neighbourhood`` since session 8, ``_layer1_indexed``), both in
this process, interleaved, on the same batch of the demo's largest hospital (ALARM north, 2400 patients, 23
features a star), for the linear and the piecewise value encoding, with and without
``similar_to`` (k = 5). The logits of both sides are compared too (max |Δ|).

    python -m benchmarks.runtime_speed.nsfl_step            # 40 repetitions, writes benchmarks/runtime_speed/results/nsfl_step.json
    python -m benchmarks.runtime_speed.nsfl_step --quick    # 5 repetitions, prints
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, emit, machine, median, out_path  # noqa: E402


def per_copy_neighbourhood(model, stars, batch: torch.Tensor) -> torch.Tensor:
    """The per-copy form of ``NSFLModel.forward_neighbourhood`` (the code before the indexed path)."""
    if stars.neighbours is None:
        return model.forward_star(stars.feature_index[batch], stars.values[batch], stars.mask[batch])
    nb, nw, nm = stars.neighbours[batch], stars.neighbour_weight[batch], stars.neighbour_mask[batch]
    need, inverse = torch.unique(torch.cat([batch, nb.reshape(-1)]), return_inverse=True)
    h_need, _ = model._layer1(stars.feature_index[need], stars.values[need], stars.mask[need],
                              stars.neighbour_weight[need], stars.neighbour_mask[need])
    pos_b, pos_nb = inverse[: len(batch)], inverse[len(batch):].reshape(nb.shape)
    fi, x, m = stars.feature_index[batch], stars.values[batch], stars.mask[batch]
    h_p1 = h_need[pos_b]
    _, h_f1 = model._layer1(fi, x, m)
    xc = model._clip(x)
    agg = model.l2_of_patient.dense(h_f1, h_p1, xc, m) + model.l2_similar_to.dense(h_need[pos_nb], h_p1, nw, nm)
    return model._head(torch.relu(model.l2_self_patient(h_p1) + agg)) + model.linear_star(fi, xc, m)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_convention(ap)
    ap.add_argument("--reps", type=int, default=40)
    a = ap.parse_args()
    reps = 5 if a.quick else a.reps
    torch.set_num_threads(1)
    from clinograph.sdk.graph import star_batch
    from clinograph.sdk.model import NSFLConfig, NSFLModel
    from clinograph.sdk.training import bce

    from research.demo_quality.demo_quality import demo_tables

    d, tables = demo_tables(0, 1.0)
    table = next(t for t in tables if t.site == "north")
    batch = torch.arange(64)
    y = torch.tensor(table.labels[:64], dtype=torch.float32)
    rows = []
    for k in (0, 5):
        stars = star_batch(table, k_similar=k)
        for encoding in ("linear", "piecewise"):
            model = NSFLModel(len(d.node_ids()), NSFLConfig(hidden=32, init_seed=0, value_encoding=encoding,
                                                            linear_shape=True))
            if model.l1_of_patient.U is not None:  # U starts at zero: give it weights (both sides compute all)
                with torch.no_grad():
                    model.l1_of_patient.U.weight.normal_(0, 0.1)
            sides = {"per_copy": lambda s=stars, mo=model: per_copy_neighbourhood(mo, s, batch),
                     "indexed": lambda s=stars, mo=model: mo.forward_neighbourhood(s, batch)}
            times: dict[str, list[float]] = {n: [] for n in sides}
            for _ in range(3):  # warm-up
                for fn in sides.values():
                    bce(fn(), y).backward()
            for _ in range(reps):  # interleaved: both sides see the same machine load
                for name, fn in sides.items():
                    model.zero_grad()
                    t0 = time.perf_counter()
                    bce(fn(), y).backward()
                    times[name].append(time.perf_counter() - t0)
            with torch.no_grad():
                diff = float((sides["per_copy"]() - sides["indexed"]()).abs().max())
            row = {"k_similar": k, "value_encoding": encoding, "batch": 64,
                   **{f"{n}_ms": 1000 * median(times[n]) for n in sides}, "max_abs_logit_difference": diff}
            row["speedup"] = row["per_copy_ms"] / row["indexed_ms"]
            rows.append(row)
            print(row, flush=True)
    emit({"benchmark": "nsfl_step", "reps": reps, "statistic": "median seconds of forward + backward, x1000",
          "machine": machine(), "rows": rows}, out=out_path(__file__, a))


if __name__ == "__main__":
    main()
