"""The production setting, benchmarked (issue 30, item 5): what a DP federation gets on the real
tables now that private model choice exists.

Per cohort (the binary form of :mod:`research.real_tables`, the same hospitals, splits and
baselines), per seed, the test AUROC (mean over hospitals) of:

- ``reference``: the non-DP SDK default (masked, the default candidates, selection on);
- ``nodp_single``: the SDK's one default model without DP and without selection (kept round =
  last) -- the non-DP twin of ``local_dp_eps*``, whose rounds time the DP round's cost;
- ``local_dp_eps<e>``: local DP-SGD at ε = e, one model (the SDK default model), no selection,
  kept round = last;
- ``private_choice_eps<e>``: local DP at ε = e with ``[selection] enabled = true`` (the default
  candidates; σ and σ_s planned over the whole choice, ``candidates.private_choice``);
- ``distributed_eps3``: distributed DP (Skellam shares in the masked sum) at ε = 3 with the
  documented preset (``sdk/privacy/schedule.py``: 60 full-batch rounds, C = 3, server lr 1,
  h = 2), σ calibrated as the demo does; no selection (refused under distributed DP);
- the references of :func:`research.model_quality.baselines` (LR standalone, LR pooled, ...) and
  ``dp_lr_pooled_eps<e>``: DP gradient descent logistic regression on the pooled training
  patients (central DP, a ceiling reference no federation may build; :func:`dp_lr_pooled`).

Also per DP run: the ε parts of every hospital's last signed ledger entry (composed / training /
selection), the candidate chosen, σ_s and the standard deviation it puts on the federated
validation loss (σ_s·B·√K / Σ_k n_val,k) beside the spread of the non-DP validation losses over
rounds and candidates; per-round wall time (median) of every arm. Every hyper-parameter is fixed
in advance (the SDK's defaults, the documented preset, :data:`DP_LR` below); nothing is chosen
on test. Writes ``research/private_selection/results/private_selection.json`` after every
cohort and seed. Asserts nothing.

    python -m research.private_selection.private_selection --cohorts gbsg2,lung,kidney --seeds 3
    python -m research.private_selection.private_selection --quick     # lung, 1 seed, ε = 3 only
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, machine, median, out_path, write  # noqa: E402

DELTA = 1e-5
#: DP-LR pooled, fixed in advance (never tuned on these tables): full-batch DP gradient descent
#: (q = 1, as the distributed preset), per-patient clip C, server-style step lr, T steps
DP_LR = {"steps": 50, "lr": 1.0, "clip": 1.0}
EPSILONS = (1.0, 3.0, 8.0)


def load_cohort(cohort: str):
    """``(cohort, tables)`` of a real table (:func:`research.real_tables.real_tables.load`), or of
    ``"demo"``: the demo federation (4 ALARM hospitals, data seed 0, full size) as
    research/dp_trust_models draws it."""
    if cohort != "demo":
        from research.real_tables.real_tables import load

        return load(cohort)
    from types import SimpleNamespace

    from research.dp_trust_models.dp_trust_models import tables_for

    tables, dictionary = tables_for(0, 1.0)
    return SimpleNamespace(dictionary=dictionary), tables


def sdk_dp_config(cohort: str, seed: int, *, epsilon: float | None, selection: bool, work: Path):
    """The SDK default federation for ``seed`` (:func:`research.model_quality.sdk_config`), with
    local DP at ``epsilon`` (σ calibrated to it over the planned rounds) on the model the study
    measured (``deep = true``, the SDK's DP default before issue 30's validation choice) and
    selection on or off."""
    from clinograph.sdk.config import SimulationConfig, merge_sections

    from research.model_quality import sdk_config

    # only the fields sdk_config set: a dumped default counts as "chosen explicitly" and turns off
    # the default candidates (candidates.default_applies)
    data = sdk_config(seed=seed, dictionary_id=cohort).model_dump(mode="python", by_alias=True, exclude_unset=True)
    over: dict = {"output": str(work / "out")} | ({} if selection and epsilon is None else
                                                  {"selection": {"enabled": selection}})
    if epsilon is not None:  # the study's DP model is the GNN (deep, explicit: the SDK's DP default is now the wide path)
        over |= {"model": {"deep": True}, "graph": {"k_similar": 0},
                 "privacy": {"enabled": True, "epsilon_budget": epsilon, "target_epsilon": epsilon, "delta": DELTA,
                             "state_dir": str(work / "state")}}
    return SimulationConfig.model_validate(merge_sections(data, over))


def distributed_dp_config(cohort: str, seed: int, *, epsilon: float, tables, dictionary, work: Path,  # noqa: ANN001
                          rounds: int, clip: float, server_lr: float, min_honest: int = 2,
                          over: dict | None = None, selection: bool = False):
    """Distributed DP at ``epsilon`` (masked, q = 1, full-batch FedSGD at ``server_lr``, per-patient
    clip ``clip``, ``rounds`` rounds, h = ``min_honest``; the masked threshold raised to h when
    above 2), the SDK default federation for ``seed`` with ``over`` (model overrides; a
    ``selection`` table keeps its other keys) merged in,
    σ calibrated to ``epsilon`` over :func:`distributed_rounds` as ``clinograph demo`` calibrates
    it (:func:`distributed_noise_multiplier`). ``selection``: ``[selection] enabled`` -- private
    selection (kept round and early stopping by the federated validation loss released in the
    same noisy sum; :func:`distributed_rounds` then also counts the scoring round(s))."""
    from clinograph.sdk.config import merge_sections
    from clinograph.sdk.federation.build import initial_model_for
    from clinograph.sdk.federation.candidates import distributed_rounds
    from clinograph.sdk.privacy.calibration import distributed_noise_multiplier

    base = sdk_dp_config(cohort, seed, epsilon=None, selection=False, work=work)
    fed = {"rounds": rounds, "server_lr": server_lr, "local_epochs": 1, "strategy": "fedsgd"}
    if min_honest > 2:  # a round with fewer survivors than h would release a sum short of h noise shares
        fed["masked_threshold"] = min_honest
    data = merge_sections(base.model_dump(mode="python", by_alias=True, exclude_unset=True), merge_sections(over or {}, {
        "federation": fed, "graph": {"k_similar": 0}, "selection": {"enabled": selection},
        "privacy": {"enabled": True, "mode": "distributed", "epsilon_budget": epsilon, "delta": DELTA,
                    "noise_multiplier": 1.0, "clip_norm": clip, "sample_rate": 1.0,
                    "min_honest": min_honest, "state_dir": str(work / "state")}}))
    cfg = type(base).model_validate(data)
    spec = initial_model_for(cfg.hospital_config(), dictionary=dictionary).spec
    sigma = distributed_noise_multiplier(cfg, dim=sum(m.size for m in spec.shared), n_hospitals=len(tables),
                                         target_epsilon=epsilon, rounds=distributed_rounds(cfg))
    return cfg.model_copy(update={"privacy": cfg.privacy.model_copy(update={"noise_multiplier": sigma})})


def distributed_config(cohort: str, seed: int, *, epsilon: float, tables, dictionary, work: Path,  # noqa: ANN001
                       over: dict | None = None):
    """Distributed DP at ``epsilon`` with the documented preset (``sdk/privacy/schedule.py``) on
    the GNN (the model deep = true; ``over``: more model overrides), σ calibrated as
    ``clinograph demo`` calibrates it."""
    from clinograph.sdk.config import merge_sections
    from clinograph.sdk.privacy.schedule import distributed_schedule

    s = distributed_schedule(epsilon)
    return distributed_dp_config(cohort, seed, epsilon=epsilon, tables=tables, dictionary=dictionary, work=work,
                                 rounds=s.rounds, clip=s.clip_norm, server_lr=s.server_lr,
                                 over=merge_sections({"model": {"deep": True}}, over or {}))


def ledger_parts(audit_dir: Path) -> dict[str, dict]:
    """Each hospital's last accepted ledger entry in the audit trail: ε composed, ε of training and
    of the selection releases alone, σ, and the releases' σ_s and count over the run; and the ε
    after each of its entries, by round (``epsilon_by_round``: under distributed DP one entry a
    round, the scoring round that ends a run with selection included)."""
    out: dict[str, dict] = {}
    for line in (audit_dir / "audit.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e["kind"] != "ledger":
            continue
        p = e["payload"]
        prev = out.get(p["client"], {"release_count": 0, "sigma_s": None})
        rel = p.get("releases") or []
        out[p["client"]] = {"epsilon": p.get("epsilon"), "epsilon_training": p.get("epsilon_training"),
                            "epsilon_selection": p.get("epsilon_selection"),
                            "noise_multiplier": p.get("noise_multiplier"), "entries": prev.get("entries", 0) + 1,
                            "release_count": prev["release_count"] + sum(int(r["count"]) for r in rel),
                            "sigma_s": next((float(r["noise_multiplier"]) for r in rel), prev["sigma_s"]),
                            "epsilon_by_round": [*prev.get("epsilon_by_round", []), [p.get("round"), p.get("epsilon")]]}
    return out


def run_arm(tables, dictionary, cfg, *, choose: bool) -> dict:  # noqa: ANN001
    """One federation; its test metrics, its kept model's validation metrics (each hospital's own
    validation patients), choice, selection, round times and ledger parts."""
    from clinograph.sdk.federation.simulate import simulate

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        res = simulate(tables, dictionary, cfg, audit_dir=Path(tmp) / "audit", choose=choose)
        seconds = time.perf_counter() - t0
        validation = {n: m.client.task.evaluate("validation") for n, m in sorted(res.hospitals.items())}
        ledger = ledger_parts(Path(tmp) / "audit") if cfg.privacy.enabled else {}
    sel = res.selection
    return {"final": res.final, "validation": validation, "seconds": round(seconds, 2), "rounds_run": len(res.rounds),
            "round_seconds": [round(x, 4) for x in res.timings.get("round_seconds", [])],
            "chosen": res.choice.get("chosen"),
            "candidates": [{k: r.get(k) for k in ("name", "validation_loss", "round", "rounds_run")}
                           for r in res.choice.get("candidates", [])],
            "selected_round": sel.get("round"), "validation_losses": sel.get("validation_losses", []),
            "validation_noises": sel.get("validation_noises", []),
            "ledger": ledger}


def dp_lr_pooled(tables, splits, *, epsilon: float, seed: int) -> dict[str, dict]:  # noqa: ANN001
    """Central-DP logistic regression on the pooled training patients: full-batch DP gradient
    descent (q = 1), each patient's gradient (intercept included) clipped to C, Gaussian noise
    σ·C on the sum, σ from Opacus's RDP accountant for T steps at ε, δ. Inputs are the
    baselines' (public-range standardisation, missing = 0 plus indicators: no pooled statistic,
    so nothing outside the account). A ceiling reference: it needs a trusted curator.

    Why DP-GD and not objective perturbation: it is the SDK's own mechanism family (Gaussian,
    RDP, q = 1 like the distributed preset), so the gap to it isolates what federation costs;
    objective perturbation needs feature norms ≤ 1 and a tuned regulariser. The noise comes from
    numpy's generator: fine for a benchmark, not for a release."""
    from clinograph.sdk.demo.baselines import mlp_inputs
    from clinograph.sdk.training.metrics import binary_metrics
    from opacus.accountants.utils import get_noise_multiplier
    from scipy.special import expit

    nodes = np.array(sorted(set().union(*(set(t.observed_nodes().tolist()) for t in tables))), dtype=np.int64)
    xs = [np.c_[mlp_inputs(t, nodes).numpy().astype(np.float64), np.ones(t.n_patients)] for t in tables]
    xt = np.concatenate([x[s.train] for x, s in zip(xs, splits, strict=True)])
    yt = np.concatenate([t.labels[s.train] for t, s in zip(tables, splits, strict=True)]).astype(np.float64)
    c, steps, lr = DP_LR["clip"], DP_LR["steps"], DP_LR["lr"]
    sigma = float(get_noise_multiplier(target_epsilon=epsilon, target_delta=DELTA, sample_rate=1.0, steps=steps,
                                       accountant="rdp", epsilon_tolerance=0.01))
    rng = np.random.default_rng(seed)
    w = np.zeros(xt.shape[1])
    for _ in range(steps):
        g = xt * (expit(xt @ w) - yt)[:, None]  # per-patient gradients [n, d]
        g /= np.maximum(1.0, np.linalg.norm(g, axis=1) / c)[:, None]
        w -= lr * (g.sum(0) + rng.normal(0.0, sigma * c, size=w.shape)) / len(yt)
    return {t.site: {**binary_metrics(t.labels[s.test], expit(x[s.test] @ w)), "sigma": sigma}
            for t, x, s in zip(tables, xs, splits, strict=True)}


