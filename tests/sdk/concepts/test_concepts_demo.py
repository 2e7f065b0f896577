"""`clinograph demo --concepts`: a real masked run whose audit verifies and whose report's DAG
section shows the DAG voted in that run (read back from the audit entries)."""

from __future__ import annotations

import re

import pytest
from clinograph.secure.audit.verify import scan_audit_dir
from typer.testing import CliRunner

from clinograph.cli import app


@pytest.mark.slow  # the concepts demo end to end
def test_concepts_demo_votes_audits_and_reports_the_dag(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["demo", "--concepts", "--out", str(out), "--rounds", "1", "--scale", "0.1"])
    assert result.exit_code == 0, result.output
    assert "verified" in result.output
    report, entries = scan_audit_dir(out / "audit")
    assert report.ok, report.problems
    manifests = [e.payload for e in entries if e.kind == "manifest"]
    assert {m["secure_mode"] for m in manifests} == {"masked"}
    assert [m["strategy"] for m in manifests] == ["dag_voting", "fedavg"]
    dags = [e.payload for e in entries if e.kind == "dag_outcome"]
    assert len(dags) == 1
    c, adj = dags[0]["concepts"], dags[0]["adjacency"]
    voted = {(c[i], c[j]) for i in range(len(c)) for j in range(len(c)) if adj[i][j]}
    assert ("PULMEMBOLUS", "SHUNT") in voted and ("VENTLUNG", "SHUNT") not in voted  # the wrong edge is outvoted
    html = (out / "concepts_report.html").read_text()
    assert 'id="verification-ok"' in html
    # the vote is the federation's first run (the one run, one candidate: the vote module), the
    # training its second: the report shows the DAG in the vote run's section
    assert '<section id="run-1">' in html or 'id="run1-dag"' in html
    section = re.search(r'<section id="run1-dag">(.*?)</section>', html, re.S).group(1)
    assert 'id="run1-img-dag"' in section
    rows = re.findall(r"<tr><td>([^<]+)</td><td>([^<]+)</td><td>(adopted|not adopted)</td>", section)
    assert {(a, b) for a, b, o in rows if o == "adopted"} == voted
    assert ("VENTLUNG", "SHUNT", "not adopted") in rows
