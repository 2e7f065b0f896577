"""The production DP setting WITH private selection, measured (issue 30, session 53).

The SDK's DP default chosen on validation (:mod:`.validation_choice`: ``wide_r25``, the wide path
alone, 25 full-batch rounds, C = 1, server lr 1, distributed DP, h = 2) runs with selection off.
Issue 30 asks for the production setting *with* private selection. This arm, ``wide_r25_sel``,
is that same configuration with ``[selection] enabled = true``: the federated validation loss
rides in every round's noisy sum (two more coordinates, ``metric/validation``,
sdk/privacy/distributed_trainer.py); the kept round and early stopping (patience 5, the SDK's
default) read it; a run ends with one evaluation-only scoring round; σ is calibrated to ε over
:func:`clinograph.sdk.federation.candidates.distributed_rounds` (25 training rounds + 2).

Per cell (table, seed, ε) it runs the arm and, in the same process right before or after it
(alternating), the selection-off arm again (``wide_r25``): a fresh sample of the comparison under
the same machine load (their seconds are the cost), beside the stored runs of
results/validation_choice.json and the study's references (results/private_selection.json: the
same splits and seeds). Per run: test and validation AUROC, the kept round, rounds run, the
released validation losses, σ, seconds, and from every hospital's signed ledger entries in the
audit trail the ε after the last training round, after the scoring round (composed) and the
entries' count. Order: ε = 3 on every table and seed first, then ε = 1, then ε = 8; the result
file is written after every cell and a cell already in it is not run again. Nothing is tuned;
nothing reads test but the tables. Asserts nothing.

    python -m research.private_selection.production_selection                 # ε = 3, 1, 8; five tables; seeds 0-4
    python -m research.private_selection.production_selection --check-splits gbsg2:0   # a stored cell, re-run
    python -m research.private_selection.production_selection --variant wide_r25_sel_nostop   # diagnostics (VARIANTS)
    python -m research.private_selection.production_selection --cohorts rossi --epsilons 3 --out production_selection_rossi
    python -m research.private_selection.production_selection --markdown
    python -m research.private_selection.production_selection --quick         # lung, seed 0, ε = 3

Session 54: ``--arm wide_r25_selz --out production_selection_z`` runs the same two arms under the
noise-aware selection rule (secure/runtime/selection.py: a released loss is worse only beyond
z = 2 of its known noise std; the kept round is the latest not worse). The configuration is
``wide_r25_sel``'s unchanged (the rule is the SDK's now); only the name the runs are stored under
differs, so session 53's runs (the rule of old) stay in results/production_selection.json.

    python -m research.private_selection.production_selection --arm wide_r25_selz --out production_selection_z
    python -m research.private_selection.production_selection --arm wide_r25_selz --out production_selection_z --markdown
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, machine, median, out_path, write  # noqa: E402
from research.private_selection.private_selection import (  # noqa: E402
    DELTA,
    distributed_dp_config,
    load_cohort,
    run_arm,
    sdk_dp_config,
    stored,
)
from research.private_selection.validation_choice import FIVE, GRID  # noqa: E402

ARM, OFF = "wide_r25_sel", "wide_r25"
#: session 54: the same configuration as ARM under the noise-aware selection rule
#: (secure/runtime/selection.py, ``selection_step``; no config changes: the rule is the SDK's now),
#: run with ``--arm wide_r25_selz --out production_selection_z`` so session 53's stored runs stay apart
NOISE_AWARE = "wide_r25_selz"
EPSILON_ORDER = (3.0, 1.0, 8.0)
SEEDS = 5


#: diagnostic arms at ε = 3 (``--variant``), each with selection on and the same schedule, run after
#: the main arms and reported apart (not candidates for a choice: test is read):
#: name -> (config overrides in place of the wide path's, whether the candidates run)
VARIANTS: dict[str, tuple[dict, bool]] = {
    # the kept round by the released loss, no early stopping (patience = the rounds): which of
    # the two uses of the loss costs
    "wide_r25_sel_nostop": ({"model": {"deep": False}, "selection": {"patience": 25}}, False),
    # what `[selection] enabled = true` gives when `[model] deep` is left out (the README's TOML
    # says it may be): dp_default_model no longer applies, so the SDK's four default candidates
    # (the GNN in two) are chosen among by the released loss (successive halving)
    "default_sel": ({}, True),
}


def arm_config(cohort: str, seed: int, *, epsilon: float, selection: bool, tables, dictionary, work: Path,  # noqa: ANN001
               variant: str | None = None):
    """``wide_r25`` (:data:`.validation_choice.GRID`) at ``epsilon``, with ``[selection] enabled``
    set to ``selection`` (σ calibrated over the rounds the promise covers); ``variant``: a
    :data:`VARIANTS` entry's overrides in place of the wide path's."""
    (rounds, clip, lr), over = GRID[OFF]
    if variant is not None:
        over = VARIANTS[variant][0]
    return distributed_dp_config(cohort, seed, epsilon=epsilon, tables=tables, dictionary=dictionary, work=work,
                                 rounds=rounds, clip=clip, server_lr=lr, over=over, selection=selection)


def epsilon_parts(ledger: dict, *, rounds_run: int) -> dict:
    """From each hospital's ledger entries by round: ε after the last training round (round
    ``rounds_run`` - 1), ε composed (the last entry: with selection the scoring round, round
    ``rounds_run``), the entries' count; means over hospitals and whether every hospital has the
    scoring round accounted (``rounds_run`` + 1 entries) or not (``rounds_run``)."""
    training, composed, entries = [], [], []
    for v in ledger.values():
        by_round = dict((int(r), e) for r, e in v["epsilon_by_round"])
        training.append(by_round.get(rounds_run - 1))
        composed.append(v["epsilon_by_round"][-1][1])
        entries.append(len(v["epsilon_by_round"]))
    return {"epsilon_training": float(np.mean(training)) if None not in training else None,
            "epsilon_composed": float(np.mean(composed)), "epsilon_composed_max": float(max(composed)),
            "ledger_entries": entries}


def run_one(cohort: str, seed: int, *, epsilon: float, selection: bool, tables, dictionary,  # noqa: ANN001
            variant: str | None = None) -> dict:
    from clinograph.sdk.federation.candidates import distributed_rounds

    with tempfile.TemporaryDirectory() as tmp:
        cfg = arm_config(cohort, seed, epsilon=epsilon, selection=selection, tables=tables, dictionary=dictionary,
                         work=Path(tmp), variant=variant)
        run = run_arm(tables, dictionary, cfg, choose=variant is not None and VARIANTS[variant][1])
    out = stored(run) | {"noise_multiplier": cfg.privacy.noise_multiplier, "rounds": cfg.federation.rounds,
                         "accounted_rounds": distributed_rounds(cfg), "selection": selection,
                         "min_honest": cfg.privacy.min_honest, "hospitals": len(tables)}
    out["epsilon_parts"] = epsilon_parts(run["ledger"], rounds_run=run["rounds_run"])
    name = variant or (ARM if selection else OFF)
    print(f"{cohort} seed {seed} ε {epsilon:g} {name}: test AUROC {out['auroc']:.3f}, rounds run {out['rounds_run']}, "
          f"kept {out['selected_round']}{'' if out['chosen'] is None else ' of ' + out['chosen']}, "
          f"ε {out['epsilon_parts']['epsilon_composed']:.3f}, {out['seconds']:.1f} s",
          flush=True)
    return out


def validation_patients(cohort: str, seed: int, tables) -> int:  # noqa: ANN001
    """Σ_k n_val,k of this seed's split (the splits every arm of the study uses)."""
    from research.model_quality import splits_for

    return int(sum(len(s.validation) for s in splits_for(
        tables, sdk_dp_config(cohort, seed, epsilon=None, selection=True, work=Path(".")))))


