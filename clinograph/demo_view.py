"""Terminal views (rich) for `clinograph demo` and `clinograph simulate`."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


def _width() -> int | None:
    """rich's width: the terminal's; into a file or pipe (a log, CI) 160 columns unless ``COLUMNS``
    says otherwise -- rich's default of 80 wrapped the comparison table's nine columns into
    truncated names ("featu…") a cell over three lines."""
    return None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160


console = Console(stderr=False, width=_width())


def _fmt(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def _progress() -> Progress:
    """The rounds' progress bar, redrawn at each update, with no refresh thread of its own: a
    simulation with ``[simulation] workers = "auto"`` forks only a process without other Python
    threads (sdk/federation/simulate.py), and a round updates the bar every second or so anyway."""
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, auto_refresh=False)


def run_demo_view(*, out: Path, rounds: int, seed: int, secure_mode: str, dp: bool, scale: float = 1.0) -> None:
    """Run the demo with a progress bar and print the comparison table."""
    from clinograph.sdk.demo.run import demo_config, run_demo
    from clinograph.sdk.federation.candidates import candidate_configs

    k = max(1, len(candidate_configs(demo_config(rounds=rounds, seed=0, secure_mode=secure_mode))))
    with _progress() as progress:
        task = progress.add_task("federated rounds", total=rounds * k)  # each initialisation: up to `rounds`

        def on_round(r: int, metrics: dict[str, dict[str, float]]) -> None:
            mean = sum(m["auroc"] for m in metrics.values()) / len(metrics)
            progress.update(task, advance=1, description=f"round {r + 1}/{rounds}, mean AUROC {mean:.3f}", refresh=True)

        result = run_demo(out_dir=out, rounds=rounds, seed=seed, secure_mode=secure_mode, dp=dp,
                          on_round=on_round, scale=scale,
                          on_stage=lambda s: progress.console.log(s))
    m = result.metrics
    table = Table(title=f"Test AUROC / AUPRC per hospital ({m['task']}; seed {seed})")
    table.add_column("hospital")
    methods = m["methods"]
    keys = [k for k in ("clinograph_nsfl", "clinograph_nsfl_dp", "standalone", "fedavg_aligned", "lr_standalone",
                        "lr_fedavg_aligned", "lr_pooled", "gbm_pooled") if k in methods]
    titles = {"clinograph_nsfl": "Clinograph NS-FL", "standalone": "MLP alone", "fedavg_aligned": "MLP FedAvg",
              "clinograph_nsfl_dp": "NS-FL + DP", "lr_standalone": "LR alone", "lr_fedavg_aligned": "LR FedAvg",
              "lr_pooled": "LR pooled*", "gbm_pooled": "GBM pooled*"}
    for k in keys:
        table.add_column(titles[k], justify="right")
    for site in m["hospitals"]:
        row = [f"{site} ({m['hospitals'][site]['patients']} pts, {m['hospitals'][site]['features']} features)"]
        for key in keys:
            v = methods[key][site]
            row.append(f"{_fmt(v['auroc'])} / {_fmt(v['auprc'])}")
        table.add_row(*row)
    table.add_row("[bold]mean", *[f"[bold]{_fmt(m['mean_auroc'][k])} / {_fmt(m['mean_auprc'][k])}"
                                  for k in keys])
    console.print(table)
    console.print("* pooled: trained on every hospital's patients in one place -- a ceiling reference, not "
                  "something a federation may do.")
    sel = m.get("model_selection") or {}
    if sel:
        console.print(f"model selection: kept round {sel['round']} of {sel['rounds_evaluated'][-1]} by federated "
                      f"validation loss {sel['validation_loss']:.4f}" + (" (stopped early)" if sel["stopped_early"]
                                                                          else ""))
    choice = m.get("model_choice") or {}
    if choice:
        losses = ", ".join(f"{c['name']} {c['validation_loss']:.4f}" for c in choice["candidates"]
                           if c["validation_loss"] is not None)
        console.print(f"kept initialisation: {choice['chosen']} of {len(choice['candidates'])} (federated validation "
                      f"loss: {losses})", soft_wrap=True)
    if m.get("dp_guarantees"):
        console.print(f"distributed DP after {m['dp_rounds']} rounds (Skellam noise shares inside the masked sum; "
                      f"budget ε = {m['dp_settings']['epsilon_budget']}, δ = {m['dp_settings']['delta']:g}):")
        for site, g in sorted(m["dp_guarantees"].items()):
            console.print(f"  {site}: ε = {g['epsilon']:.3f} while at least {g['min_honest']} hospitals add their "
                          f"share and survive; ε = {g['epsilon_alone']:.3f} if the others' noise were absent "
                          "(its own share alone)")
    elif m.get("epsilon"):
        for site, eps in m["epsilon"].items():
            console.print(f"ε({site}) after {len(eps)} DP rounds: {eps[-1]:.3f} (δ = 1e-5, budget "
                          f"{m['dp_settings']['epsilon_budget']})")
    console.print(f"audit: {'verified' if result.audit_ok else '[red]FAILED VERIFICATION'} ({out / 'audit'}"
                  + (f", {out / 'audit_dp'})" if "clinograph_nsfl_dp" in methods else ")"))
    if result.report:
        console.print(f"report: {result.report}")
    console.print(f"metrics: {out / 'metrics.json'}")
    if not result.audit_ok:
        from clinograph.core.errors import IntegrityError

        raise IntegrityError(f"The demo's own audit directory {out / 'audit'} does not verify.")


def simulation_progress(rounds: int, write: Callable[[str], object], *, status: Callable[[str], object],
                        clock: Callable[[], float] | None = None) -> Callable[[str, Mapping[str, Any]], None]:
    """The progress events ``clinograph simulate`` shows (:mod:`clinograph.secure.runtime.progress`):
    each stage's answers and slowest hospital as the live ``status`` (the progress bar's text: one
    line, replaced at every stage), each closed round with its seconds and the ETA ``write``-n, and a
    hospital's signed refusal with its reason the first time that hospital refuses (later rounds name
    it on their line; the audit log holds every one)."""
    from clinograph.secure.runtime.progress import RoundClock, eta_line, stage_line

    timer = RoundClock(rounds=rounds) if clock is None else RoundClock(rounds=rounds, clock=clock)
    prefix = ""  # with several candidate models, each line names the one that runs
    told: set[tuple[str, str]] = set()  # (refused | dropped, hospital) whose reason was shown

    def show(kind: str, data: Mapping[str, Any]) -> None:
        nonlocal prefix
        data = timer.observe(kind, data)
        if kind == "run_started":
            several = int(data.get("count") or 1) > 1
            prefix = f"{data.get('candidate')}: " if several and data.get("candidate") else ""
        elif kind == "run_resumed" and data.get("candidate"):  # a paused candidate goes on (early elimination)
            prefix = f"{data.get('candidate')}: "
        elif kind == "stage_progress":
            status(prefix + stage_line(data))
        elif kind == "hospital_one_class":
            write(f"warning: hospital {data.get('site')}: every one of its {data.get('patients')} patients has label "
                  f"{data.get('label')}; it cannot be evaluated alone (AUROC n/a) and pulls the shared model towards "
                  "one class. Check its label column and coding (`clinograph check`).")
        elif kind == "hospital_missing_columns":
            said = [f"{what} {', '.join(map(repr, data.get(key) or ()))}" for key, what in
                    (("absent", "not in its table:"), ("empty", "without a value in any row:")) if data.get(key)]
            write(f"warning: hospital {data.get('site')}: mapped column(s) {'; '.join(said)}; their features are "
                  "missing for every patient there (`clinograph check` shows its table).")
        elif kind == "hospital_far_from_reference":
            write(f"warning: hospital {data.get('site')}: the values of column(s) "
                  f"{', '.join(map(repr, data.get('columns') or ()))} look like another unit (far outside their "
                  "features' reference ranges) or like dates: `clinograph check` says why.")
        elif kind == "refused" and ("refused", str(data.get("hospital"))) not in told:
            told.add(("refused", str(data.get("hospital"))))
            write(f"warning: {prefix}round {data.get('round')}: hospital {data.get('hospital')} refused "
                  f"(at {data.get('stage')}; signed, in the audit log as hospital_refused): {data.get('reason')}")
        elif kind == "dropped" and ("dropped", str(data.get("hospital"))) not in told:
            told.add(("dropped", str(data.get("hospital"))))
            write(f"warning: {prefix}round {data.get('round')}: hospital {data.get('hospital')} dropped out of the "
                  f"round: {data.get('reason')}")
        elif kind == "round_aborted":
            write(f"warning: {prefix}round {data.get('round')} aborted, nothing of it applied: {data.get('reason')}")
        elif kind == "model_caught_up":
            write(f"{prefix}round {data.get('round')}: the current global model sent with the plan to "
                  f"{', '.join(map(str, data.get('hospitals') or ()))} (missed the last round)")
        elif kind == "hospital_retired":
            write(f"warning: {prefix}hospital {data.get('client')} retired from the run: {data.get('reason')}")
        elif kind == "round_closed":
            scoring = " (scoring round: the last model evaluated, no training)" if data.get("scoring") else ""
            left = "".join(f"; {what}: {', '.join(map(str, data.get(what) or ()))}"
                           for what in ("refused", "dropped") if data.get(what))
            write(f"{prefix}round {data.get('round')} closed{scoring}: "
                  f"{len(list(data.get('contributors') or []))} contributor(s){left}" + eta_line(data))

    return show


#: the columns of the final table: a survival target's C-index first (its AUROC and AUPRC are at the
#: horizon, over patients whose status there is known, and can be undefined on a small test split)
FINAL_COLUMNS = (("cindex", "C-index"), ("auroc", "AUROC"), ("auprc", "AUPRC"))


def final_table(final: Mapping[str, Mapping[str, float]], *, title: str) -> Table:
    """Each hospital's final test metrics: C-index (survival targets), AUROC, AUPRC."""
    columns = [(key, name) for key, name in FINAL_COLUMNS if any(key in v for v in final.values())]
    table = Table(title=title)
    table.add_column("hospital")
    for _, name in columns:
        table.add_column(name, justify="right")
    for site, v in final.items():
        table.add_row(site, *(_fmt(v.get(key)) for key, _ in columns))
    if len(final) > 1:  # the mean over the hospitals where a metric is defined (n/a: a one-class test split)
        table.add_row("mean", *(_fmt(_mean([v.get(key) for v in final.values()])) for key, _ in columns),
                      end_section=False, style="bold")
    return table


