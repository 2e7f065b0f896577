"""Hostile but verifying logs and hostile directories: the report renders, the verifier is bounded."""

from __future__ import annotations

import os
import threading

import pytest
from clinograph.secure.audit import AuditTrail, render_report, verify_audit_dir
from clinograph.secure.audit import verify as verify_mod
from clinograph.secure.audit.plots import literal

from clinograph.core.errors import IntegrityError
from clinograph.core.identity import Identity

NASTY = [r"$\foo{$", "$x$", "a$b", r"\$", "$$", r"$\frac{1}{0$", "<b>&amp;</b>", "$^{{{$"]


def _hostile_log(directory):
    with AuditTrail(directory, identity=Identity.generate("server")) as trail:
        for r in range(2):
            trail.record("metrics", {"round": r, "per_client": {
                "h1": {name: 0.5 + 0.1 * r for name in NASTY}, "h2": {NASTY[0]: 0.1}}})
            trail.record("aggregate", {"round": r, "contributors": ["h1", "h2"],
                                       "module_coverage": {n: 2 for n in NASTY}, "global_state_digest": "0" * 64,
                                       "modules_updated": len(NASTY)})
            trail.record("feature_relevance", {"client": "h1", "round": r, "features": {n: 0.3 for n in NASTY}})
        trail.record("dag_outcome", {"round": 1, "concepts": NASTY[:3], "task": NASTY[0],
                                     "adjacency": [[0, 1, 0], [0, 0, 1], [0, 0, 0]],
                                     "tallies": {"strength": [[0, 2, 0], [0, 0, 1], [0, 0, 0]]}})


def test_mathtext_metric_names_render_in_a_verifying_log(tmp_path):
    d = tmp_path / "audit"
    _hostile_log(d)
    assert verify_audit_dir(d).ok
    html = render_report(d, out=tmp_path / "report.html").read_text()
    assert 'id="verification-ok"' in html and 'id="img-metrics-0"' in html and 'id="img-dag"' in html
    assert "<b>&amp;</b>" not in html and "&lt;b&gt;&amp;amp;&lt;/b&gt;" in html  # HTML-escaped
    assert "$\\foo{$" in html  # shown literally in the headings


@pytest.mark.parametrize("text", NASTY)
def test_literal_never_leaves_an_unescaped_dollar(text):
    import matplotlib.cbook as cbook

    assert not cbook.is_math_text(literal(text))


@pytest.fixture
def audit_dir(tmp_path):
    d = tmp_path / "audit"
    with AuditTrail(d, identity=Identity.generate("server")) as trail:
        trail.publish("round-0000/model.bin", b"weights", kind="global_model")
    assert verify_audit_dir(d).ok
    return d


def _verify_with_timeout(d, seconds=20.0):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", verify_audit_dir(d)), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "verify_audit_dir hung"
    return out["r"]


@pytest.mark.parametrize("name", ["audit.jsonl", "head.json", "artefact"])
def test_a_fifo_in_place_of_a_file_is_reported_not_read(audit_dir, name):
    target = next((audit_dir / "artefacts").iterdir()) if name == "artefact" else audit_dir / name
    target.unlink()
    os.mkfifo(target)
    r = _verify_with_timeout(audit_dir)
    assert not r.ok
    assert any("is a FIFO (named pipe), not a regular file" in p and target.name in p for p in r.problems)


@pytest.mark.parametrize("kind", ["FIFO (named pipe)", "directory"])
def test_a_published_artefact_replaced_by_no_regular_file_is_one_problem_naming_it(audit_dir, kind):
    """One tampering, one problem: it also read "extra file ...: no audit entry references it" (false:
    the entry that reported it references it), and the entry's own line named no artefact."""
    target = next((audit_dir / "artefacts").iterdir())
    target.unlink()
    os.mkfifo(target) if kind.startswith("FIFO") else target.mkdir()
    r = _verify_with_timeout(audit_dir)
    assert not r.ok and len(r.problems) == 1, r.problems
    assert r.problems[0].startswith("entry 1 (artefact 'round-0000/model.bin'): ") and f"is a {kind}" in r.problems[0]


def test_dev_zero_behind_a_symlink_is_reported_not_read(audit_dir):
    (audit_dir / "audit.jsonl").unlink()
    (audit_dir / "audit.jsonl").symlink_to("/dev/zero")
    r = _verify_with_timeout(audit_dir)
    assert not r.ok and any("audit.jsonl is a character device, not a regular file" in p for p in r.problems)