def run_cell(cohort: str, seed: int, *, epsilon: float, tables, dictionary) -> dict:  # noqa: ANN001
    """Both arms on one (table, seed, ε), in alternating order (even seeds: selection first)."""
    order = (True, False) if seed % 2 == 0 else (False, True)
    runs = {(ARM if s else OFF): run_one(cohort, seed, epsilon=epsilon, selection=s, tables=tables,
                                         dictionary=dictionary) for s in order}
    return runs | {"validation_patients": validation_patients(cohort, seed, tables)}


def check_splits(cell: str, study: dict, choice: dict) -> dict:
    """Re-run a stored cell (``table:seed``): LR standalone (deterministic given the split) against
    results/private_selection.json, and the selection-off arm at ε = 3 (σ deterministic, AUROC
    within DP noise) against results/validation_choice.json."""
    from research.private_selection.validation_choice import baselines_for

    cohort, seed = cell.split(":")
    seed = int(seed)
    c, tables = load_cohort(cohort)
    base = baselines_for(cohort, seed, tables, epsilons=())
    off = run_one(cohort, seed, epsilon=3.0, selection=False, tables=tables, dictionary=c.dictionary)
    old = choice["confirm"]["3"][cohort][seed]
    return {"cell": cell,
            "lr_standalone": {"rerun": base["lr_standalone"],
                              "stored": study["cohorts"][cohort]["summary"]["lr_standalone"]["auroc_per_seed"][seed]},
            "lr_pooled": {"rerun": base["lr_pooled"],
                          "stored": study["cohorts"][cohort]["summary"]["lr_pooled"]["auroc_per_seed"][seed]},
            "wide_r25_eps3": {"rerun_auroc": off["auroc"], "stored_auroc": old["auroc"],
                              "rerun_sigma": off["noise_multiplier"], "stored_sigma": old["noise_multiplier"]}}


