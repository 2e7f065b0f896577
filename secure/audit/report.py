"""The auditor's report: one self-contained HTML page rendered from an audit directory.

The page is verified first (its verdict heads the page, and says plainly whether the signer
was checked against a trusted key or the log is only self-consistent) and then read only
through the entries that parsed, **run by run** (:mod:`.runs`): several runs in one directory
are never merged. Figures are PNGs embedded as ``data:`` URIs, each with a descriptive alt
text and a table holding the same numbers (the text version); there is no script, no
external resource, and a Content-Security-Policy forbids loading any.

Stable ids: ``verification``, ``runs``, and per run the sections ``manifest``, ``insecure``,
``secure-mode``, ``participation``, ``faults`` (aborted rounds), ``refusals``, ``coverage``,
``privacy`` (with the table ``privacy-spent``), ``dag``, ``metrics``, ``feature-relevance``,
``selection``, ``release``, ``artefacts``, and ``continues`` for a run that resumes or extends
another (:mod:`.report_run` builds what a run decided) -- plain for the latest run, prefixed
``run<k>-`` for earlier runs (run 1 is the first). A section without data says so rather
than disappearing. All text from the log is HTML-escaped.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from . import report_run
from .html import CSP, CSS, FINGERPRINT, _facts, _table, _ts, describe_metric  # noqa: F401 -- public here too
from .report_page import Page
from .runs import Run, split_runs
from .verify import TrustedKey, VerifyReport, scan_audit_dir


def _verification(report: VerifyReport, *, pinned: bool) -> str:
    if report.ok:
        body = (f'<div class="ok" id="verification-ok">Verified: {report.entries} entries, chain, signatures, head '
                f"and every artefact check.</div>")
    else:
        items = "".join(f"<li>{escape(p)}</li>" for p in report.problems)
        body = (f'<div class="bad" id="verification-failed">Verification FAILED (first bad entry: '
                f"{report.first_bad}). Do not trust what follows.<ul>{items}</ul></div>")
    fp = escape(str(report.server_key_fingerprint))
    if report.trusted:
        trust = (f'<div class="ok" id="signer-trusted">Signer checked: the log is signed by the trusted server key '
                 f"given to this report (fingerprint <code>{fp}</code>).</div>")
    elif pinned:
        trust = ('<div class="bad" id="signer-wrong">Signer check FAILED: the log is not signed by the trusted '
                 "server key given to this report.</div>")
    else:
        trust = ('<div class="warn" id="signer-unchecked">Signer NOT checked: no trusted server key was given, so '
                 "“verified” only means the log is self-consistent under the key it names itself (fingerprint "
                 f"<code>{fp}</code>). Anyone can write a self-consistent log with their own key. Compare this "
                 "fingerprint with the server's, or render with <code>clinograph audit report --trusted-key "
                 "server.pub</code>.</div>")
    body += trust + _facts([("head hash", report.head_hash), ("server key fingerprint", report.server_key_fingerprint),
                            ("runs in this directory", len(report.runs))], caption="Identifiers")
    body += f"<p>{escape(FINGERPRINT)} Compare the head hash with one published elsewhere to rule out a rollback.</p>"
    return f'<section id="verification"><h2>Verification</h2>{body}</section>'


def _released(rel: dict[str, Any] | None) -> str:
    if rel is None:
        return "none"
    if rel["model_sha256"]:
        return rel["model_sha256"][:16]
    sealed = rel.get("ciphertext_sha256")
    return f"no plaintext model; encrypted aggregate {sealed[:16]}" if sealed else "no plaintext model"


def _round_span(run: Run, directory: Path) -> str:
    """``0-4``, with the evaluation-only scoring round named (its signed plan's ``run.phase`` is
    ``score``): it is a round of the protocol, not one of the run's training rounds."""
    rounds = run.rounds()
    if not rounds:
        return "none"
    span = f"{rounds[0]}-{rounds[-1]}" if len(rounds) > 1 else str(rounds[0])
    scoring = [r for r, o in sorted(report_run.plan_options(run, directory).items()) if o.get("run.phase") == "score"]
    return span + "".join(f" (round {r}: scoring the last model, no training)" for r in scoring)


def _runs(runs: list[Run], links: dict[int, str], directory: Path) -> str:
    rows = []
    for run in runs:
        end, rel = run.ended, run.release
        rows.append([run.index, run.run_id or "(format 1)", _ts(run.opened), ", ".join(run.secure_modes()) or "-",
                     _round_span(run, directory), links.get(run.index, "-"),
                     f"{end['status']}: {end['reason']}" if end else "not recorded", _released(rel)])
    body = ("<p>Each opening of the audit trail is a run with its own id; runs are shown separately below, the "
            "latest last. A run that resumes after a server restart, or extends an ended federation, continues "
            "the round numbers of the run it continues (named in the table); each other run (e.g. each candidate model's) numbers "
            "its own rounds.</p>"
            + _table(["run", "run id", "opened", "secure mode", "rounds", "continues", "end",
                      "released model (sha256, short)"], rows, caption="Runs in this directory"))
    return f'<section id="runs"><h2>Runs</h2>{body}</section>'


def render_report(directory: Path, *, out: Path, trusted_server_key: TrustedKey = None) -> Path:
    """Verify ``directory`` (against ``trusted_server_key`` if given) and write the report to
    ``out`` (a file outside the audit directory: the verifier treats any extra file there as
    tampering: refused with a ConfigError). Returns ``out``."""
    from clinograph.core.errors import ConfigError

    directory, out = Path(directory), Path(out)
    if out.resolve().is_relative_to(directory.resolve()):
        raise ConfigError(f"render_report: out={out} is inside the audit directory {directory}; any extra file "
                          "there fails verification. Fix: write the report elsewhere.")
    report, entries = scan_audit_dir(directory, trusted_server_key=trusted_server_key)
    runs = split_runs(entries)
    feds = sorted({m["federation_id"] for r in runs for m in r.kinds["manifest"]})
    fed = ", ".join(feds) or "(no manifest)"
    links = report_run.run_links(runs)
    articles = "".join(Page(run, prefix="" if run is runs[-1] else f"run{run.index}-", directory=Path(directory),
                             runs=runs, link=links.get(run.index)).render(of=len(runs), latest=run is runs[-1]) for run in runs)
    html = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f"<title>Clinograph audit report: {escape(fed)}</title><style>{CSS}</style></head><body><main>"
            f"<h1>Clinograph audit report: {escape(fed)}</h1><p>{report.entries} entries in {len(runs)} run(s) in "
            f"<code>{escape(str(directory))}</code></p>{_verification(report, pinned=trusted_server_key is not None)}"
            f"{_runs(runs, links, directory)}{articles}</main></body></html>")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    return out
