"""What a run decided, for the auditor's report (:mod:`.report`): faults, links, privacy, mode, release.

Each function reads one :class:`~.runs.Run` (payloads that fit their kind's schema) and returns
HTML with every value escaped:

* :func:`run_links` -- which run a run continues: a resume after a server restart (its first
  entries abort the round that was open, reason ``server restart``) or an extension of an ended
  federation (``run_extended``, linked by the previous run's last audit entry);
* :func:`faults` -- the run's aborted rounds with their reasons;
* :func:`privacy_rows` -- per hospital the DP mechanism, ε (distributed and alone), δ, σ, clip,
  sampling rate, steps, accountant and status, a final refusal (budget spent) included;
* :func:`dp_policy_words` -- the federation's DP policy as sentences;
* :func:`secure_mode` -- the mode's parameters, from the run's published (signed) round plans;
* :func:`release_facts` -- what identifies the released model in every mode;
* :func:`selection` -- which round (``model_selected``) and candidate (``model_chosen``) was kept.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from clinograph.core.errors import ClinographError

from .runs import Run

RESTART = "server restart"
UNKNOWN_STATE = "0" * 64
NO_PLAINTEXT = "none: the server holds no plaintext model in this mode (the hospitals decrypt the aggregate)"


def _num(x: object, fmt: str = ".3f") -> str:
    return format(x, fmt) if isinstance(x, int | float) and not isinstance(x, bool) else "-"


def _p(text: str, *, cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f"<p{attr}>{escape(text)}</p>"


# -- links between runs ------------------------------------------------------------------------
def run_links(runs: list[Run]) -> dict[int, str]:
    """Run index -> a sentence naming the run it continues (absent: it continues none)."""
    seq_to_run = {e.seq: r.index for r in runs for e in r.entries}
    out: dict[int, str] = {}
    for i, run in enumerate(runs):
        ext = run.kinds["run_extended"][-1] if run.kinds["run_extended"] else None
        if ext is not None:
            prev = seq_to_run.get(ext["previous_audit_seq"]) if ext["previous_audit_seq"] is not None else None
            out[run.index] = (f"Extends run {prev if prev is not None else '(not in this directory)'}: the ended "
                              f"federation goes on as its run {ext['run']} after {ext['rounds_completed']} "
                              f"round(s), now {ext['rounds_planned']} planned, continuing at round "
                              f"{ext['next_round']} (same keys, hospitals, model and privacy ledgers).")
        elif run.kinds["run_resumed"]:
            res = run.kinds["run_resumed"][-1]
            prev = next((r.index for r in runs if r.run_id == res["previous_run_id"]), None)
            out[run.index] = (f"Resumes run {prev if prev is not None else '(not in this directory)'}, paused by early "
                              f"elimination after {res['rounds_completed']} training round(s): the same candidate "
                              f"goes on in rung {res['rung']} at round {res['next_round']} (same keys, hospitals, "
                              "model and selection).")
        elif i > 0 and any(a["reason"].startswith(RESTART) for a in run.kinds["round_aborted"]) \
                and run.entries and run.entries[0].kind == "audit_reopen":
            out[run.index] = (f"Resumes run {runs[i - 1].index} after a server restart: the round open when the "
                              "server stopped was aborted (below) and the run goes on with the next round number.")
    return out


# -- aborted rounds ----------------------------------------------------------------------------
def faults(run: Run) -> list[list[Any]]:
    """Rows (round, reason, what it means) for every aborted round of the run."""
    rows: dict[int, list[Any]] = {}
    final = {p["round"] for p in run.kinds["hospital_refused"] if p.get("final") and p.get("round") is not None}
    voided = {s["round"] for s in run.kinds["attribution_step"] if s["outcome"] == "voided"}
    named = {p["round"]: p["client"] for p in run.kinds["hospital_retired"]}
    for a in run.kinds["round_aborted"]:
        if a["round"] in voided:
            meaning = ("voided by what went into it (an input out of bounds, or an aggregate the hospitals refused): "
                       "nothing of it was applied; group testing over the next rounds looks for whose input it was"
                       + (f"; {named[a['round']]} was named by it and retired" if a["round"] in named else ""))
        elif a["reason"].startswith(RESTART):
            meaning = ("the round was open when the server stopped; nothing of it was aggregated or released, and "
                       "it is re-run under the next round number")
        elif a["round"] in final:
            meaning = ("hospitals refused it for good (e.g. their privacy budget is spent; see Refusals), leaving "
                       "too few: nothing of it was released")
        else:
            meaning = "the round could not be aggregated; nothing of it was released"
        rows[a["round"]] = [a["round"], a["reason"], meaning]
    for p in run.kinds["round_participation"]:
        if p["outcome"] == "aborted" and p["round"] not in rows:
            rows[p["round"]] = [p["round"], p.get("abort_reason") or "not recorded",
                                "the round could not be aggregated; nothing of it was released"]
    return [rows[r] for r in sorted(rows)]


# -- privacy -----------------------------------------------------------------------------------
def _mechanism(p: dict[str, Any]) -> str:
    share = p.get("share")
    if isinstance(share, dict):
        return f"distributed {share.get('mechanism', '?')} noise (each hospital adds a share)"
    if p["noise_multiplier"] == 0:
        return "none (noise multiplier 0)"
    return "subsampled Gaussian (DP-SGD)" if p.get("sample_rate") is not None else "Gaussian"


def privacy_rows(run: Run) -> list[list[Any]]:
    """Per hospital: its latest ledger entry's parameters and its status (refusals included)."""
    latest: dict[str, dict[str, Any]] = {}
    for p in sorted(run.kinds["ledger"], key=lambda p: p["round"]):
        latest[p["client"]] = p
    final = {p["client"]: p for p in run.kinds["hospital_refused"] if p.get("final") and p.get("client")}
    retired = {p["client"]: p for p in run.kinds["hospital_retired"]}
    rows = []
    for c in sorted(set(latest) | set(final) | set(retired)):
        p = latest.get(c)
        if c in final:
            f = final[c]
            status = f"out of the run: refused at round {f.get('round', '-')} ({f['reason']})"
        elif c in retired:
            status = f"out of the run: retired at round {retired[c]['round']} ({retired[c]['reason']})"
        elif p is None:
            status = "-"
        else:
            status = "OVER BUDGET" if p["epsilon"] > p["budget_epsilon"] else "within budget"
        if p is None:
            rows.append([c] + ["no ledger entry in this run"] + ["-"] * 13 + [status])
            continue
        share = p.get("share") if isinstance(p.get("share"), dict) else {}
        rows.append([c, _mechanism(p), _num(p["epsilon"]), _num(p.get("epsilon_training")),
                     _num(p.get("epsilon_selection")), _num(p.get("epsilon_setup")),
                     _num(share.get("epsilon_alone")) if share else "-",
                     f"{p['delta']:g}", _num(p["noise_multiplier"], "g"), _num(p.get("clip_norm"), "g"),
                     _num(p.get("sample_rate"), "g"), _num(p.get("steps"), "d"), p.get("accountant") or "-",
                     f"{p['budget_epsilon']:g}", p["round"], status])
    return rows