def _mean(values: list[float | None]) -> float | None:
    """The mean of the defined values (not None, not NaN), None if there is none."""
    kept = [float(x) for x in values if x is not None and not math.isnan(float(x))]
    return sum(kept) / len(kept) if kept else None


class Interrupted(Exception):
    """`clinograph simulate` stopped by the operator (Ctrl-C): the account to print (exit 130)."""


def interrupted_account(audit_dir: Path) -> str:
    """What an interrupted simulation leaves: whether its audit directory verifies and how its last run
    ended, in words (names and counts only)."""
    from clinograph.secure.audit import verify_audit_dir

    head = "interrupted by the operator (Ctrl-C): the simulation stopped before it finished; no model was chosen"
    if not (audit_dir / "audit.jsonl").is_file():
        return f"{head}. Nothing was written to {audit_dir}."
    report = verify_audit_dir(audit_dir)
    if not report.ok:
        return (f"{head}. The audit directory {audit_dir} does NOT verify ({len(report.problems)} problem(s); "
                f"first: {report.problems[0]}); `clinograph audit verify {audit_dir}` lists them.")
    from clinograph.secure.audit.read import entries

    last = entries(audit_dir)[-1]
    payload = last["payload"]
    if last.get("kind") == "run_ended":
        how = (f"its last run ended {payload.get('status')} after {payload.get('rounds_completed')} of "
               f"{payload.get('rounds_planned')} training round(s): {payload.get('reason')}")
    else:
        how = f"its last entry is `{last.get('kind')}` (the interrupt came between two runs)"
    return (f"{head}. The audit directory {audit_dir} is closed and verifies ({report.entries} entries); {how}. "
            f"To run again, move {audit_dir} away or choose another `output` (a simulation writes into an empty "
            "audit directory only).")