# -- summaries ----------------------------------------------------------------------------------

def _ms(xs: list[float]) -> tuple[float, float]:
    return float(np.mean(xs)), float(np.std(xs))


def released_loss_noise(run: dict, n_val: int) -> dict:
    """The std the noisy sum puts on the released mean loss (B = 1), predicted to first order, and
    what the run released. The loss is the ratio of two noisy sums, (a·Σ ℓ̃ + e₁) / (a·n + e₂)
    with a = C/√2 and e₁, e₂ ~ N(0, s²), s = σ·C·√(K/h) (each of the K hospitals adds 1/h of the
    variance): std ≈ s·√(1 + ℓ²)/(a·n) = σ·√2·√(K/h)·√(1 + ℓ²)/Σ n_val, ℓ the loss (here the median
    of the released ones, clipped to [0, 1]); ``predicted_std_numerator`` leaves the denominator's
    noise out (ℓ = 0). Measured: the std of the run's released losses over rounds 1.. (the model
    changes little between rounds next to this noise) and a robust version (IQR / 1.349)."""
    losses = [x for x in run.get("validation_losses", [])[1:] if x is not None and math.isfinite(x)]
    k, h = run["hospitals"], run["min_honest"]
    first = run["noise_multiplier"] * math.sqrt(2.0) * math.sqrt(k / h) / n_val
    ell = float(np.clip(np.median(losses), 0.0, 1.0)) if losses else 0.0
    q1, q3 = (np.percentile(losses, [25, 75]) if len(losses) > 1 else (np.nan, np.nan))
    return {"predicted_std_numerator": first, "predicted_std": first * math.sqrt(1.0 + ell**2),
            "measured_std": float(np.std(losses)) if len(losses) > 1 else None,
            "measured_robust_std": float((q3 - q1) / 1.349) if len(losses) > 1 else None}