def mean_auroc(per: dict) -> float:
    return float(np.nanmean([v["auroc"] for v in per.values()]))


def noise_level(run: dict, ref: dict, *, n_val: int, hospitals: int, clip: float) -> dict:
    """σ_s·B·√K / Σ n_val (the std the releases put on the federated validation loss) beside the
    non-DP reference's spread of validation losses over rounds (its kept run) and candidates."""
    sig = [v["sigma_s"] for v in run["ledger"].values() if v.get("sigma_s")]
    if not sig:
        return {}
    sigma_s = float(np.median(sig))
    rounds = [x for x in ref["validation_losses"][1:] if x is not None and math.isfinite(x)]
    cands = [c["validation_loss"] for c in ref["candidates"] if c["validation_loss"] is not None]
    std = sigma_s * clip * math.sqrt(hospitals) / n_val
    return {"sigma_s": sigma_s, "clip_B": clip, "validation_patients": n_val, "hospitals": hospitals,
            "released_loss_std": std,
            "nodp_round_loss_std": float(np.std(rounds)) if len(rounds) > 1 else None,
            "nodp_candidate_loss_range": float(max(cands) - min(cands)) if len(cands) > 1 else None,
            "nodp_candidate_loss_std": float(np.std(cands)) if len(cands) > 1 else None}


