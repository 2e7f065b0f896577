"""Run ids: every opening of the trail starts a run, every entry carries it, runs never merge."""

from __future__ import annotations

import json

from clinograph.secure.audit import AuditTrail, verify_audit_dir
from clinograph.secure.audit.entry import GENESIS, make_entry, make_head

from clinograph.core.identity import Identity


def _lines(d):
    return [json.loads(x) for x in (d / "audit.jsonl").read_text().splitlines()]


def test_each_opening_is_a_run_and_every_entry_carries_its_id(tmp_path):
    server = Identity.generate("server")
    with AuditTrail(tmp_path / "a", identity=server) as trail:
        first = trail.run_id
        trail.record("note", {"x": 1})
    with AuditTrail(tmp_path / "a", identity=server) as trail:
        second = trail.run_id
        trail.record("note", {"x": 2})
    assert first != second and len(first) == 32
    lines = _lines(tmp_path / "a")
    assert [(e["kind"], e["run"]) for e in lines] == [("audit_open", first), ("note", first),
                                                      ("audit_reopen", second), ("note", second)]
    assert lines[0]["payload"]["run_id"] == first and lines[2]["payload"]["run_id"] == second
    report = verify_audit_dir(tmp_path / "a")
    assert report.ok, report.problems
    assert report.runs == [first, second]
    assert not report.trusted
    assert verify_audit_dir(tmp_path / "a", trusted_server_key=server.public.raw).trusted


def _write(d, server, entries):
    """Write a log of (kind, payload, run) signed by ``server`` (a server that lies about runs)."""
    d.mkdir()
    (d / "artefacts").mkdir()
    prev, out = GENESIS, []
    for seq, (kind, payload, run) in enumerate(entries):
        e = make_entry(identity=server, seq=seq, time=1.0 + seq, kind=kind, payload=payload, prev=prev, run=run)
        out.append(e)
        prev = e.hash
    (d / "audit.jsonl").write_bytes(b"".join(e.line() for e in out))
    (d / "head.json").write_bytes(make_head(identity=server, last=out[-1], time=out[-1].time))


def _open(server, run, fmt="clinograph-audit/2"):
    body = {"format": fmt, "server": {"name": server.name, "public_key": server.public.b64()}}
    if run is not None:
        body["run_id"] = run
    return body


def test_an_entry_moved_to_another_run_or_a_reused_run_id_is_reported(tmp_path):
    server = Identity.generate("server")
    a, b = "a" * 32, "b" * 32
    _write(tmp_path / "moved", server, [("audit_open", _open(server, a), a), ("note", {}, a),
                                        ("audit_reopen", _open(server, b), b), ("note", {}, a)])
    report = verify_audit_dir(tmp_path / "moved")
    assert not report.ok and "moved between runs" in report.problems[0] and report.first_bad == 3
    _write(tmp_path / "reused", server, [("audit_open", _open(server, a), a), ("audit_reopen", _open(server, a), a)])
    report = verify_audit_dir(tmp_path / "reused")
    assert not report.ok and "reuses run id" in report.problems[0]
    _write(tmp_path / "mismatch", server, [("audit_open", _open(server, a), b)])
    assert "opens run" in verify_audit_dir(tmp_path / "mismatch").problems[0]


def test_format_1_logs_without_run_ids_still_verify_and_reopen_as_a_new_run(tmp_path):
    server = Identity.generate("server")
    _write(tmp_path / "v1", server, [("audit_open", _open(server, None, "clinograph-audit/1"), None),
                                     ("note", {"x": 1}, None)])
    assert b'"run"' not in (tmp_path / "v1" / "audit.jsonl").read_bytes()
    assert verify_audit_dir(tmp_path / "v1").ok
    with AuditTrail(tmp_path / "v1", identity=server) as trail:
        run = trail.run_id
    report = verify_audit_dir(tmp_path / "v1")
    assert report.ok, report.problems
    assert report.runs == [None, run]
