"""The auditor's report: one self-contained HTML page rendered from an audit directory.

The page is verified first (its verdict heads the page) and then read only through the
entries that parsed. Figures are PNGs embedded as ``data:`` URIs; there is no script, no
external resource, and a Content-Security-Policy forbids loading any. Every section has a
stable id (``verification``, ``manifest``, ``insecure``, ``participation``, ``coverage``,
``privacy``, ``dag``, ``metrics``, ``feature-relevance``, ``artefacts``) and says so when the
log holds no data for it rather than disappearing. All text from the log is HTML-escaped.
"""

from __future__ import annotations

import base64
import hashlib
from collections import defaultdict
from html import escape
from pathlib import Path
from typing import Any

from . import plots
from .entry import AuditEntry
from .kinds import check_payload
from .verify import VerifyReport, scan_audit_dir

CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1000px;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
.ok{background:#e6f4ea;border-left:6px solid #2a9d8f;padding:.6em}.bad{background:#fdecea;border-left:6px solid #c0392b;padding:.6em}
.empty{color:#777;font-style:italic}code{font-size:.85em}img{max-width:100%}"""
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def _img(ident: str, png_b64: str, alt: str) -> str:
    return f'<img id="{ident}" alt="{escape(alt)}" src="data:image/png;base64,{png_b64}">'


def _empty(section: str, what: str) -> str:
    return f'<p class="empty" id="{section}-empty">{escape(what)}</p>'


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _section(ident: str, title: str, body: str) -> str:
    return f'<section id="{ident}"><h2>{escape(title)}</h2>{body}</section>'


def _by_kind(entries: list[AuditEntry]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in entries:
        if check_payload(e.kind, e.payload) is None:  # a broken log may hold malformed payloads
            out[e.kind].append(e.payload)
    return out


def _verification(report: VerifyReport) -> str:
    if report.ok:
        body = (f'<div class="ok" id="verification-ok">Verified: {report.entries} entries, chain, '
                f"signatures, head and every artefact check.</div>")
    else:
        items = "".join(f"<li>{escape(p)}</li>" for p in report.problems)
        body = (f'<div class="bad" id="verification-failed">Verification FAILED (first bad entry: '
                f"{report.first_bad}). Do not trust what follows.<ul>{items}</ul></div>")
    body += (f"<p>Head hash: <code>{escape(str(report.head_hash))}</code><br>Server key fingerprint: "
             f"<code>{escape(str(report.server_key_fingerprint))}</code></p>")
    return _section("verification", "Verification", body)


def _manifest(k: dict[str, list[dict[str, Any]]]) -> tuple[str, str]:
    if not k["manifest"]:
        manifest = _empty("manifest", "No federation manifest recorded.")
    else:
        m = k["manifest"][-1]
        rows = [[name, hashlib.sha256(base64.b64decode(key)).hexdigest()[:16]]
                for name, key in sorted(m["hospitals"].items())]
        dp = m.get("dp_policy") or {}
        facts = [["federation", m["federation_id"]], ["secure mode", m["secure_mode"]],
                 ["strategy", m["strategy"]], ["environment", m["environment"]],
                 ["dictionary hash", m["dictionary_hash"]], ["spec digest", m["spec_digest"]],
                 ["DP policy", ", ".join(f"{a}={b}" for a, b in dp.items()) or "none"]]
        manifest = _table(["", ""], facts) + "<h3>Enrolled hospitals</h3>" + _table(
            ["hospital", "key fingerprint"], rows)
    options = sorted({o for m in k["manifest"] for o in m.get("insecure_options", [])}
                     | {p["option"] for p in k["insecure_option"]})
    insecure = (f'<div class="bad">This run used insecure options: {escape(", ".join(options))}.</div>'
                if options else _empty("insecure", "No insecure option was in use."))
    return _section("manifest", "Federation manifest", manifest), _section("insecure", "Insecure options", insecure)


def _participation(k: dict[str, list[dict[str, Any]]]) -> str:
    invited: dict[int, set[str]] = defaultdict(set)
    acc: dict[int, set[str]] = defaultdict(set)
    rej: dict[int, set[str]] = defaultdict(set)
    for p in k["round_plan"]:
        invited[p["round"]].update(p["participants"])
    for p in k["update_accepted"]:
        acc[p["round"]].add(p["client"])
    for p in k["update_rejected"]:
        rej[p["round"]].add(p["client"])
    rounds = sorted(set(invited) | set(acc) | set(rej))
    if not rounds:
        return _section("participation", "Participation per round", _empty("participation", "No round recorded."))
    a = [len(acc[r] - rej[r]) for r in rounds]
    j = [len(rej[r]) for r in rounds]
    s = [len(invited[r] - acc[r] - rej[r]) for r in rounds]
    reasons = [[p["round"], p["client"], p["reason"]] for p in k["update_rejected"]]
    body = _img("img-participation", plots.participation(rounds, a, j, s), "participation per round")
    body += "<h3>Rejected updates</h3>" + (_table(["round", "hospital", "reason"], reasons) if reasons
                                            else "<p>None.</p>")
    return _section("participation", "Participation per round", body)


def _coverage(k: dict[str, list[dict[str, Any]]]) -> str:
    aggs = sorted(k["aggregate"], key=lambda p: p["round"])
    modules = sorted({m for p in aggs for m in p["module_coverage"]})
    if not modules:
        return _section("coverage", "Module coverage", _empty("coverage", "No aggregate recorded."))
    note = ""
    if len(modules) > plots.MAX_MODULES:
        note = f"<p>Showing the first {plots.MAX_MODULES} of {len(modules)} modules.</p>"
        modules = modules[:plots.MAX_MODULES]
    counts = [[p["module_coverage"].get(m, 0) for p in aggs] for m in modules]
    img = plots.coverage([p["round"] for p in aggs], modules, counts)
    return _section("coverage", "Module coverage", note + _img("img-coverage", img, "module coverage"))


def _privacy(k: dict[str, list[dict[str, Any]]]) -> str:
    series: dict[str, tuple[list[int], list[float], float]] = {}
    for p in sorted(k["ledger"], key=lambda p: p["round"]):
        rounds, eps, _ = series.get(p["client"], ([], [], 0.0))
        series[p["client"]] = (rounds + [p["round"]], eps + [p["epsilon"]], p["budget_epsilon"])
    if not series:
        return _section("privacy", "Privacy ledger (ε per hospital)", _empty("privacy", "No ledger entry recorded."))
    rows = [[c, f"{e[-1]:.3f}", f"{b:g}", "OVER BUDGET" if e[-1] > b else "within budget"]
            for c, (_, e, b) in sorted(series.items())]
    body = _img("img-privacy", plots.privacy(series), "epsilon per hospital") + _table(
        ["hospital", "latest ε", "budget", "status"], rows)
    return _section("privacy", "Privacy ledger (ε per hospital)", body)


def _dag(k: dict[str, list[dict[str, Any]]]) -> str:
    if not k["dag_outcome"]:
        return _section("dag", "DAG vote", _empty("dag", "No DAG vote recorded."))
    d = max(k["dag_outcome"], key=lambda p: p["round"])
    c, adj, n = d["concepts"], d["adjacency"], len(d["concepts"])
    square = {name: m for name, m in d["tallies"].items() if len(m) == n}
    votes = square.get("strength") or next(iter(square.values()), [[0.0] * n for _ in range(n)])
    names = sorted(square)
    edges = [[c[i], c[j], "adopted" if adj[i][j] else "not adopted"] + [f"{square[m][i][j]:g}" for m in names]
             for i in range(n) for j in range(n) if adj[i][j] or votes[i][j]]
    notes = [f"Round {d['round']}."]
    if d.get("task"):
        notes.append(f"Task: {d['task']}.")
    if d.get("dropped_cycle_edges"):
        notes.append("Dropped to break cycles: " + ", ".join(f"{a} -> {b}" for a, b in d["dropped_cycle_edges"]) + ".")
    if d.get("added_task_parent"):
        notes.append("Added as task parent: {} -> {}.".format(*d["added_task_parent"]))
    body = (f"<p>{escape(' '.join(notes))} Edge labels: {'strength' if 'strength' in square else 'tally'}.</p>"
            + _img("img-dag", plots.dag(c, adj, votes), "voted DAG")
            + _table(["from", "to", "outcome"] + names, edges))
    return _section("dag", "DAG vote", body)


def _metrics(k: dict[str, list[dict[str, Any]]]) -> str:
    by_metric: dict[str, dict[str, tuple[list[int], list[float]]]] = defaultdict(dict)
    for p in sorted(k["metrics"], key=lambda p: p["round"]):
        for client, values in p["per_client"].items():
            for name, value in values.items():
                rounds, vals = by_metric[name].get(client, ([], []))
                by_metric[name][client] = (rounds + [p["round"]], vals + [value])
    if not by_metric:
        return _section("metrics", "Metrics per hospital", _empty("metrics", "No metrics released."))
    body = "".join(f"<h3>{escape(m)}</h3>" + _img(f"img-metrics-{i}", plots.metrics(m, s), m)
                   for i, (m, s) in enumerate(sorted(by_metric.items())))
    return _section("metrics", "Metrics per hospital", body)


def _relevance(k: dict[str, list[dict[str, Any]]]) -> str:
    latest = {p["client"]: p["features"] for p in sorted(k["feature_relevance"], key=lambda p: p.get("round") or 0)}
    latest = {c: f for c, f in latest.items() if f}
    if not latest:
        return _section("feature-relevance", "Feature relevance (sites that published their masks)",
                        _empty("feature-relevance", "No site published its feature relevance."))
    body = ("<p>Latest published relevance per site; each site's |relevance| is scaled to its own "
            "maximum, so the radar compares profiles.</p>"
            + _img("img-feature-relevance", plots.radar(latest), "feature relevance radar"))
    return _section("feature-relevance", "Feature relevance (sites that published their masks)", body)


def _artefacts(k: dict[str, list[dict[str, Any]]]) -> str:
    rows = [[p["name"], p["kind"], p["size"], p["sha256"][:16]] for p in k["artefact"]]
    rows += [[f"envelope from {p['sender']}", p["kind"], p["size"], p["sha256"][:16]] for p in k["envelope"]]
    body = _table(["name", "kind", "bytes", "sha256"], rows) if rows else _empty("artefacts", "No artefact published.")
    return _section("artefacts", "Published artefacts", body)


def render_report(directory: Path, *, out: Path) -> Path:
    """Verify ``directory`` and write the report to ``out`` (a file outside the audit
    directory: the verifier treats any extra file there as tampering). Returns ``out``."""
    report, entries = scan_audit_dir(Path(directory))
    k = _by_kind(entries)
    fed = k["manifest"][-1]["federation_id"] if k["manifest"] else "(no manifest)"
    manifest, insecure = _manifest(k)
    parts = [_verification(report), manifest, insecure, _participation(k), _coverage(k), _privacy(k),
             _dag(k), _metrics(k), _relevance(k), _artefacts(k)]
    html = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f"<title>Clinograph audit report: {escape(fed)}</title><style>{CSS}</style></head><body>"
            f"<h1>Clinograph audit report: {escape(fed)}</h1><p>{report.entries} entries in "
            f"<code>{escape(str(directory))}</code></p>{''.join(parts)}</body></html>")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    return out