PRIVACY_HEADER = ["hospital", "mechanism", "ε (cumulative)", "ε of DP-SGD alone", "ε of model selection alone",
                  "ε of set-up sums alone", "ε of its own share alone", "δ",
                  "σ (noise multiplier)", "clip norm", "sampling rate", "steps", "accountant", "ε budget",
                  "at round", "status"]


def dp_policy_words(dp: dict[str, Any] | None) -> str:
    """The federation's DP policy as sentences."""
    if not dp:
        return "No DP policy: updates are not required to carry privacy accounting."
    words = ("Every update must carry a privacy ledger entry within these bounds. " if dp["required"] else
             "Updates may carry a privacy ledger entry; those that do must stay within these bounds. ")
    words += (f"Each hospital's cumulative ε at most {dp['max_epsilon']:g} at δ = {dp['delta']:g}; noise multiplier "
              f"σ at least {dp['min_noise_multiplier']:g}; per-example clipping norm at most "
              f"{dp['max_clip_norm']:g}.")
    d = dp.get("distributed")
    if d:
        words += (f" Distributed DP: {d['mechanism']} noise split across the hospitals, total noise multiplier "
                  f"{d['noise_multiplier']:g}, sampling rate {d['sample_rate']:g}, calibrated for {d['rounds']} "
                  f"round(s), assuming at least {d['min_honest']} honest hospital(s) add their share.")
    return words