def summarise(payload: dict, study: dict, choice: dict) -> dict:
    """Per ε and table: both arms (mean, sd, per seed), the stored selection-off arm, rounds run,
    kept round, stopped early, ε parts, seconds, released-loss noise; the five-table means and
    issue 30's targets (on the seeds every row has)."""
    out: dict = {}
    ref = {k: {c: study["cohorts"][c]["summary"][k]["auroc_per_seed"] for c in FIVE}
           for k in ("reference", "lr_standalone", "lr_pooled", "dp_lr_pooled_eps1", "dp_lr_pooled_eps3",
                     "dp_lr_pooled_eps8")}
    for e, by_cohort in payload.get("runs", {}).items():
        rows: dict = {}
        for c, cells in by_cohort.items():
            if c not in FIVE:  # a held-out table (--cohorts rossi): no stored study arms to set beside it
                continue
            seeds = sorted(int(s) for s in cells)
            cell = [cells[str(s)] for s in seeds]
            sel, off = [x[ARM] for x in cell], [x[OFF] for x in cell]
            stored_off = [choice["confirm"][e][c][s]["auroc"] for s in seeds]
            noise = [released_loss_noise(x[ARM], x["validation_patients"]) for x in cell]
            rows[c] = {"seeds": seeds,
                       ARM: _ms([r["auroc"] for r in sel]), f"{OFF}_rerun": _ms([r["auroc"] for r in off]),
                       f"{OFF}_stored": _ms(stored_off),
                       "per_seed": {ARM: [r["auroc"] for r in sel], f"{OFF}_rerun": [r["auroc"] for r in off],
                                    f"{OFF}_stored": stored_off},
                       "validation_auroc": {ARM: _ms([r["validation_auroc"] for r in sel]),
                                            f"{OFF}_rerun": _ms([r["validation_auroc"] for r in off])},
                       "references": {k: _ms([v[c][s] for s in seeds]) for k, v in ref.items()},
                       "rounds_run": [r["rounds_run"] for r in sel], "kept_round": [r["selected_round"] for r in sel],
                       "sigma": {ARM: sel[0]["noise_multiplier"], OFF: off[0]["noise_multiplier"]},
                       "accounted_rounds": {ARM: sel[0]["accounted_rounds"], OFF: off[0]["accounted_rounds"]},
                       "epsilon": {k: {p: float(np.mean([r["epsilon_parts"][p] for r in runs]))
                                       for p in ("epsilon_training", "epsilon_composed", "epsilon_composed_max")}
                                   for k, runs in ((ARM, sel), (OFF, off))},
                       "scoring_round_accounted": all(
                           n == r["rounds_run"] + 1 for r in sel for n in r["epsilon_parts"]["ledger_entries"]),
                       "off_entries_equal_rounds": all(
                           n == r["rounds_run"] for r in off for n in r["epsilon_parts"]["ledger_entries"]),
                       "seconds": {ARM: _ms([r["seconds"] for r in sel]), OFF: _ms([r["seconds"] for r in off])},
                       "round_seconds_median": {ARM: median([x for r in sel for x in r["round_seconds"]]),
                                                OFF: median([x for r in off for x in r["round_seconds"]])},
                       "validation_patients": cell[0]["validation_patients"],
                       "released_loss_std": {k: float(np.nanmean([n[k] for n in noise if n[k] is not None]))
                                             for k in ("predicted_std_numerator", "predicted_std", "measured_std",
                                                       "measured_robust_std")}}
        done = [c for c in FIVE if c in rows]
        if not done:
            continue
        mean = {k: float(np.mean([rows[c][k][0] for c in done])) for k in (ARM, f"{OFF}_rerun", f"{OFF}_stored")}
        mean |= {k: float(np.mean([rows[c]["references"][k][0] for c in done])) for k in ref}
        # the sd over seeds of the five-table mean (seeds every table ran)
        n = min(len(rows[c]["seeds"]) for c in done)
        sd = {k: float(np.std([np.mean([rows[c]["per_seed"][k][i] for c in done]) for i in range(n)]))
              for k in (ARM, f"{OFF}_rerun", f"{OFF}_stored")}
        # per seed, the five-table mean of selection on minus off (the same splits and seeds): mean, sd, s.e.
        paired = {}
        for k in (f"{OFF}_rerun", f"{OFF}_stored"):
            d = [float(np.mean([rows[c]["per_seed"][ARM][i] - rows[c]["per_seed"][k][i] for c in done])) for i in range(n)]
            paired[k] = {"mean": float(np.mean(d)), "sd": float(np.std(d, ddof=1)) if n > 1 else None,
                         "se": float(np.std(d, ddof=1) / math.sqrt(n)) if n > 1 else None, "per_seed": d}
        tol = 0.03 if float(e) >= 3 else 0.06
        targets = {"within": tol, "gap_to_reference": mean[ARM] - mean["reference"],
                   "within_met": mean[ARM] >= mean["reference"] - tol,
                   "not_below_lr_standalone": mean[ARM] >= mean["lr_standalone"]}
        out[e] = {"tables": done, "per_table": rows, "mean": mean, "sd_of_mean_over_seeds": sd, "targets": targets,
                  "paired_difference": paired}
    return out