def run_seed(cohort: str, seed: int, *, epsilons: tuple[float, ...], distributed: bool, tables, c) -> dict:  # noqa: ANN001
    from research.model_quality import baselines, splits_for

    arms: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)

        def go(name: str, cfg, choose: bool) -> None:  # noqa: ANN001
            arms[name] = run_arm(tables, c.dictionary, cfg, choose=choose)
            print(f"{cohort} seed {seed} {name}: AUROC {mean_auroc(arms[name]['final']):.3f} chose "
                  f"{arms[name]['chosen']} in {arms[name]['seconds']:.0f} s", flush=True)

        go("reference", sdk_dp_config(cohort, seed, epsilon=None, selection=True, work=work / "ref"), True)
        go("nodp_single", sdk_dp_config(cohort, seed, epsilon=None, selection=False, work=work / "one"), False)
        for e in epsilons:
            go(f"local_dp_eps{e:g}", sdk_dp_config(cohort, seed, epsilon=e, selection=False,
                                                   work=work / f"l{e:g}"), False)
            go(f"private_choice_eps{e:g}", sdk_dp_config(cohort, seed, epsilon=e, selection=True,
                                                         work=work / f"p{e:g}"), True)
        if distributed:
            go("distributed_eps3", distributed_config(cohort, seed, epsilon=3.0, tables=tables,
                                                      dictionary=c.dictionary, work=work / "d3"), False)
    cfg = sdk_dp_config(cohort, seed, epsilon=None, selection=True, work=Path("."))
    splits = splits_for(tables, cfg)
    base = baselines(tables, splits, seed=seed)
    for e in epsilons:
        base[f"dp_lr_pooled_eps{e:g}"] = dp_lr_pooled(tables, splits, epsilon=e, seed=seed)
    n_val = int(sum(len(s.validation) for s in splits))
    clip = cfg.privacy.selection_loss_clip
    noise = {k: noise_level(v, arms["reference"], n_val=n_val, hospitals=len(tables), clip=clip)
             for k, v in arms.items() if k.startswith("private_choice")}
    return {"arms": arms, "baselines": base, "noise": noise}


