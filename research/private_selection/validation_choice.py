"""The production DP setting chosen on VALIDATION only, then tested (issue 30, items 1 and 5).

The wide arms (:mod:`.wide`) met issue 30's AUROC targets, but that configuration was tried after
the study (:mod:`.private_selection`) had shown the default model failing on the same test
splits. This script makes the choice honestly:

1. **The grid** (:data:`GRID`), fixed before any run of it from public reasoning (module
   docstrings of ``sdk/privacy/schedule.py`` and :mod:`.wide`), every entry distributed DP at
   ε = 3 (masked, Skellam shares, q = 1, full-batch FedSGD, h = 2, selection off, σ calibrated to
   ε over the entry's rounds):

   - ``default_preset``: the SDK's DP default model until now (``[model] deep = true``: the GNN
     beside the wide path, hidden 32) with the documented ε = 3 preset (60 rounds, C = 3,
     server lr 1) -- what ``[privacy] mode = "distributed"`` with the preset gave;
   - ``gnn_demo_preset``: the demo's DP model (the GNN at hidden 8, ``sdk/demo/run.py``) with the
     same preset -- what ``clinograph demo`` ran;
   - ``default_dplr``: the default model (deep) at the DP-LR reference's schedule (50 rounds,
     C = 1, server lr 1) -- the schedule without the model change;
   - ``wide``: the wide path alone (``deep = false``) at DP-LR's schedule (the wide arms' setting);
   - ``wide_r25`` / ``wide_r100``: the same over 25 / 100 rounds (fewer rounds: less noise a
     round; more: more steps);
   - ``wide_c3``: the same with the preset's clip C = 3;
   - ``wide_lr3``: the same with server lr 3 (the wide arms' note: at ε = 8 the step, not the
     noise, limited them).

   Each runs on the five tables (``--seeds``: split, initialisation, training seeds 0..n-1; the
   noise is the OS's; the choice compares every entry on the seeds all of them ran,
   :func:`common_seeds`; with ``--halve-after`` the better half by validation AUROC on the
   tables run first goes on to the others, :func:`halve`). The score is each hospital's **validation** AUROC of the final model (its own
   validation patients; the Platt calibration fitted there is monotone, so it does not move the
   AUROC), mean over hospitals, seeds, then tables. :func:`choose` picks the highest: one
   configuration for all tables (a default, not per-table tuning). Test AUROC is recorded for
   every run but never read by :func:`choose`.

2. **The chosen configuration at ε = 1 and 8** (``--confirm``), test AUROC beside the study's
   non-DP default, LR standalone, LR pooled and central DP-LR pooled (results/private_selection.json:
   the same splits).

3. **Held-out tables** (``--held-out rossi``): tables the five-table study never used
   (``sdk/datasets/real_tables.py``), 5 seeds: the chosen configuration at ε = 1, 3, 8 beside the
   non-DP SDK default, LR standalone and pooled and DP-LR pooled, on the same splits.

4. **The demo** (``--demo``): the demo's DP run until now (the GNN at hidden 8 with the ε preset)
   against the chosen entry on the demo's own tables (as ``clinograph demo`` writes them), seeds
   0-2, at the demo's ε = 10.

Writes ``results/validation_choice.json`` after every run. Asserts nothing.

    python -m research.private_selection.validation_choice                    # the grid, five tables, 5 seeds
    python -m research.private_selection.validation_choice --confirm 1,8 --seeds 3   # the choice at ε = 1, 8
    python -m research.private_selection.validation_choice --held-out rossi   # the held-out table
    python -m research.private_selection.validation_choice --markdown
    python -m research.private_selection.validation_choice --quick            # lung, 1 seed, two entries
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, machine, out_path, write  # noqa: E402
from research.private_selection.private_selection import (  # noqa: E402
    DELTA,
    DP_LR,
    distributed_config,
    distributed_dp_config,
    dp_lr_pooled,
    load_cohort,
    mean_auroc,
    run_arm,
    sdk_dp_config,
    stored,
)

FIVE = ("gbsg2", "lung", "kidney", "diabetes", "larynx")
WIDE = {"model": {"deep": False}}
DEEP = {"model": {"deep": True}}
#: the grid, fixed before any of it ran: name -> (schedule: "preset" or (rounds, clip, server lr), model overrides)
GRID: dict[str, tuple] = {
    "default_preset": ("preset", {}),
    "gnn_demo_preset": ("preset", {"model": {"hidden": 8}}),
    "default_dplr": ((50, 1.0, 1.0), DEEP),
    "wide": ((50, 1.0, 1.0), WIDE),
    "wide_r25": ((25, 1.0, 1.0), WIDE),
    "wide_r100": ((100, 1.0, 1.0), WIDE),
    "wide_c3": ((50, 3.0, 1.0), WIDE),
    "wide_lr3": ((50, 1.0, 3.0), WIDE),
}
CHOICE_EPSILON = 3.0


def grid_config(name: str, cohort: str, seed: int, *, epsilon: float, tables, dictionary, work: Path):  # noqa: ANN001
    """The config of grid entry ``name`` at ``epsilon`` (σ calibrated to it over the entry's rounds)."""
    schedule, over = GRID[name]
    if schedule == "preset":
        return distributed_config(cohort, seed, epsilon=epsilon, tables=tables, dictionary=dictionary, work=work,
                                  over=over)
    rounds, clip, lr = schedule
    return distributed_dp_config(cohort, seed, epsilon=epsilon, tables=tables, dictionary=dictionary, work=work,
                                 rounds=rounds, clip=clip, server_lr=lr, over=over)


def run_entry(name: str, cohort: str, seed: int, *, epsilon: float, tables, dictionary) -> dict:  # noqa: ANN001
    """One run of a grid entry: validation and test AUROC (mean over hospitals), σ, ε, time."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = grid_config(name, cohort, seed, epsilon=epsilon, tables=tables, dictionary=dictionary, work=Path(tmp))
        run = run_arm(tables, dictionary, cfg, choose=False)
    out = stored(run) | {"noise_multiplier": cfg.privacy.noise_multiplier, "rounds": cfg.federation.rounds}
    print(f"{cohort} seed {seed} {name} ε {epsilon:g}: validation AUROC {out['validation_auroc']:.3f} "
          f"in {out['seconds']:.0f} s", flush=True)
    return out


def choose(grid: dict[str, dict[str, list[dict]]]) -> dict:
    """The entry with the highest validation AUROC: per table the mean over seeds, then the mean
    over tables (every table weighs the same). Reads ``validation_auroc`` only."""
    scores = {name: float(np.mean([np.nanmean([r["validation_auroc"] for r in runs]) for runs in by_cohort.values()]))
              for name, by_cohort in grid.items()}
    return {"chosen": max(scores, key=scores.__getitem__), "validation_auroc": scores,
            "rule": "highest mean validation AUROC (mean over hospitals, seeds, then tables) at ε = 3"}


def halve(grid: dict, cohorts: list[str]) -> dict:
    """Successive halving on validation (as the SDK's candidate choice does): the better half of
    the entries by mean validation AUROC over ``cohorts`` (each on the seeds all entries ran there)
    go on to the other tables; the rest stop there."""
    n = {c: min(len(grid[k][c]) for k in grid) for c in cohorts}
    scores = {k: float(np.mean([np.nanmean([r["validation_auroc"] for r in v[c][:n[c]]]) for c in cohorts]))
              for k, v in grid.items()}
    ranked = sorted(scores, key=scores.__getitem__, reverse=True)
    return {"after": cohorts, "validation_auroc": scores, "kept": ranked[:(len(ranked) + 1) // 2]}


def baselines_for(cohort: str, seed: int, tables, *, epsilons) -> dict:  # noqa: ANN001
    """The references on this seed's splits: LR standalone / pooled / FedAvg and DP-LR pooled."""
    from research.model_quality import baselines, splits_for

    splits = splits_for(tables, sdk_dp_config(cohort, seed, epsilon=None, selection=True, work=Path(".")))
    base = baselines(tables, splits, seed=seed)
    base |= {f"dp_lr_pooled_eps{e:g}": dp_lr_pooled(tables, splits, epsilon=e, seed=seed) for e in epsilons}
    return {k: mean_auroc(v) for k, v in base.items()}


def held_out_seed(cohort: str, seed: int, chosen: str, *, epsilons, tables, dictionary) -> dict:  # noqa: ANN001
    """A held-out table, one seed: the non-DP SDK default, the chosen entry at each ε, the references."""
    with tempfile.TemporaryDirectory() as tmp:
        ref = run_arm(tables, dictionary, sdk_dp_config(cohort, seed, epsilon=None, selection=True,
                                                        work=Path(tmp)), choose=True)
    print(f"{cohort} seed {seed} reference: test AUROC {mean_auroc(ref['final']):.3f}", flush=True)
    arms = {"reference": stored(ref)}
    for e in epsilons:
        arms[f"{chosen}_eps{e:g}"] = run_entry(chosen, cohort, seed, epsilon=e, tables=tables, dictionary=dictionary)
    return {"arms": arms, "baselines": baselines_for(cohort, seed, tables, epsilons=epsilons)}


#: the demo's DP run until issue 30's choice: the GNN at hidden 8 with the ε preset (sdk/demo/run.py before)
DEMO_PRESET = ("preset", {"model": {"deep": True, "hidden": 8}})
DEMO_EPSILONS = (10.0,)  # the demo's own ε (clinograph demo --dp-epsilon default)


def demo_config(entry: tuple, seed: int, *, epsilon: float, tables, dictionary, work: Path):  # noqa: ANN001
    """The demo's distributed-DP federation (``sdk/demo/run.py``: its id, split, seed, h) with the
    schedule and model of ``entry`` (a :data:`GRID` value or :data:`DEMO_PRESET`), σ calibrated
    to ``epsilon`` as ``clinograph demo`` calibrates it."""
    from clinograph.sdk.config import merge_sections
    from clinograph.sdk.demo.run import demo_distributed_config, distributed_sigma
    from clinograph.sdk.privacy.schedule import distributed_schedule

    schedule, over = entry
    rounds, clip, lr = ((p := distributed_schedule(epsilon)).rounds, p.clip_norm, p.server_lr) \
        if schedule == "preset" else schedule
    base = demo_distributed_config(rounds=rounds, seed=seed, epsilon=epsilon)
    cfg = type(base).model_validate(merge_sections(base.model_dump(mode="python", by_alias=True, exclude_unset=True),
                                                   merge_sections(over, {
        "federation": {"server_lr": lr}, "output": str(work / "out"),
        "privacy": {"clip_norm": clip, "state_dir": str(work / "state")}})))
    sigma = distributed_sigma(cfg, dictionary=dictionary, n_hospitals=len(tables), epsilon=epsilon)
    return cfg.model_copy(update={"privacy": cfg.privacy.model_copy(update={"noise_multiplier": sigma})})


def demo_seed(seed: int, chosen: str, *, epsilons) -> dict:  # noqa: ANN001
    """The demo's tables for ``seed`` (as ``clinograph demo`` writes them): its DP run until now
    (:data:`DEMO_PRESET`) and the chosen entry, at each ε; test and validation AUROC."""
    from research.demo_quality.demo_quality import demo_tables

    dictionary, tables = demo_tables(seed, 1.0)
    out = {}
    for e in epsilons:
        for name, entry in (("demo_preset", DEMO_PRESET), (chosen, GRID[chosen])):
            with tempfile.TemporaryDirectory() as tmp:
                cfg = demo_config(entry, seed, epsilon=e, tables=tables, dictionary=dictionary, work=Path(tmp))
                run = stored(run_arm(tables, dictionary, cfg, choose=False))
            out[f"{name}_eps{e:g}"] = run | {"noise_multiplier": cfg.privacy.noise_multiplier,
                                             "rounds": cfg.federation.rounds}
            print(f"demo seed {seed} {name} ε {e:g}: test AUROC {run['auroc']:.3f} validation "
                  f"{run['validation_auroc']:.3f} in {run['seconds']:.0f} s", flush=True)
    return out


def _mean_sd(xs: list[float]) -> dict:
    return {"mean": float(np.nanmean(xs)), "sd": float(np.nanstd(xs)), "per_seed": xs}


def summarise_grid(grid: dict) -> dict:
    """Per entry and cohort: validation and test AUROC (mean, sd, per seed); means over cohorts."""
    out = {}
    for name, by_cohort in grid.items():
        row = {c: {"validation": _mean_sd([r["validation_auroc"] for r in runs]),
                   "test": _mean_sd([r["auroc"] for r in runs]),
                   "noise_multiplier": [r["noise_multiplier"] for r in runs]} for c, runs in by_cohort.items()}
        out[name] = {"per_cohort": row,
                     "validation_mean": float(np.mean([v["validation"]["mean"] for v in row.values()])),
                     "test_mean": float(np.mean([v["test"]["mean"] for v in row.values()]))}
    return out


def markdown(payload: dict, study: dict) -> str:
    """The README's tables: the grid's validation AUROC (the choice) and, after it, test AUROC;
    the chosen entry at ε = 1, 3, 8 beside the study's references; the held-out tables."""
    f = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    grid = payload["grid"]  # each table on the seeds every entry that ran there ran (as the choice)
    n = {c: min(len(v[c]) for v in grid.values() if c in v) for c in FIVE}
    summ = summarise_grid({k: {c: runs[:n[c]] for c, runs in v.items()} for k, v in grid.items()})
    cohorts = list(FIVE)
    val = lambda s, c: s["per_cohort"][c]["validation"]["mean"] if c in s["per_cohort"] else None  # noqa: E731
    lines = ["| entry (ε = 3) | " + " | ".join(cohorts) + " | **validation mean** | test mean (read after) |",
             "|---|" + "---|" * (len(cohorts) + 2)]
    for name, s in sorted(summ.items(), key=lambda kv: (-len(kv[1]["per_cohort"]), -kv[1]["validation_mean"])):
        part = "" if len(s["per_cohort"]) == len(cohorts) else f" ({len(s['per_cohort'])} tables: stopped by halving)"
        lines.append(f"| {name} | " + " | ".join("-" if val(s, c) is None else f(val(s, c)) for c in cohorts)
                     + f" | **{f(s['validation_mean'])}**{part} | {f(s['test_mean'])} |")
    chosen = payload["choice"]["chosen"]
    conf = {f"{CHOICE_EPSILON:g}": payload["grid"][chosen], **payload.get("confirm", {})}
    seeds = {c: min(len(v[c]) for v in conf.values()) for c in cohorts}  # every row on the same seeds
    ref = lambda k, c: float(np.mean(study["cohorts"][c]["summary"][k]["auroc_per_seed"][:seeds[c]]))  # noqa: E731
    lines += ["", "| test AUROC (seeds) | " + " | ".join(f"{c} ({seeds[c]})" for c in cohorts) + " | **mean** |",
              "|---|" + "---|" * (len(cohorts) + 1)]
    for e in sorted(conf, key=float):
        vals = [float(np.mean([r["auroc"] for r in conf[e][c][:seeds[c]]])) for c in cohorts]
        lines.append(f"| {chosen}, ε = {e} | " + " | ".join(f(v) for v in vals) + f" | **{f(np.mean(vals))}** |")
    for k in ("reference", "lr_standalone", "lr_pooled", "dp_lr_pooled_eps1", "dp_lr_pooled_eps3",
              "dp_lr_pooled_eps8", "distributed_eps3"):
        vals = [ref(k, c) for c in cohorts]
        lines.append(f"| {k} (study) | " + " | ".join(f(v) for v in vals) + f" | **{f(np.mean(vals))}** |")
    if payload.get("demo"):
        runs = payload["demo"]["per_seed"]
        lines += ["", f"| demo DP run ({len(runs)} seeds) | test AUROC mean ± sd | validation AUROC | σ | rounds |",
                  "|---|---|---|---|---|"]
        for k in runs[0]:
            t, v = [r[k]["auroc"] for r in runs], [r[k]["validation_auroc"] for r in runs]
            lines.append(f"| {k} | {np.mean(t):.3f} ± {np.std(t):.3f} | {np.mean(v):.3f} | "
                         f"{runs[0][k]['noise_multiplier']:.2f} | {runs[0][k]['rounds']} |")
    for c, r in payload.get("held_out", {}).items():
        lines += ["", f"| {c} ({len(r['per_seed'])} seeds) | test AUROC mean ± sd |", "|---|---|"]
        keys = list(r["per_seed"][0]["arms"]) + list(r["per_seed"][0]["baselines"])
        for k in keys:
            xs = [s["arms"][k]["auroc"] if k in s["arms"] else s["baselines"][k] for s in r["per_seed"]]
            lines.append(f"| {k} | {np.mean(xs):.3f} ± {np.std(xs):.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cohorts", default=",".join(FIVE))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--entries", default=",".join(GRID), help="grid entries to run (comma-separated)")
    ap.add_argument("--halve-after", default="", help="cohorts already run: only the better half of the entries "
                    "by validation AUROC there runs on --cohorts (halve)")
    ap.add_argument("--confirm", default="", help="run the chosen entry at these ε on the cohorts (e.g. 1,8; "
                    "seeds already run are kept; ε = 3 starts from the grid's runs)")
    ap.add_argument("--held-out", default="", help="held-out cohorts: the chosen entry at ε = 1, 3, 8 and the "
                    "references (comma-separated)")
    ap.add_argument("--demo", action="store_true", help="the demo's DP run (its preset until now) against the "
                    "chosen entry, seeds 0-2, ε = 10 (the demo's)")
    add_convention(ap, quick_help="lung, 1 seed, two entries")
    ap.add_argument("--markdown", action="store_true", help="print the README's tables of the result file and exit")
    a = ap.parse_args()
    out = out_path(__file__, a)
    if a.markdown:
        print(markdown(json.loads(out.read_text()), json.loads((out.parent / "private_selection.json").read_text())))
        return
    if a.quick:
        a.cohorts, a.seeds, a.entries = "lung", 1, "wide_r25,default_dplr"
    old = json.loads(out.read_text()) if out.exists() and not a.quick else {}
    payload = {**old, "machine": machine(), "delta": DELTA, "dp_lr": DP_LR, "choice_epsilon": CHOICE_EPSILON,
               "grid_entries": {k: {"schedule": v[0], "overrides": v[1]} for k, v in GRID.items()},
               "grid": dict(old.get("grid", {}))}
    cohorts = [x for x in a.cohorts.split(",") if x]
    if a.confirm or a.held_out or a.demo:
        chosen = payload["choice"]["chosen"]  # made by the grid run, on validation
        if a.confirm:  # ε = 3's first seeds are the grid's own runs of the chosen entry
            conf = payload.setdefault("confirm", {})
            conf.setdefault(f"{CHOICE_EPSILON:g}", {c: list(r) for c, r in payload["grid"][chosen].items()})
            for e in (float(x) for x in a.confirm.split(",")):
                for cohort in cohorts:
                    c, tables = load_cohort(cohort)
                    runs = conf.setdefault(f"{e:g}", {}).setdefault(cohort, [])
                    for s in range(len(runs), a.seeds):
                        runs.append(run_entry(chosen, cohort, s, epsilon=e, tables=tables, dictionary=c.dictionary))
                        write(out, payload)
        if a.demo:
            payload["demo"] = {"per_seed": []}
            for s in range(3):
                payload["demo"]["per_seed"].append(demo_seed(s, chosen, epsilons=DEMO_EPSILONS))
                write(out, payload)
        for cohort in (x for x in a.held_out.split(",") if x):
            c, tables = load_cohort(cohort)
            payload.setdefault("held_out", {})[cohort] = {"hospitals": {t.site: t.n_patients for t in tables},
                                                          "per_seed": []}
            for s in range(a.seeds):
                payload["held_out"][cohort]["per_seed"].append(
                    held_out_seed(cohort, s, chosen, epsilons=(1.0, 3.0, 8.0), tables=tables,
                                  dictionary=c.dictionary))
                write(out, payload)
        return
    entries = [x for x in a.entries.split(",") if x]
    if a.halve_after:
        payload["halving"] = halve(payload["grid"], a.halve_after.split(","))
        entries = [x for x in entries if x in payload["halving"]["kept"]]
        print("kept after halving on validation:", json.dumps(payload["halving"]), flush=True)
    for cohort in cohorts:
        c, tables = load_cohort(cohort)
        for name in entries:
            runs = payload["grid"].setdefault(name, {}).setdefault(cohort, [])  # runs[s]: seed s
            for s in range(len(runs), a.seeds):  # seeds already run are kept
                runs.append(run_entry(name, cohort, s, epsilon=CHOICE_EPSILON, tables=tables, dictionary=c.dictionary))
                write(out, payload)
    finished = {k: v for k, v in payload["grid"].items() if set(FIVE) <= set(v)}
    if finished and set(finished) >= set(payload.get("halving", {}).get("kept", payload["grid"])):
        payload["choice"] = choose(common_seeds(finished))
        print("chosen on validation:", json.dumps(payload["choice"]), flush=True)
    write(out, payload)


def common_seeds(grid: dict) -> dict:
    """The grid on the five tables, each table cut to the seeds every entry ran there (0..n-1)."""
    n = {c: min(len(grid[k][c]) for k in grid) for c in FIVE}
    return {k: {c: v[c][:n[c]] for c in FIVE} for k, v in grid.items()}


if __name__ == "__main__":
    main()