# -- secure mode -------------------------------------------------------------------------------
def plan_options(run: Run, directory: Path) -> dict[int, dict[str, Any]]:
    """Round -> the options of the run's published round plan (empty if unreadable)."""
    from clinograph.core.errors import ClinographError

    from ..wire import parse_envelope
    from .verify import ARTEFACTS, MAX_ARTEFACT_BYTES, read_regular_file

    out: dict[int, dict[str, Any]] = {}
    for a in run.kinds["artefact"]:
        if a["kind"] != "round_plan":
            continue
        try:  # only a regular file, bounded: a FIFO in its place hung the report, /dev/zero filled memory
            data = read_regular_file(directory / ARTEFACTS / a["sha256"], limit=MAX_ARTEFACT_BYTES)
            body = json.loads(parse_envelope(data).payload)
        except (OSError, ValueError, ClinographError):  # a broken artefact is the verifier's finding
            body = None
        if isinstance(body, dict) and isinstance(body.get("round"), int) and isinstance(body.get("options"), dict):
            out[body["round"]] = {**body["options"], "min_clients": body.get("min_clients")}
    return out


def _describer(mode: str) -> Any:
    """The mode's own account for the report (:attr:`SecureMode.describe`); None for a mode this
    install does not have (e.g. ckks without TenSEAL) or that gives none."""
    from ..aggregation import create_mode

    try:
        return create_mode(mode).describe
    except (ClinographError, ImportError):
        return None


def secure_mode(run: Run, directory: Path) -> str:
    """The secure mode of the run's rounds and its parameters, in words and a table."""
    modes = run.secure_modes()
    plans = plan_options(run, directory)
    if not modes:
        return _p("No round plan recorded: the secure mode's parameters are not known.", cls="empty")
    html = ""
    latest = plans[max(plans)] if plans else {}
    rounds = f"round {max(plans)}'s signed plan" if plans else "no readable plan"
    for mode in modes:
        describe = _describer(mode)
        if describe is not None:
            paragraph, rows = describe(latest, run.kinds)
            html += _p(paragraph)
        else:
            rows = [(k, v) for k, v in sorted(latest.items()) if k.startswith(f"{mode}.")] or [
                ("parameters", "none recorded in the plan")]
        body = "".join(f'<tr><th scope="row">{escape(str(k))}</th><td>{escape(str(v))}</td></tr>' for k, v in rows)
        html += (f"<table><caption>{escape(f'Secure mode {mode}: parameters (from {rounds})')}</caption>"
                 f"<tbody>{body}</tbody></table>")
    return html


# -- release and selection ---------------------------------------------------------------------
def release_facts(run: Run) -> list[tuple[str, Any]]:
    """What identifies the released model, in every mode, and whether its bytes are in the trail."""
    rel = run.release
    if rel is None:
        return []
    facts: list[tuple[str, Any]] = [("released model: round", rel["round"]), ("secure mode", rel["secure_mode"])]
    if rel["model_sha256"]:
        published = any(a["sha256"] == rel["model_sha256"] and a["kind"] == "released_model"
                        for a in run.kinds["artefact"])
        facts += [("released model SHA-256", rel["model_sha256"]),
                  ("global state digest", rel["global_state_digest"]),
                  ("model in the trail", "yes: published as artefact release/global_model.json; the verification "
                   "above re-hashed its bytes" if published else "NO: no released_model artefact with this digest")]
    else:
        facts += [("released model SHA-256", NO_PLAINTEXT),
                  ("encrypted aggregate SHA-256 (identifies the release)",
                   rel.get("ciphertext_sha256") or "not recorded (trail written before it was)"),
                  ("what the hospitals received", "the sealed encrypted aggregate with this SHA-256, the same bytes "
                   "for every contributor; each decrypted it with its own key")]
        if rel["global_state_digest"] != UNKNOWN_STATE:
            facts.append(("global state digest", rel["global_state_digest"]))
    return facts


