"""Before → after in one process: the NS-FL model code of a git revision (``--ref``, default main) against
the working tree's, for the linear and the piecewise value encoding (issue 35 item 3).

The "old" arms run ``sdk/model/{knot_sorted,layers,nsfl}.py`` as they are at ``--ref`` (read with ``git
show``, loaded as modules beside the current ones; the per-patient engine is taught the old
``KnotLinear`` with the current rule), the "new" arms the working tree's; the same weights on both.
Arms, all interleaved in a random order within every repetition, each as a block of steps after one
unmeasured step:

- ``nondp_k0`` / ``nondp_k5``: the non-DP trainer's step (``forward_neighbourhood`` on 64 patients of
  ALARM north with ``k_similar`` 0 / 5, BCE, backward, fused Adam), 8 steps a block;
- ``dp``: the deployed DP step (``per_patient.dp_sgd_step``, B = 64, star path, C = 1, noise drawn
  ahead), 16 steps a block.

Also checked once: each new arm's logits and gradients (non-DP) and clipped sum (DP) against the old
arm's (``max_abs_diff``). Thread CPU time, medians; ``paired``: the median of each repetition's own ratio.

    python -m benchmarks.runtime_speed.piecewise_ab --ref main --reps 30 --out piecewise_ab_s53
    python -m benchmarks.runtime_speed.piecewise_ab --ref main --reps 30 --linear-shape --out piecewise_ab_shape_s53

The model: the SDK's default ``[model]`` (hidden 32, ``linear_shape = false``) with the encoding; with
``--linear-shape`` that of ``nsfl_dp_step.py`` (the wide path's shape functions on: both encodings pay
one more hat basis a step, so the ratio reads lower).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the repository root
from research._common import add_convention, emit, machine, median, out_path  # noqa: E402

FILES = ("knot_sorted", "layers", "nsfl")
BLOCK = {"nondp_k0": 8, "nondp_k5": 8, "dp": 16}


def _old_model_class(ref: str):
    """``NSFLModel`` of ``ref``'s sdk/model files, loaded as ``clinograph.sdk.model._ab_old_*``."""
    from clinograph.sdk.privacy import part_rules

    mods = {}
    for name in FILES:
        src = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:sdk/model/{name}.py"], capture_output=True,
                             text=True, check=True).stdout
        for other in FILES:
            src = src.replace(f"from .{other} import", f"from ._ab_old_{other} import")
        full = f"clinograph.sdk.model._ab_old_{name}"
        mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(full, loader=None))
        mod.__package__ = "clinograph.sdk.model"
        sys.modules[full] = mod
        exec(compile(src, f"<{ref}:sdk/model/{name}.py>", "exec"), mod.__dict__)  # noqa: S102 - the repository's own code
        mods[name] = mod
    part_rules.PART_RULES[mods["layers"].KnotLinear] = part_rules.PART_RULES[part_rules.KnotLinear]
    return mods["nsfl"].NSFLModel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_convention(ap)
    ap.add_argument("--ref", default="main")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--linear-shape", action="store_true",
                    help="[model] linear_shape = true (the model of nsfl_dp_step.py; default: the SDK's default, false)")
    a = ap.parse_args()
    reps = 5 if a.quick else a.reps
    torch.set_num_threads(1)
    from clinograph.sdk.graph import star_batch
    from clinograph.sdk.model import NSFLConfig, NSFLModel
    from clinograph.sdk.privacy import per_patient
    from clinograph.sdk.privacy.trainer import unused_star_parameters
    from clinograph.sdk.training import bce
    from clinograph.sdk.training.optim import adam

    from research.demo_quality.demo_quality import demo_tables

    old_cls = _old_model_class(a.ref)
    d, tables = demo_tables(0, 1.0)
    table = next(t for t in tables if t.site == "north")
    batch = torch.arange(64)
    y = torch.tensor(table.labels[:64], dtype=torch.float32)
    stars = {k: star_batch(table, k_similar=k) for k in (0, 5)}
    inputs = (stars[0].feature_index[batch], stars[0].values[batch], stars[0].mask[batch])

    def model(cls, enc):
        mo = cls(len(d.node_ids()), NSFLConfig(value_encoding=enc, linear_shape=a.linear_shape))
        if enc == "piecewise":  # U starts at zero; trained weights are not
            gen = torch.Generator().manual_seed(1)
            with torch.no_grad():
                mo.l1_of_patient.U.weight.normal_(0, 0.1, generator=gen)
                mo.l2_of_patient.U.weight.normal_(0, 0.1, generator=gen)
        return mo

    arms, models = {}, {}
    for code, cls in (("old", old_cls), ("new", NSFLModel)):
        for enc in ("linear", "piecewise"):
            for k in (0, 5):
                mo = model(cls, enc)
                opt = adam(mo.parameters(), lr=1e-3)
                models[(f"nondp_k{k}", code, enc)] = mo

                def step(mo=mo, opt=opt, s=stars[k]):
                    opt.zero_grad(set_to_none=True)
                    bce(mo.forward_neighbourhood(s, batch), y).backward()
                    opt.step()

                arms[(f"nondp_k{k}", code, enc)] = step
            mo = model(cls, enc)
            frozen = set(unused_star_parameters(mo))
            for n, p in mo.named_parameters():
                p.requires_grad_(n not in frozen)
            clipper = per_patient.PerPatientClipper(mo, probe=per_patient.star_probe(mo.n_features,
                                                                                     row_shape=tuple(inputs[0].shape[1:])))
            opt = adam([p for p in mo.parameters() if p.requires_grad], lr=1e-3)
            models[("dp", code, enc)] = (mo, clipper)
            arms[("dp", code, enc)] = (lambda c=clipper, o=opt: per_patient.dp_sgd_step(
                c, o, inputs, labels=y, noise_multiplier=1.0, clip_norm=1.0, expected_batch=64))
    check = {}
    for enc in ("linear", "piecewise"):  # before any step: the same weights on both sides
        for k in (0, 5):
            zs, gs = [], []
            for code in ("old", "new"):
                mo = models[(f"nondp_k{k}", code, enc)]
                z = mo.forward_neighbourhood(stars[k], batch)
                zs.append(z.detach())
                gs.append(torch.autograd.grad(bce(z, y), list(mo.parameters()), allow_unused=True))
            check[f"nondp_k{k}_{enc}"] = {
                "logits": float((zs[0] - zs[1]).abs().max()),
                "gradients": max(float((p - q).abs().max()) for p, q in zip(*gs, strict=True) if p is not None)}
        sums = [models[("dp", code, enc)][1].clipped_sum(*inputs, labels=y, clip_norm=1.0).summed for code in ("old", "new")]
        check[f"dp_{enc}_clipped_sum"] = float((sums[0] - sums[1]).abs().max())
    for fn in arms.values():
        fn()
    load_before = os.getloadavg()
    cpu = {key: [] for key in arms}
    keys = list(arms)
    for r in range(reps):
        random.Random(r).shuffle(keys)
        for key in keys:
            fn, n = arms[key], BLOCK[key[0]]
            fn()  # after another arm: this model's memory back in cache, unmeasured
            c0 = time.thread_time()
            for _ in range(n):
                fn()
            cpu[key].append(1000 * (time.thread_time() - c0) / n)
    rows = []
    for step in BLOCK:
        row = {"step": step}
        for code in ("old", "new"):
            lin, pw = cpu[(step, code, "linear")], cpu[(step, code, "piecewise")]
            row.update({f"cpu_{code}_linear_ms": median(lin), f"cpu_{code}_piecewise_ms": median(pw),
                        f"{code}_piecewise_over_linear": median(pw) / median(lin),
                        f"{code}_piecewise_over_linear_paired": median([p / q for p, q in zip(pw, lin, strict=True)])})
        for enc in ("linear", "piecewise"):
            row[f"{enc}_new_over_old_paired"] = median([n / o for n, o in zip(cpu[(step, "new", enc)], cpu[(step, "old", enc)],
                                                                             strict=True)])
        rows.append(row)
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    emit({"benchmark": "piecewise_ab", "ref": a.ref, "reps": reps, "blocks": BLOCK, "linear_shape": a.linear_shape,
          "statistic": "median thread CPU ms of one step (a block's mean); paired: median of the per-repetition ratios",
          "rows": rows, "max_abs_diff_new_vs_old": check, "machine": machine(),
          "load_average_before_timing": list(load_before), "load_average_after": list(os.getloadavg())},
         out=out_path(__file__, a))


if __name__ == "__main__":
    main()