def markdown(payload: dict, study: dict, choice: dict) -> str:
    """The README's tables from the result file."""
    summ = summarise(payload, study, choice)
    lines = []
    for e in sorted(summ, key=lambda x: EPSILON_ORDER.index(float(x))):
        s = summ[e]
        cols = s["tables"]
        pt = s["per_table"]
        lines += [f"**ε = {e}** (test AUROC, mean over hospitals, mean ± sd over seeds "
                  f"{'/'.join(str(len(pt[c]['seeds'])) for c in cols)})", "",
                  "| arm | " + " | ".join(cols) + " | **mean** |", "|---|" + "---|" * (len(cols) + 1)]
        for k, label in ((ARM, f"**{ARM}** (selection on)"), (f"{OFF}_rerun", f"{OFF} (selection off, re-run beside it)"),
                         (f"{OFF}_stored", f"{OFF} (selection off, stored)")):
            lines.append(f"| {label} | " + " | ".join(f"{pt[c][k][0]:.3f} ± {pt[c][k][1]:.3f}" for c in cols)
                         + f" | **{s['mean'][k]:.3f}** |")
        for k in ("reference", "lr_standalone", "lr_pooled", f"dp_lr_pooled_eps{e}"):
            lines.append(f"| {k} (study) | " + " | ".join(f"{pt[c]['references'][k][0]:.3f} ± "
                                                           f"{pt[c]['references'][k][1]:.3f}" for c in cols)
                         + f" | **{s['mean'][k]:.3f}** |")
        t = s["targets"]
        lines += ["", "sd over seeds of the five-table mean: " + ", ".join(
            f"{k} {v:.3f}" for k, v in s["sd_of_mean_over_seeds"].items()),
                  "Selection on minus off, per seed the five-table mean (mean ± s.e. over seeds): " + ", ".join(
                      f"against {k} {v['mean']:+.3f} ± {v['se']:.3f}" for k, v in s["paired_difference"].items()),
                  f"Target: within {t['within']} of the non-DP default {s['mean']['reference']:.3f}: "
                  f"{s['mean'][ARM]:.3f} ({t['gap_to_reference']:+.3f}) -- {'met' if t['within_met'] else 'not met'}"
                  + (f"; not below LR standalone {s['mean']['lr_standalone']:.3f}: "
                     f"{'met' if t['not_below_lr_standalone'] else 'not met'}" if float(e) >= 3 else ""), "",
                  "| table | rounds run (sel) | kept round (sel) | σ sel / off | accounted rounds sel / off | "
                  "ε training (sel) | ε composed sel / off | scoring round in ledger | seconds sel / off | "
                  "round s sel / off | validation patients | released-loss std predicted / measured / robust |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in cols:
            r = pt[c]
            ep, ls = r["epsilon"], r["released_loss_std"]
            lines.append(
                f"| {c} | {','.join(map(str, r['rounds_run']))} | {','.join(map(str, r['kept_round']))} | "
                f"{r['sigma'][ARM]:.2f} / {r['sigma'][OFF]:.2f} | {r['accounted_rounds'][ARM]} / "
                f"{r['accounted_rounds'][OFF]} | {ep[ARM]['epsilon_training']:.3f} | {ep[ARM]['epsilon_composed']:.3f} / "
                f"{ep[OFF]['epsilon_composed']:.3f} | {'yes' if r['scoring_round_accounted'] else 'NO'} | "
                f"{r['seconds'][ARM][0]:.1f} / {r['seconds'][OFF][0]:.1f} | {r['round_seconds_median'][ARM]:.3f} / "
                f"{r['round_seconds_median'][OFF]:.3f} | {r['validation_patients']} | {ls['predicted_std']:.2f} / "
                f"{ls['measured_std']:.2f} / {ls['measured_robust_std']:.2f} |")
        lines.append("")
    for name, by_eps in payload.get("variants", {}).items():
        for e, by_cohort in by_eps.items():
            cols = [c for c in FIVE if c in by_cohort]
            cells = {c: [by_cohort[c][k] for k in sorted(by_cohort[c], key=int)] for c in cols}
            ms = {c: _ms([r["auroc"] for r in cells[c]]) for c in cols}
            on = {c: summ[e]["per_table"][c][ARM][0] for c in cols} if e in summ else {}
            lines += [f"**{name}, ε = {e}** (diagnostic; seeds {'/'.join(str(len(cells[c])) for c in cols)})", "",
                      "| | " + " | ".join(cols) + " | **mean** |", "|---|" + "---|" * (len(cols) + 1),
                      f"| {name} | " + " | ".join(f"{ms[c][0]:.3f} ± {ms[c][1]:.3f}" for c in cols)
                      + f" | **{np.mean([ms[c][0] for c in cols]):.3f}** |"]
            if on:
                lines.append(f"| {ARM} (same seeds? {'yes' if all(len(cells[c]) == len(summ[e]['per_table'][c]['seeds']) for c in cols) else 'no'}) | "
                             + " | ".join(f"{on[c]:.3f}" for c in cols) + f" | **{np.mean(list(on.values())):.3f}** |")
            lines += ["| rounds run | " + " | ".join(",".join(str(r["rounds_run"]) for r in cells[c]) for c in cols) + " | |",
                      "| kept round | " + " | ".join(",".join(str(r["selected_round"]) for r in cells[c]) for c in cols) + " | |",
                      "| chosen | " + " | ".join(",".join(str(r["chosen"]) for r in cells[c]) for c in cols) + " | |",
                      "| σ | " + " | ".join(f"{cells[c][0]['noise_multiplier']:.2f}" for c in cols) + " | |",
                      "| ε composed | " + " | ".join(f"{np.mean([r['epsilon_parts']['epsilon_composed'] for r in cells[c]]):.3f}" for c in cols) + " | |",
                      "| seconds | " + " | ".join(f"{np.mean([r['seconds'] for r in cells[c]]):.1f}" for c in cols) + " | |", ""]
    return "\n".join(lines)


def main() -> None:
    global ARM  # noqa: PLW0603 - the arm's name in the result file and its tables
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cohorts", default=",".join(FIVE))
    ap.add_argument("--seeds", type=int, default=SEEDS)
    ap.add_argument("--epsilons", default=",".join(f"{e:g}" for e in EPSILON_ORDER), help="in the order run")
    add_convention(ap, quick_help="lung, seed 0, ε = 3")
    ap.add_argument("--check-splits", default="", metavar="TABLE:SEED", help="re-run a stored cell and compare")
    ap.add_argument("--markdown", action="store_true", help="print the README's tables of the result file and exit")
    ap.add_argument("--arm", choices=(ARM, NOISE_AWARE), default=ARM,
                    help="the name the selection-on runs are stored under (wide_r25_selz: session 54's rule)")
    ap.add_argument("--variant", choices=sorted(VARIANTS), default=None,
                    help="run a diagnostic arm (selection on) instead, ε = 3 unless --epsilons is given")
    a = ap.parse_args()
    ARM = a.arm
    out = out_path(__file__, a)
    res = out.parent
    study = json.loads((res / "private_selection.json").read_text())
    choice = json.loads((res / "validation_choice.json").read_text())
    if a.markdown:
        print(markdown(json.loads(out.read_text()), study, choice))
        return
    if a.quick:
        a.cohorts, a.seeds, a.epsilons = "lung", 1, "3"
    payload = json.loads(out.read_text()) if out.exists() else {}
    payload |= {"machine": machine(), "delta": DELTA, "arm": ARM, "schedule": list(GRID[OFF][0]), "model": GRID[OFF][1]}
    if a.check_splits:
        check = payload.setdefault("split_check", {})
        if "cell" in check:  # one check, as the first version of this script kept it
            check = payload["split_check"] = {check["cell"]: check}
        check[a.check_splits] = check_splits(a.check_splits, study, choice)
        print(json.dumps(check[a.check_splits], indent=1), flush=True)
        write(out, payload)
        return
    cohorts = [x for x in a.cohorts.split(",") if x]
    loaded = {c: load_cohort(c) for c in cohorts}
    if a.variant:
        store = payload.setdefault("variants", {}).setdefault(a.variant, {})
        for e in (float(x) for x in (a.epsilons if a.epsilons != ap.get_default("epsilons") else "3").split(",")):
            for cohort in cohorts:
                c, tables = loaded[cohort]
                cells = store.setdefault(f"{e:g}", {}).setdefault(cohort, {})
                for seed in range(a.seeds):
                    if str(seed) not in cells:
                        cells[str(seed)] = run_one(cohort, seed, epsilon=e, selection=True, tables=tables,
                                                   dictionary=c.dictionary, variant=a.variant)
                        write(out, payload)
        return
    runs = payload.setdefault("runs", {})
    for e in (float(x) for x in a.epsilons.split(",")):
        for cohort in cohorts:
            c, tables = loaded[cohort]
            cells = runs.setdefault(f"{e:g}", {}).setdefault(cohort, {})
            for seed in range(a.seeds):
                if str(seed) in cells:  # kept from an earlier (partial) run
                    continue
                cells[str(seed)] = run_cell(cohort, seed, epsilon=e, tables=tables, dictionary=c.dictionary)
                write(out, payload)
    payload["summary"] = summarise(payload, study, choice)
    write(out, payload)


if __name__ == "__main__":
    main()