def run_simulation_view(config_path: Path, *, threads: Callable[[], None] | None = None) -> None:
    """`clinograph simulate CONFIG`: ingest every hospital, run, print per-round metrics. ``threads``:
    called once the config is valid, before the SDK is imported (the CLI sets torch's threads)."""
    from clinograph.sdk.config import DP_DEFAULT_MODEL_LINE, SimulationConfig, dp_default_model

    cfg = SimulationConfig.from_toml(config_path)  # a bad config is refused before torch and the SDK load (seconds)
    from clinograph.sdk.ontology import FeatureDictionary  # ~0.1 s, no torch

    FeatureDictionary.from_toml(cfg.require_dictionary())  # a bad dictionary too: before the progress bar
    if threads is not None:
        threads()
    from clinograph.sdk.federation.candidates import candidate_configs
    from clinograph.sdk.federation.simulate import simulate_from_config

    if dp_default_model(cfg):
        console.print(DP_DEFAULT_MODEL_LINE, soft_wrap=True, markup=False, highlight=False)  # its [model], [privacy]: text
    k = max(1, len(candidate_configs(cfg)))  # [selection] candidates: each runs up to `rounds` rounds
    with _progress() as progress:
        what = "rounds" if k == 1 else f"rounds ({k} candidate models, chosen on federated validation loss)"
        task = progress.add_task(what, total=cfg.federation.rounds * k)
        show = simulation_progress(cfg.federation.rounds,
                                   lambda line: progress.console.print(line, soft_wrap=True, markup=False,
                                                                       highlight=False),
                                   status=lambda line: progress.update(task, description=line, refresh=True))
        try:
            result = simulate_from_config(cfg, on_round=lambda r, m: progress.update(task, advance=1, refresh=True),
                                          on_event=show)
        except KeyboardInterrupt:
            progress.stop()
            raise Interrupted(interrupted_account(cfg.output / "audit")) from None
    if result.choice:
        for row in result.choice["candidates"]:
            loss = "n/a" if row["validation_loss"] is None else f"{row['validation_loss']:.4f}"
            console.print(f"candidate {row['name']}: federated validation loss {loss}, kept round "
                          f"{row['round']}/{row['rounds_run']}", soft_wrap=True)
        console.print(f"chosen model: {result.choice['chosen']} (lowest federated validation loss; the audit "
                      "trail records every candidate)", soft_wrap=True)
    dp = f", {cfg.privacy.mode} DP" if cfg.privacy.enabled else ", no DP"
    console.print(final_table(result.final, title=f"Final test metrics ({cfg.federation.rounds} rounds, "
                                                   f"{cfg.federation.secure_mode}{dp})"))
    for line in privacy_lines(result.audit_dir) if result.audit_dir is not None else ():
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    console.print(f"audit: {result.audit_dir}")


def privacy_lines(audit_dir: Path) -> list[str]:
    """What each hospital's privacy ledger says at the end of a run, from its last ``ledger`` entry in
    the audit log (each hospital's one ledger: every candidate's rounds, selection and set-up releases
    included): ε spent of its budget at δ, and under distributed DP also ε of its own share alone."""
    from clinograph.secure.audit.read import payloads

    last: dict[str, dict[str, Any]] = {p["client"]: p for p in payloads(audit_dir, "ledger")}
    out = []
    for site, p in sorted(last.items()):
        share = p.get("share") if isinstance(p.get("share"), dict) else None
        extra = (f" while at least {share['min_honest']} hospitals add their share and survive; ε = "
                 f"{share['epsilon_alone']:.3f} if the others' noise were absent (its own share alone)"
                 if share else "")
        out.append(f"privacy: {site}: ε = {p['epsilon']:.3f} (δ = {p['delta']:g}) after round {p['round']}{extra}; "
                   f"budget {p.get('budget_epsilon', 'n/a')} (its ledger, in the audit log)")
    return out