def candidate_run(runs: list[Run], run: Run, name: str, *, count: int) -> Run | None:
    """The latest run before ``run`` that trained candidate ``name``: its manifest's federation id
    is the federation's own with one candidate, else ``<id>-<candidate>`` (secure/runtime/models.py)."""
    for r in reversed([r for r in runs if r.index < run.index]):
        fed = r.manifest["federation_id"] if r.manifest else ""
        if (count > 1 and fed.endswith(f"-{name}"[:64])) or (count == 1 and r.release is not None):
            return r
    return None


def selection(run: Run, runs: list[Run]) -> str:
    """``model_selected`` (the kept round) and ``model_chosen`` (the kept candidate, with the run
    that trained it and the model that run released), in words."""
    html = ""
    for s in run.kinds["model_selected"]:
        why = (f"stopped early: no improvement for {s['patience']} round(s)" if s["stopped_early"]
               else "all planned rounds ran")
        trained = s["rounds_evaluated"] - 1  # the initial model is scored too (round 0, before any training)
        html += _p(f"Kept round {s['round']}: the global model after {s['round']} training round(s), with the lowest "
                   f"federated validation loss ({s['validation_loss']:.4g}) of the {s['rounds_evaluated']} models "
                   f"scored (the initial model and the model after each of {trained} training round(s)); {why}.")
        if s.get("disagreeing"):
            html += _p("Hospitals whose signed status disagreed with the majority (the majority's value was used): "
                       + ", ".join(f"{n} (round {r})" for n, r in sorted(s["disagreeing"].items())) + ".", cls="warn")
    for cut in run.kinds["candidates_eliminated"]:
        losses = ", ".join(f"{r['name']} {_num(r['validation_loss'], '.4g')}" for r in cut["candidates"])
        html += _p(f"Early elimination, rung {cut['rung']}: after {cut['rounds']} training round(s) each "
                   f"(federated validation loss: {escape(losses)}), kept {escape(', '.join(cut['kept']))}; eliminated "
                   f"{escape(', '.join(cut['eliminated']) or 'none')}. Rule: {escape(cut['rule'])} (η = {cut['eta']}; "
                   f"at most {cut['cost']} training rounds for all candidates).")
    for c in run.kinds["model_chosen"]:
        rows = "".join(
            f'<tr><th scope="row">{escape(r["name"])}{" (chosen)" if r["name"] == c["chosen"] else ""}</th>'
            f"<td>{escape(r['overrides'])}</td><td>{escape(_num(r['validation_loss'], '.4g'))}</td>"
            f"<td>{escape(str(r['round']) if r['round'] is not None else '-')}</td><td>{r['rounds_run']}</td></tr>"
            for r in c["candidates"])
        trained = candidate_run(runs, run, c["chosen"], count=len(c["candidates"]))
        rel = trained.release if trained is not None else None
        where = (f" It was trained in run {trained.index}" + (
            f", which released model SHA-256 {rel['model_sha256']}" if rel and rel["model_sha256"] else
            f", which released the encrypted aggregate SHA-256 {rel.get('ciphertext_sha256') or '(not recorded)'} (no "
            "plaintext model at the server)" if rel else ", which recorded no release") + ": the federation's "
            "released model." if trained is not None else " No earlier run of this directory trained it.")
        html += (_p(f"Chosen candidate: {c['chosen']}. Rule: {c['rule']} (minimum improvement {c['min_delta']:g})."
                    + where)
                 + "<table><caption>Candidate models (each ran as its own run of this trail)</caption><thead><tr>"
                 + "".join(f'<th scope="col">{h}</th>' for h in ("candidate", "config overrides", "validation loss",
                                                                "kept round", "rounds run"))
                 + f"</tr></thead><tbody>{rows}</tbody></table>")
    return html