def test_a_directory_in_place_of_the_log_is_reported(audit_dir):
    (audit_dir / "audit.jsonl").unlink()
    (audit_dir / "audit.jsonl").mkdir()
    r = _verify_with_timeout(audit_dir)
    assert not r.ok and any("is a directory, not a regular file" in p for p in r.problems)


def test_an_oversized_file_names_the_file_and_the_bound(audit_dir, monkeypatch):
    monkeypatch.setattr(verify_mod, "MAX_HEAD_BYTES", 16)
    r = verify_audit_dir(audit_dir)
    assert not r.ok
    assert any("head.json is" in p and "over the verifier's bound of 16 bytes" in p for p in r.problems)
    with pytest.raises(IntegrityError, match=r"over the verifier's bound of 3 bytes"):
        verify_mod.read_regular_file(audit_dir / "audit.jsonl", limit=3)


def test_the_bounds_are_stated():
    assert verify_mod.MAX_LOG_BYTES == 1024 ** 3 and verify_mod.MAX_HEAD_BYTES == 64 * 1024
    assert verify_mod.MAX_ARTEFACT_BYTES == 256 * 1024 * 1024
    assert "1 GiB" in verify_mod.__doc__ and "256 MiB" in verify_mod.__doc__


def test_reopening_a_trail_refuses_a_fifo_artefact(tmp_path):
    server = Identity.generate("server")
    d = tmp_path / "audit"
    with AuditTrail(d, identity=server) as trail:
        trail.publish("round-0000/model.bin", b"weights", kind="global_model")
    art = next((d / "artefacts").iterdir())
    art.unlink()
    os.mkfifo(art)
    with pytest.raises(IntegrityError, match="does not verify.*FIFO"):
        AuditTrail(d, identity=server)


@pytest.mark.parametrize("depth", [40, 5_000, 200_000])
def test_a_deeply_nested_line_is_a_verification_failure_not_an_internal_error(audit_dir, depth):
    log = audit_dir / "audit.jsonl"
    log.write_bytes(log.read_bytes() + b'{"a":' + b"[" * depth + b"]" * depth + b"}\n")
    report = _verify_with_timeout(audit_dir)
    assert not report.ok and report.first_bad == 2
    if depth > 1000:  # past the decoder's recursion bound
        assert "nests JSON arrays or objects too deeply to parse" in report.problems[0]
    with pytest.raises(IntegrityError, match="does not verify"):
        AuditTrail(audit_dir, identity=Identity.generate("server"))



def test_an_extra_artefact_named_with_escapes_is_quoted_not_printed_raw(audit_dir):
    """The artefact's file name went into the problem (and `audit verify`'s terminal) as it was: a
    newline and a fake "VERIFIED" line, ANSI escapes. The unexpected top-level file was already quoted."""
    name = "x\x1b]0;t\x07\nVERIFIED: all good\u202e"
    (audit_dir / "artefacts" / name).write_bytes(b"")
    report = verify_audit_dir(audit_dir)
    assert not report.ok and len(report.problems) == 1
    assert report.problems[0].isprintable() and repr(name) in report.problems[0]


def test_a_number_that_overflows_to_infinity_is_refused_as_not_canonical():
    # before: 1e999 read as inf and canonical_json raised a bare ValueError (hypothesis found it in
    # test_consistency: one byte of a proof changed so that a number overflowed)
    import pytest
    from clinograph.secure.audit.canonical import parse_canonical

    from clinograph.core.errors import IntegrityError

    for line in (b'{"a":1e999}', b'{"a":-1E400}', b'{"a":[0.5,9e9999]}'):
        with pytest.raises(IntegrityError, match="not valid canonical JSON"):
            parse_canonical(line, what="entry 1")


@pytest.mark.parametrize("log", ["missing", "empty"])
def test_without_a_readable_log_the_artefacts_are_one_problem_not_one_a_file(tmp_path, log):
    """A run's directory without its audit.jsonl listed every artefact as an "extra file" (44 lines
    after the one that matters, for a 4-candidate simulate run)."""
    d = tmp_path / "audit"
    with AuditTrail(d, identity=Identity.generate("server")) as trail:
        for r in range(3):
            trail.publish(f"round-{r:04d}/model.bin", bytes([r]), kind="global_model")
    (d / "audit.jsonl").unlink() if log == "missing" else (d / "audit.jsonl").write_bytes(b"")
    r = verify_audit_dir(d)
    assert not r.ok and len(r.problems) == 2, r.problems  # the log, and the artefacts once
    assert r.problems[-1] == ("3 file(s) in artefacts/ not checked: no readable entry of audit.jsonl references "
                              "them (the log's own problem is above).")
