"""One run's sections of the auditor's report (:mod:`.report`): manifest, participation,
refusals, coverage, privacy, DAG, rules, metrics, relevance, release, faults, secure mode,
selection and artefacts, each under a stable id (prefixed ``run<k>-`` for earlier runs)."""

from __future__ import annotations

import base64
import hashlib
from collections import defaultdict
from html import escape
from pathlib import Path
from typing import Any

from . import plots, report_run
from .html import _empty, _facts, _img, _table, _ts, describe_metric
from .runs import Run


class Page:
    """Section builder for one run (ids prefixed for all but the latest run)."""

    def __init__(self, run: Run, *, prefix: str, directory: Path, runs: list[Run], link: str | None = None):
        self.run, self.k, self.prefix, self.directory, self.link = run, run.kinds, prefix, directory, link
        self.runs = runs

    def id(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def section(self, name: str, title: str, body: str) -> str:
        return f'<section id="{self.id(name)}"><h3>{escape(title)}</h3>{body}</section>'

    def chart(self, name: str, png: str, alt: str, header: list[str], rows: list[list[Any]], caption: str,
              *, row_headers: bool = True) -> str:
        ident = self.id(f"img-{name}")
        return _img(ident, png, alt) + _table(header, rows, caption=f"Text version: {caption}", ident=f"{ident}-data",
                                              row_headers=row_headers)

    # -- sections ------------------------------------------------------------------------------
    def manifest(self) -> tuple[str, str]:
        m = self.run.manifest
        if m is None:
            manifest = _empty(self.id("manifest"), "No federation manifest recorded in this run.")
        else:
            rows = [[name, hashlib.sha256(base64.b64decode(key)).hexdigest()[:16]]
                    for name, key in sorted(m["hospitals"].items())]
            dp = m.get("dp_policy")
            facts = [("federation", m["federation_id"]), ("secure mode (manifest)", m["secure_mode"]),
                     ("strategy", m["strategy"]), ("environment", m["environment"]),
                     ("dictionary hash", m["dictionary_hash"]), ("spec digest", m["spec_digest"]),
                     ("DP policy", report_run.dp_policy_words(dp or None))]
            manifest = _facts(facts, caption="Federation") + _table(
                ["hospital", "key fingerprint (short)"], rows, caption="Enrolled hospitals")
        resolved = [[p["setting"], p["value"], p["rule"], p["line"]] for p in self.k["resolved_default"]]
        if resolved:  # settings the config left unwritten and a rule of the SDK resolved (audited)
            manifest += _table(["setting", "value", "rule", "what the operator was told"], resolved,
                               caption="Settings the SDK resolved (left unwritten in the hospital config)")
        options = sorted({o for m in self.k["manifest"] for o in m.get("insecure_options", [])}
                         | {p["option"] for p in self.k["insecure_option"]})
        insecure = (f'<div class="bad">This run used insecure options: {escape(", ".join(options))}.</div>'
                    if options else _empty(self.id("insecure"), "No insecure option was in use."))
        return (self.section("manifest", "Federation manifest", manifest),
                self.section("insecure", "Insecure options", insecure))

    def participation(self) -> str:
        rows = self._participation_rows()
        if not rows:
            return self.section("participation", "Participation per round",
                                _empty(self.id("participation"), "No round recorded in this run."))
        rounds = [r["round"] for r in rows]
        counts = {label: [len(r[key]) for r in rows] for label, key in
                  (("contributed", "contributed"), ("rejected by the server", "rejected"),
                   ("refused by the hospital", "refused"), ("dropped", "dropped"),
                   ("invited, no answer", "silent"))}
        alt = "Stacked bars, hospitals per round: " + "; ".join(
            f"round {r['round']}: {len(r['contributed'])} contributed, {len(r['rejected'])} rejected, "
            f"{len(r['refused'])} refused, {len(r['dropped'])} dropped, {len(r['silent'])} invited without answer"
            for r in rows[:20]) + ("; ..." if len(rows) > 20 else "") + ". Names are in the table below."
        table = [[r["round"], r["mode"], r["outcome"], ", ".join(r["invited"]), ", ".join(r["contributed"]) or "none",
                  "; ".join(f"{n} at {v['stage']}: {v['reason']}" for n, v in r["dropped"].items()) or "none",
                  "; ".join(f"{n} at {v['stage']}: {v['reason']}{' (signed)' if v.get('signed') else ''}"
                            for n, v in r["refused"].items()) or "none",
                  "; ".join(f"{n}: {why}" for n, why in r["rejected"].items()) or "none"] for r in rows]
        body = self.chart("participation", plots.participation(rounds, counts), alt,
                          ["round", "secure mode", "outcome", "invited", "contributed", "dropped (stage: reason)",
                           "refused by the hospital", "rejected by the server"], table,
                          "who took part in each round, by name")
        note = "" if self.k["round_participation"] else (
            '<p class="warn">This run has no round_participation entries (written before they existed): '
            "contributed is read from the aggregates; drops and refusals are not known.</p>")
        return self.section("participation", "Participation per round", note + body)

    def _participation_rows(self) -> list[dict[str, Any]]:
        if self.k["round_participation"]:
            return [{"round": p["round"], "mode": p["secure_mode"], "outcome": p["outcome"], "invited": p["invited"],
                     "contributed": p["contributed"], "dropped": p["dropped"], "refused": p["refused"],
                     "rejected": p["rejected"],
                     "silent": sorted(set(p["invited"]) - set(p["answered"]) - set(p["dropped"]) - set(p["refused"]))}
                    for p in sorted(self.k["round_participation"], key=lambda p: p["round"])]
        plans = {p["round"]: p for p in self.k["round_plan"]}
        aggs = {p["round"]: p for p in self.k["aggregate"]}
        rej: dict[int, dict[str, str]] = defaultdict(dict)
        for p in self.k["update_rejected"]:
            rej[p["round"]].setdefault(p["client"], p["reason"])
        out = []
        for r in sorted(set(plans) | set(aggs) | set(rej)):
            invited = plans[r]["participants"] if r in plans else []
            contributed = aggs[r]["contributors"] if r in aggs else []
            out.append({"round": r, "mode": plans[r]["secure_mode"] if r in plans else "?",
                        "outcome": "aggregated" if r in aggs else "aborted", "invited": invited,
                        "contributed": contributed, "dropped": {}, "refused": {}, "rejected": rej[r],
                        "silent": sorted(set(invited) - set(contributed) - set(rej[r]))})
        return out

    def refusals(self) -> str:
        refused = [[p.get("round") if p.get("round") is not None else "-", p["stage"],
                    p.get("client") or f"node {p.get('node')}", p["reason"],
                    "signed by the hospital" if p["signed"] else "transport's words (unsigned)",
                    "yes" if p.get("final") else "no"] for p in self.k["hospital_refused"]]
        rejected = [[p["round"], p["client"], p["reason"]] for p in self.k["update_rejected"]]
        body = "<h4>Refused by hospitals</h4>" + (
            _table(["round", "stage", "hospital", "reason", "signature", "out of the run"], refused,
                   caption="Messages hospitals refused, and why") if refused
            else "<p>No hospital refused a message in this run.</p>")
        body += "<h4>Rejected by the server</h4>" + (
            _table(["round", "hospital", "reason"], rejected, caption="Hospital messages the server refused")
            if rejected else "<p>The server rejected no hospital's message in this run.</p>")
        return self.section("refusals", "Refusals and rejections", body)

    def coverage(self) -> str:
        aggs = sorted(self.k["aggregate"], key=lambda p: p["round"])
        modules = sorted({m for p in aggs for m in p["module_coverage"]})
        if not modules:
            return self.section("coverage", "Module coverage", _empty(self.id("coverage"), "No aggregate recorded."))
        note = ""
        if len(modules) > plots.MAX_MODULES:
            note = f"<p>Showing the first {plots.MAX_MODULES} of {len(modules)} modules.</p>"
            modules = modules[:plots.MAX_MODULES]
        counts = [[p["module_coverage"].get(m, 0) for p in aggs] for m in modules]
        rounds = [p["round"] for p in aggs]
        alt = (f"Heatmap of contributors per module and round, {len(modules)} modules by {len(rounds)} rounds, "
               f"counts from {min(min(c) for c in counts)} to {max(max(c) for c in counts)}; "
               "every count is in the table below.")
        body = self.chart("coverage", plots.coverage(rounds, modules, counts), alt,
                          ["module"] + [f"round {r}" for r in rounds], [[m] + c for m, c in zip(modules, counts,
                                                                                                 strict=True)],
                          "contributors per module per round")
        return self.section("coverage", "Module coverage", note + body)

    def privacy(self) -> str:
        series: dict[str, tuple[list[int], list[float], float]] = {}
        for p in sorted(self.k["ledger"], key=lambda p: p["round"]):
            rounds, eps, _ = series.get(p["client"], ([], [], 0.0))
            series[p["client"]] = (rounds + [p["round"]], eps + [p["epsilon"]], p["budget_epsilon"])
        title = "Privacy ledger (ε per hospital, this run)"
        params = _table(report_run.PRIVACY_HEADER, report_run.privacy_rows(self.run),
                        caption="Privacy spent per hospital: latest ledger entry and status", ident=self.id("privacy-spent"))
        if not series:
            body = _empty(self.id("privacy"), "No ledger entry recorded.")
            shown = self.k["hospital_refused"] or self.k["hospital_retired"]
            return self.section("privacy", title, body + (params if shown else ""))
        alt = "Line chart of cumulative ε per hospital over rounds, budgets as grey dashed lines: " + "; ".join(
            f"{c} reaches ε {e[-1]:.3g} by round {r[-1]} of budget {b:g}" for c, (r, e, b) in sorted(series.items()))
        per_round = sorted({r for rounds, _, _ in series.values() for r in rounds})
        table = [[c] + [next((f"{x:.3f}" for rr, x in zip(r, e, strict=True) if rr == q), "-") for q in per_round]
                 for c, (r, e, _) in sorted(series.items())]
        body = (_img(self.id("img-privacy"), plots.privacy(series), alt)
                + _table(["hospital"] + [f"round {q}" for q in per_round], table,
                         caption="Text version: cumulative ε per hospital per round", ident=self.id("img-privacy-data"))
                + params
                + self._trust_models())
        return self.section("privacy", title, body)

    def _trust_models(self) -> str:
        """Distributed DP (docs/privacy.md): each hospital's latest ε under the federation's trust
        model (at least h honest hospitals add their noise share and survive the round) and the ε
        its own share alone would give if the others' noise were absent. Empty without shares."""
        latest: dict[str, dict] = {}
        for p in sorted(self.k["ledger"], key=lambda p: p["round"]):
            if isinstance(p.get("share"), dict):
                latest[p["client"]] = p
        if not latest:
            return ""
        def num(x: object) -> str:
            return f"{x:.3f}" if isinstance(x, int | float) and not isinstance(x, bool) else "?"

        rows = [[c, str(p["share"].get("mechanism", "?")), str(p["share"].get("min_honest", "?")),
                 num(p.get("epsilon")), num(p["share"].get("epsilon_alone")), p["round"]]
                for c, p in sorted(latest.items())]
        return _table(["hospital", "mechanism", "minimum honest set h",
                       "ε, distributed (while ≥ h hospitals add their share)",
                       "ε if the others' noise were absent (own share only)", "at round"], rows,
                      caption="ε per hospital under each trust model (distributed DP, δ as in the ledger)",
                      ident=self.id("privacy-trust"))

    def dag(self) -> str:
        if self.k["model_derived"]:  # a voted run's derivation: its own short run, between vote and training
            d = self.k["model_derived"][-1]
            return self.section("dag", "Model derived from the voted DAG", _facts([
                ("vote round", d["round"]), ("DAG (SHA-256 of the round's dag_outcome)", d["dag_sha256"]),
                ("initial model (SHA-256)", d["initial_sha256"]), ("model spec digest", d["spec_digest"]),
                ("shared parameters", d["parameters"]),
                ("hospitals that derived exactly this model", ", ".join(d["hospitals"]))],
                caption="The hospitals listed built this model from the voted DAG and the public seed and sent it "
                        "signed, the largest group on the server's own DAG; any other hospital is named under "
                        "refusals. The next run trains it, with them."))
        if not self.k["dag_outcome"]:
            return self.section("dag", "DAG vote", _empty(self.id("dag"), "No DAG vote recorded."))
        d = max(self.k["dag_outcome"], key=lambda p: p["round"])
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
        adopted = [f"{c[i]} -> {c[j]}" for i in range(n) for j in range(n) if adj[i][j]]
        alt = f"Directed graph of {n} concepts with {len(adopted)} adopted edges: {', '.join(adopted) or 'none'}."
        body = (f"<p>{escape(' '.join(notes))} Edge labels: {'strength' if 'strength' in square else 'tally'}.</p>"
                + self.chart("dag", plots.dag(c, adj, votes), alt, ["from", "to", "outcome"] + names, edges,
                             "edges voted on", row_headers=False))
        return self.section("dag", "DAG vote", body)

    def rules(self) -> str:
        """FedNSL's learned rules (``rules`` entries, latest round): per head, a table a clinician can read."""
        if not self.k["rules"]:
            return self.section("rules", "Learned rules (FedNSL)", _empty(self.id("rules"), "No rules recorded."))
        d = max(self.k["rules"], key=lambda p: p["round"])
        body = (f"<p>Round {d['round']}, generator {escape(d['generator'])}, {d['contributors']} contributing "
                f"hospital(s), {d['n_bodies']} candidate bodies per head. Prior: the federation's learned probability "
                "of the rule among all bodies for its head; posterior: the same under the mixture of the hospitals' "
                "posteriors (summed by secure aggregation); support: fraction of the federation's labelled patients "
                "for whom body and head both hold (fuzzy); coverage: fraction for whom the body holds; confidence: "
                "support / coverage.</p>")
        for h in d["heads"]:
            rows = [[r["rule"], f"{r['prior']:.4f}", f"{r['posterior']:.4f}", f"{r['support']:.3f}",
                     f"{r['coverage']:.3f}", "-" if r.get("confidence") is None else f"{r['confidence']:.2f}"]
                    for r in h["rules"]]
            body += _table(["rule", "prior", "posterior", "support", "coverage", "confidence"], rows,
                           caption=f"Top rules for {h['head']}")
        return self.section("rules", "Learned rules (FedNSL)", body)

    def metrics(self) -> str:
        by_metric: dict[str, dict[str, tuple[list[int], list[float]]]] = defaultdict(dict)
        for p in sorted(self.k["metrics"], key=lambda p: p["round"]):
            for client, values in p["per_client"].items():
                for name, value in values.items():
                    rounds, vals = by_metric[name].get(client, ([], []))
                    by_metric[name][client] = (rounds + [p["round"]], vals + [value])
        if not by_metric:
            return self.section("metrics", "Metrics per hospital", _empty(self.id("metrics"), "No metrics released."))
        body = "<p>Metrics each hospital chose to release, measured on its own data.</p>"
        for i, (m, s) in enumerate(sorted(by_metric.items())):
            meaning = describe_metric(m)
            rounds = sorted({r for rr, _ in s.values() for r in rr})
            rows = [[c] + [next((f"{v:.4g}" for q, v in zip(rr, vv, strict=True) if q == r), "-") for r in rounds]
                    for c, (rr, vv) in sorted(s.items())]
            alt = f"Line chart of {m} ({meaning}) per hospital over rounds: " + "; ".join(
                f"{c} from {vv[0]:.3g} to {vv[-1]:.3g}" for c, (_, vv) in sorted(s.items())) + "."
            body += (f"<h4>{escape(m)}</h4><p>{escape(meaning)}.</p>"
                     + self.chart(f"metrics-{i}", plots.metrics(m, s), alt, ["hospital"] + [f"round {r}" for r in rounds],
                                  rows, f"{m} per hospital per round"))
        return self.section("metrics", "Metrics per hospital", body)

    def relevance(self) -> str:
        title = "Feature relevance (sites that published their masks)"
        latest = {p["client"]: p["features"] for p in sorted(self.k["feature_relevance"],
                                                            key=lambda p: p.get("round") or 0)}
        latest = {c: f for c, f in latest.items() if f}
        if not latest:
            return self.section("feature-relevance", title,
                                _empty(self.id("feature-relevance"), "No site published its feature relevance."))
        features = sorted({f for feats in latest.values() for f in feats})
        rows = [[f] + [f"{abs(latest[c].get(f, 0.0)) / (max(abs(v) for v in latest[c].values()) or 1.0):.2f}"
                       for c in sorted(latest)] for f in features]
        alt = (f"Radar chart of {len(latest)} sites over {len(features)} features, each site's |relevance| scaled "
               "to its own maximum; values in the table below.")
        body = ("<p>Latest published relevance per site; each site's |relevance| is scaled to its own "
                "maximum (1 = that site's most relevant feature), so the radar compares profiles.</p>"
                + self.chart("feature-relevance", plots.radar(latest), alt, ["feature"] + sorted(latest), rows,
                             "scaled |relevance| per feature and site"))
        return self.section("feature-relevance", title, body)

    def release(self) -> str:
        end = self.run.ended
        facts: list[tuple[str, Any]] = report_run.release_facts(self.run)
        if end is not None:
            facts += [("run ended", end["status"]), ("why", end["reason"]),
                      ("rounds", f"{end['rounds_completed']} of {end['rounds_planned']} planned")]
        body = (_facts(facts, caption="What this run released and how it ended") if facts else
                _empty(self.id("release"), "This run recorded no release and no end (it may still be running, "
                                           "have crashed, or predate release entries)."))
        return self.section("release", "Released model and end of run", body)

    def faults(self) -> str:
        rows = report_run.faults(self.run)
        body = (_table(["round", "reason", "what it means"], rows, caption="Rounds aborted in this run, and why")
                if rows else _empty(self.id("faults"), "No round was aborted in this run."))
        return self.section("faults", "Aborted rounds", body)

    def mode(self) -> str:
        return self.section("secure-mode", "Secure mode and its parameters",
                            report_run.secure_mode(self.run, self.directory))

    def selection(self) -> str:
        body = report_run.selection(self.run, self.runs) or _empty(self.id("selection"), "No model selection recorded in "
                                                                                "this run.")
        return self.section("selection", "Model selection", body)

    def artefacts(self) -> str:
        rows = [[p["name"], p["kind"], p["size"], p["sha256"][:16]] for p in self.k["artefact"]]
        rows += [[f"envelope from {p['sender']}", p["kind"], p["size"], p["sha256"][:16]] for p in self.k["envelope"]]
        body = (_table(["name", "kind", "bytes", "sha256 (short)"], rows, caption="Artefacts of this run") if rows
                else _empty(self.id("artefacts"), "No artefact published."))
        return self.section("artefacts", "Published artefacts", body)

    def render(self, *, of: int, latest: bool) -> str:
        manifest, insecure = self.manifest()
        parts = [manifest, insecure, self.mode(), self.participation(), self.faults(), self.refusals(),
                 self.coverage(), self.privacy(), self.dag(), self.rules(), self.metrics(), self.relevance(),
                 self.selection(), self.release(), self.artefacts()]
        label = f"Run {self.run.index} of {of}" + (" (latest)" if latest else "")
        return (f'<article id="run-{self.run.index}"><h2>{escape(label)}: '
                f"<code>{escape(self.run.run_id or 'format 1, no run id')}</code></h2>"
                f"<p>Opened {escape(_ts(self.run.opened))}; secure mode per round: "
                f"{escape(', '.join(self.run.secure_modes()) or 'no round')}.</p>"
                + (f'<p class="warn" id="{self.id("continues")}">{escape(self.link)}</p>' if self.link else "")
                + f"{''.join(parts)}</article>")