def measure_round_costs(cohorts: str, costs: dict, measure, *, save) -> None:  # noqa: ANN001
    """``costs[cohort] = measure(cohort, tables, dictionary, rounds=8, work=...)`` for each of the
    comma-separated ``cohorts`` (a temporary work folder each), printed and ``save()``d after each;
    each with its own load average before and after and its UTC time (the file's ``machine`` block
    describes the run that wrote the cohorts' results, not necessarily this one)."""
    import datetime
    import os

    for cohort in cohorts.split(","):
        c, tables = load_cohort(cohort)
        load_before = os.getloadavg()
        with tempfile.TemporaryDirectory() as tmp:
            costs[cohort] = measure(cohort, tables, c.dictionary, rounds=8, work=Path(tmp))
        costs[cohort] |= {"load_average_before": list(load_before), "load_average_after": list(os.getloadavg()),
                          "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
        print(cohort, json.dumps(costs[cohort]["median_seconds"]), flush=True)
        save()


def round_cost(cohort: str, tables, dictionary, *, rounds: int, work: Path) -> dict:  # noqa: ANN001
    """Wall time of one round, DP beside non-DP at the same size, in one process: the four
    federations are built first, then their rounds are run interleaved (A, B, C, D, A, B, ...) so
    the machine's load falls on all alike; medians over ``rounds`` rounds (no test evaluation in
    the timed part). Pairs: the SDK default model without DP and with local DP at ε = 3 (two local
    epochs a round); the same model at one local epoch without DP and with distributed DP at ε = 3
    (the preset: one full-batch DP-SGD step a round)."""
    from clinograph.sdk.config import merge_sections

    def one_epoch(cfg):  # noqa: ANN001, ANN202
        return type(cfg).model_validate(merge_sections(cfg.model_dump(mode="python", by_alias=True, exclude_unset=True),
                                                       {"federation": {"local_epochs": 1}}))

    cfgs = {"no_dp": sdk_dp_config(cohort, 0, epsilon=None, selection=False, work=work / "a"),
            "local_dp_eps3": sdk_dp_config(cohort, 0, epsilon=3.0, selection=False, work=work / "b"),
            "no_dp_one_epoch": one_epoch(sdk_dp_config(cohort, 0, epsilon=None, selection=False, work=work / "c")),
            "distributed_eps3": distributed_config(cohort, 0, epsilon=3.0, tables=tables, dictionary=dictionary,
                                                   work=work / "d")}
    times = interleaved_rounds(tables, dictionary, cfgs, rounds=rounds, work=work)
    med = {k: median(v) for k, v in times.items()}
    return {"rounds": rounds, "patients": int(sum(t.n_patients for t in tables)), "median_seconds": med,
            "seconds": times, "ratio_local_dp": med["local_dp_eps3"] / med["no_dp"],
            "ratio_distributed_dp": med["distributed_eps3"] / med["no_dp_one_epoch"]}


def interleaved_rounds(tables, dictionary, cfgs: dict, *, rounds: int, work: Path) -> dict[str, list[float]]:  # noqa: ANN001
    """Seconds of each of ``rounds`` rounds of every federation in ``cfgs`` (by name), all built
    first, then run interleaved (A, B, ..., A, B, ...) so the machine's load falls on all alike; no
    test evaluation in the timed part."""
    from clinograph.sdk.federation.simulate import build_simulation

    sims = {k: build_simulation(tables, dictionary, v, audit_dir=work / k / "audit") for k, v in cfgs.items()}
    times: dict[str, list[float]] = {k: [] for k in sims}
    try:
        for _ in range(rounds):
            for k, sim in sims.items():
                t0 = time.perf_counter()
                sim.run_round()
                times[k].append(time.perf_counter() - t0)
    finally:
        for sim in sims.values():
            sim.audit.close()
    return times


def stored(run: dict) -> dict:
    """A run as the result file keeps it: the test AUROC (mean over hospitals) instead of the
    per-hospital metrics, and the ledger parts as mean (and largest ε) over hospitals."""
    out = {k: v for k, v in run.items() if k not in ("final", "validation", "ledger")} | {"auroc": mean_auroc(run["final"])}
    if "validation" in run:
        out["validation_auroc"] = mean_auroc(run["validation"])
    led = list(run["ledger"].values())
    if led:
        out["ledger"] = {k: _avg(led, k) for k in ("epsilon", "epsilon_training", "epsilon_selection",
                                                   "noise_multiplier", "sigma_s", "release_count")}
        out["ledger"] |= {"epsilon_max": max(x["epsilon"] for x in led), "hospitals": len(led)}
    return out


def summary(per_seed: list[dict]) -> dict:
    """Per method: mean / sd / per-seed of the mean-over-hospitals test AUROC; per DP arm the
    chosen candidates, the ε parts (mean over hospitals of the last entry) and the median round time."""
    out: dict[str, dict] = {}
    methods = {**per_seed[0]["arms"], **per_seed[0]["baselines"]}
    for k in methods:
        runs = [s["arms"].get(k) or {"final": s["baselines"][k]} for s in per_seed]
        vals = [mean_auroc(r["final"]) for r in runs]
        row: dict = {"auroc_mean": float(np.mean(vals)), "auroc_sd": float(np.std(vals)), "auroc_per_seed": vals}
        if k in per_seed[0]["arms"]:
            row["chosen_per_seed"] = [r["chosen"] for r in runs]
            row["selected_round_per_seed"] = [r["selected_round"] for r in runs]
            row["round_seconds_median"] = median([x for r in runs for x in r["round_seconds"]]) \
                if any(r["round_seconds"] for r in runs) else None
            row["seconds_per_seed"] = [r["seconds"] for r in runs]
            if runs[0]["ledger"]:
                for part in ("epsilon", "epsilon_training", "epsilon_selection"):
                    xs = [v[part] for r in runs for v in r["ledger"].values() if v.get(part) is not None]
                    row[f"{part}_mean_over_hospitals"] = float(np.mean(xs)) if xs else None
        out[k] = row
    return out


def targets(summ: dict, epsilons: tuple[float, ...]) -> dict:
    """Issue 30's Done-when on this cohort (the issue judges them on the mean over tables)."""
    ref, alone = summ["reference"]["auroc_mean"], summ["lr_standalone"]["auroc_mean"]
    out = {}
    for e in epsilons:
        key = f"private_choice_eps{e:g}"
        if key not in summ:
            continue
        tol = 0.03 if e >= 3 else 0.06
        v = summ[key]["auroc_mean"]
        out[key] = {"auroc": v, "gap_to_reference": v - ref, "within": tol, "within_met": v >= ref - tol,
                    "not_below_lr_standalone": v >= alone}
    return out


COLUMNS = ("reference", "nodp_single", "local_dp_eps{e}", "private_choice_eps{e}", "dp_lr_pooled_eps{e}")


def markdown(payload: dict) -> str:
    """The README's tables from a result file: test AUROC (mean over seeds of the mean over
    hospitals) per cohort and arm, the Done-when targets on the mean over cohorts, the ε parts,
    the noise level and the round times."""
    cohorts = payload["cohorts"]
    eps = payload["epsilons"]
    f = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    keys = ["reference", "nodp_single", *(k.format(e=f"{e:g}") for e in eps for k in COLUMNS[2:]),
            "distributed_eps3", "lr_standalone", "lr_pooled", "lr_fedavg_aligned"]
    auc = {c: {k: r["summary"][k]["auroc_mean"] for k in keys if k in r["summary"]} for c, r in cohorts.items()}
    mean = {k: float(np.mean([auc[c][k] for c in cohorts])) for k in keys if all(k in auc[c] for c in cohorts)}
    lines = ["| method | " + " | ".join(f"{c} ({len(r['seeds'])} seeds)" for c, r in cohorts.items()) + " | **mean** |",
             "|---|" + "---|" * (len(cohorts) + 1)]
    for k in keys:
        lines.append(f"| {k} | " + " | ".join(f(auc[c].get(k)) for c in cohorts) + f" | **{f(mean.get(k))}** |")
    lines += ["", "| arm | chosen per seed (per cohort) | ε composed | ε training | ε selection | round s (median) |",
              "|---|---|---|---|---|---|"]
    for k in keys[:-3]:
        rows = [cohorts[c]["summary"].get(k) for c in cohorts]
        if not rows or not rows[0] or "round_seconds_median" not in rows[0]:
            continue
        chosen = "; ".join(f"{c}: {','.join(str(x) for x in cohorts[c]['summary'][k]['chosen_per_seed'])}"
                           for c in cohorts) if k.startswith(("reference", "private")) else "-"
        lines.append(f"| {k} | {chosen} | {f(_avg(rows, 'epsilon_mean_over_hospitals'))} | "
                     f"{f(_avg(rows, 'epsilon_training_mean_over_hospitals'))} | {f(_avg(rows, 'epsilon_selection_mean_over_hospitals'))}"
                     f" | {f(_avg(rows, 'round_seconds_median'))} |")
    lines += ["", "| cohort | arm | σ_s | validation patients | std of the released loss | non-DP std over rounds "
              "| non-DP range over candidates |", "|---|---|---|---|---|---|---|"]
    for c, r in cohorts.items():
        for k in r["noise"][0]:
            rows = [n[k] for n in r["noise"] if n.get(k)]
            lines.append(f"| {c} | {k} | {_avg(rows, 'sigma_s'):.1f} | {rows[0]['validation_patients']} | "
                         f"{f(_avg(rows, 'released_loss_std'))} | {f(_avg(rows, 'nodp_round_loss_std'))} | "
                         f"{f(_avg(rows, 'nodp_candidate_loss_range'))} |")
    if payload.get("round_cost"):
        lines += ["", "| cohort (patients) | no DP | local DP ε = 3 | ratio | no DP, 1 epoch | distributed ε = 3 | ratio |",
                  "|---|---|---|---|---|---|---|"]
        for c, r in payload["round_cost"].items():
            m = r["median_seconds"]
            lines.append(f"| {c} ({r['patients']}) | {m['no_dp']:.3f} | {m['local_dp_eps3']:.3f} | "
                         f"{r['ratio_local_dp']:.2f} | {m['no_dp_one_epoch']:.3f} | {m['distributed_eps3']:.3f} | "
                         f"{r['ratio_distributed_dp']:.2f} |")
    return "\n".join(lines)


def _avg(rows: list, part: str) -> float | None:
    """Mean of ``part`` over the rows that report it (None: none does)."""
    xs = [r[part] for r in rows if r and r.get(part) is not None]
    return float(np.mean(xs)) if xs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cohorts", default="gbsg2,lung,kidney")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epsilons", default="1,3,8")
    ap.add_argument("--distributed", default="gbsg2", help="cohorts that also run distributed DP at ε = 3 "
                    "(the 60-round preset; comma-separated, 'all' or 'none')")
    add_convention(ap, quick_help="lung, 1 seed, ε = 3, no distributed DP")
    ap.add_argument("--round-cost", default="", help="cohorts whose DP and non-DP rounds are timed interleaved "
                    "(comma-separated; written to round_cost in the result file, other results kept)")
    ap.add_argument("--markdown", action="store_true", help="print the README's tables of the result file and exit")
    a = ap.parse_args()
    if a.markdown:
        print(markdown(json.loads(out_path(__file__, a).read_text())))
        return
    if a.quick:
        a.cohorts, a.seeds, a.epsilons, a.distributed = "lung", 1, "3", "none"
    eps = tuple(float(x) for x in a.epsilons.split(","))
    cohorts = [x for x in a.cohorts.split(",") if x]
    dist = set(cohorts) if a.distributed == "all" else {x for x in a.distributed.split(",") if x != "none"}
    out = out_path(__file__, a)
    old = json.loads(out.read_text()) if out.exists() and not a.quick else {}
    payload = {"machine": machine(), "epsilons": list(eps), "delta": DELTA, "dp_lr": DP_LR,
               "cohorts": dict(old.get("cohorts", {})),
               **{k: old[k] for k in ("round_cost", "round_cost_machine") if k in old}}
    if a.round_cost:
        payload["round_cost"] = dict(old.get("round_cost", {}))
        measure_round_costs(a.round_cost, payload["round_cost"], round_cost,
                            save=lambda: write(out, {**old, **payload, "machine": old.get("machine", payload["machine"]),
                                                     "round_cost_machine": machine()}))
        return
    for cohort in cohorts:
        c, tables = load_cohort(cohort)
        per_seed: list[dict] = []
        for seed in range(a.seeds):
            per_seed.append(run_seed(cohort, seed, epsilons=eps, distributed=cohort in dist, tables=tables, c=c))
            summ = summary(per_seed)
            payload["cohorts"][cohort] = {
                "hospitals": {t.site: t.n_patients for t in tables}, "seeds": list(range(len(per_seed))),
                "summary": summ, "targets": targets(summ, eps),
                "noise": [s["noise"] for s in per_seed],
                "per_seed": [{"arms": {k: stored(v) for k, v in s["arms"].items()}} for s in per_seed]}
            write(out, payload)


if __name__ == "__main__":
    main()
