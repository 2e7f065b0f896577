"""verify_audit_dir: every kind of tampering is reported, naming the first bad entry."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from clinograph.secure.audit import AuditTrail, verify_audit_dir
from clinograph.secure.messages import ClientReport
from clinograph.secure.wire import parse_envelope, seal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clinograph.core.identity import Identity

from .conftest import DICT_HASH, FED, manifest, write_federation


def _copy(fed, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(fed.directory, dst)
    return dst


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file())


def test_pristine_directory_verifies(federation_dir):
    report = verify_audit_dir(federation_dir.directory, trusted_server_key=federation_dir.server.public.raw)
    assert report.ok and report.problems == [] and report.first_bad is None
    assert report.entries >= 50
    assert len(report.head_hash) == 64


@pytest.fixture(scope="module")
def private_copy(federation_dir, tmp_path_factory) -> Path:
    """A copy this module may mutate (each example restores what it changed)."""
    return _copy(federation_dir, tmp_path_factory.mktemp("mutable"))


@settings(max_examples=200, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_single_byte_change_anywhere_is_detected(private_copy, data):
    """Property: flip, insert or delete one byte at any offset of any file -> verify fails."""
    d = private_copy
    path = data.draw(st.sampled_from(_files(d)), label="file")
    original = path.read_bytes()
    blob = bytearray(original)
    op = data.draw(st.sampled_from(["flip", "insert", "delete"]), label="op")
    if op == "insert":
        at = data.draw(st.integers(0, len(blob)), label="offset")
        blob.insert(at, data.draw(st.integers(0, 255), label="byte"))
    else:
        at = data.draw(st.integers(0, len(blob) - 1), label="offset")
        if op == "flip":
            blob[at] ^= data.draw(st.integers(1, 255), label="xor")
        else:
            del blob[at]
    path.write_bytes(bytes(blob))
    try:
        report = verify_audit_dir(d)
    finally:
        path.write_bytes(original)
    assert not report.ok, f"{op} at {at} of {path.relative_to(d)} went undetected"
    assert report.problems


def test_changed_entry_is_named_as_first_bad(federation_dir, tmp_path):
    d = _copy(federation_dir, tmp_path)
    log = d / "audit.jsonl"
    lines = log.read_bytes().split(b"\n")
    i = next(n for n, x in enumerate(lines) if b'"kind":"ledger"' in x)
    obj = json.loads(lines[i])
    obj["payload"]["epsilon"] = 0.01  # an auditor-pleasing epsilon
    lines[i] = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    log.write_bytes(b"\n".join(lines))
    report = verify_audit_dir(d)
    assert not report.ok and report.first_bad == i
    assert f"entry {i} (kind 'ledger'): content does not match its hash" in report.problems[0]


def test_truncated_log_is_detected_by_the_signed_head(federation_dir, tmp_path):
    d = _copy(federation_dir, tmp_path)
    log = d / "audit.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:-3]))
    report = verify_audit_dir(d)
    assert not report.ok and report.first_bad == len(lines) - 3
    assert any("truncated" in p for p in report.problems)
    (d / "head.json").unlink()
    assert any("head.json is missing" in p for p in verify_audit_dir(d).problems)


def test_deleted_reordered_and_extra_files(federation_dir, tmp_path):
    d = _copy(federation_dir, tmp_path)
    victim = _files(d / "artefacts")[0]
    victim.unlink()
    report = verify_audit_dir(d)
    assert any(f"artefacts/{victim.name} is missing" in p for p in report.problems)
    d2 = _copy(federation_dir, tmp_path / "2")
    (d2 / "artefacts" / ("ab" * 32)).write_bytes(b"smuggled")
    (d2 / "notes.txt").write_text("x")
    problems = verify_audit_dir(d2).problems
    assert any("extra file artefacts/'abab" in p for p in problems)
    assert any("unexpected file 'notes.txt'" in p for p in problems)
    d3 = _copy(federation_dir, tmp_path / "3")
    lines = (d3 / "audit.jsonl").read_bytes().splitlines(keepends=True)
    lines[5], lines[6] = lines[6], lines[5]
    (d3 / "audit.jsonl").write_bytes(b"".join(lines))
    assert verify_audit_dir(d3).first_bad == 5


def test_rewritten_log_with_another_key_fails_only_against_the_trusted_key(tmp_path):
    real = Identity.generate("server")
    fed = write_federation(tmp_path / "run")
    assert verify_audit_dir(fed.directory, trusted_server_key=fed.server.public.raw).ok
    report = verify_audit_dir(fed.directory, trusted_server_key=real.public.raw)
    assert not report.ok and report.first_bad == 0
    assert "not by the trusted server key" in report.problems[0]


def test_envelope_with_a_forged_signature_or_altered_record_is_reported(tmp_path):
    server, hosp, mallory = (Identity.generate(n) for n in ("server", "hosp-a", "hosp-a"))
    d = tmp_path / "a"
    report = ClientReport(federation_id=FED, round=0, client="hosp-a", dictionary_hash=DICT_HASH)
    with AuditTrail(d, identity=server) as trail:
        trail.record("manifest", manifest(server, {"hosp-a": hosp}))
        trail.store_envelope(seal(report, mallory), kind="client_report", sender="hosp-a")
    # Recorded honestly as 'invalid': the verifier agrees, the log is fine.
    assert verify_audit_dir(d).ok
    # A server that claims 'valid' for it must re-sign the log; with the real key pinned, it
    # cannot forge: re-signing with the same key is the only way, and then the claim is checked.
    d2 = tmp_path / "b"
    with AuditTrail(d2, identity=server) as trail:
        trail.record("manifest", manifest(server, {"hosp-a": hosp}))
        trail._keys = {"hosp-a": mallory.public}  # a lying server checks against the wrong key
        trail.store_envelope(seal(report, mallory), kind="client_report", sender="hosp-a")
    result = verify_audit_dir(d2, trusted_server_key=server.public.raw)
    assert not result.ok and "checks as 'invalid', but the log recorded 'valid'" in result.problems[0]


def test_missing_directory_and_empty_log(tmp_path):
    assert not verify_audit_dir(tmp_path / "nope").ok
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "audit.jsonl").write_bytes(b"")
    report = verify_audit_dir(tmp_path / "e")
    assert not report.ok and "empty" in report.problems[0]


def test_published_envelope_with_a_bad_signature_is_reported(tmp_path):
    """A published plan is a server-signed envelope: the verifier checks that signature too."""
    server, impostor, hosp = Identity.generate("server"), Identity.generate("server"), Identity.generate("hosp-a")
    report = ClientReport(federation_id=FED, round=0, client="hosp-a", dictionary_hash=DICT_HASH)
    d = tmp_path / "a"
    with AuditTrail(d, identity=server) as trail:
        trail.record("manifest", manifest(server, {"hosp-a": hosp}))
        trail.publish("round-0000/plan.json", seal(report, server), kind="round_plan")
        assert verify_audit_dir(d).ok
        trail.publish("round-0001/plan.json", seal(report, impostor), kind="round_plan")
    result = verify_audit_dir(d)
    assert not result.ok and result.first_bad == 3
    assert "published envelope 'round-0001/plan.json' carries an invalid signature by 'server'" in result.problems[0]


def test_an_edited_artefact_entry_is_the_one_problem_its_file_not_called_extra(federation_dir, tmp_path):
    """Editing an `artefact` entry broke its hash, and the verifier then also called the file it
    names an "extra file no audit entry references": one tampering, two problems, the second
    false. The file is still the edited entry's; the entry is the problem."""
    d = _copy(federation_dir, tmp_path)
    log = d / "audit.jsonl"
    lines = log.read_bytes().split(b"\n")
    i = next(n for n, x in enumerate(lines) if b'"kind":"artefact"' in x)
    obj = json.loads(lines[i])
    obj["payload"]["meta"] = {"note": "edited"}
    lines[i] = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    log.write_bytes(b"\n".join(lines))
    report = verify_audit_dir(d)
    assert not report.ok and report.first_bad == i
    assert report.problems == [f"entry {i} (kind 'artefact'): content does not match its hash (the entry was "
                                "modified after it was written)."], report.problems


def test_a_changed_artefact_of_the_same_size_is_named_with_both_hashes(federation_dir, tmp_path):
    d = _copy(federation_dir, tmp_path)
    entries = [json.loads(x) for x in (d / "audit.jsonl").read_text().splitlines()]
    i, e = next((n, x) for n, x in enumerate(entries) if x["kind"] == "artefact")
    path = d / "artefacts" / e["payload"]["sha256"]
    blob = bytearray(path.read_bytes())
    blob[0] ^= 1
    path.write_bytes(bytes(blob))
    report = verify_audit_dir(d)
    actual = hashlib.sha256(bytes(blob)).hexdigest()
    assert report.problems == [
        f"entry {i} (artefact {e['payload']['name']!r}): artefact file artefacts/{e['payload']['sha256']} does not "
        f"match what the entry recorded (its SHA-256 is {actual[:16]}…, recorded {e['payload']['sha256'][:16]}…; "
        f"same size, {len(blob)} bytes); it was changed."], report.problems


def test_a_deleted_line_is_one_problem_and_one_summary_not_one_line_per_later_entry(federation_dir, tmp_path):
    """Deleting one line shifted every later entry's sequence number, and each was its own problem
    (40-odd lines for one deletion, the real ones pushed towards the cap)."""
    d = _copy(federation_dir, tmp_path)
    log = d / "audit.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:6] + lines[7:]))
    report = verify_audit_dir(d)
    n = len(lines) - 1
    assert report.first_bad == 6 and len(report.problems) == 3, report.problems
    assert report.problems[0].startswith("entry 6 carries sequence number 7;")
    assert report.problems[1] == (f"entries 7 to {n - 1} ({n - 7}) also carry sequence numbers that are not their "
                                  "position, after the same insertion, deletion or reordering; not checked further.")
    assert "the signed head says" in report.problems[2]


@pytest.mark.parametrize("forged", [None, "no envelope", "words", "client", "final", "round"])
def test_a_signed_hospital_refused_entry_must_report_the_refusal_it_names(tmp_path, forged):
    """hadv5: before, a ``hospital_refused`` entry marked signed verified with any refusal_sha256 -- a server could
    log its own words (or another hospital's name, or 'final') for a refusal it never stored."""
    from clinograph.secure.refusals import HospitalRefusal

    server, a, b = Identity.generate("server"), Identity.generate("hosp-a"), Identity.generate("hosp-b")
    refusal = seal(HospitalRefusal(hospital="hosp-a", round=1, stage="plan", error="ProtocolError",
                                   reason="masked.threshold t = 3 is below this hospital's rule", final=False), a)
    entry = {"round": 1, "stage": "plan", "client": "hosp-a", "reason": "ProtocolError: masked.threshold t = 3 is "
             "below this hospital's rule", "signed": True, "final": False}
    entry.update({"words": {"reason": "ProtocolError: network timeout"}, "client": {"client": "hosp-b"},
                  "final": {"final": True}, "round": {"round": 2}}.get(forged or "", {}))
    with AuditTrail(tmp_path / "a", identity=server) as trail:
        trail.record("manifest", manifest(server, {"hosp-a": a, "hosp-b": b}))
        digest = (trail.store_envelope(refusal, kind="hospital_refusal", sender="hosp-a") if forged != "no envelope"
                  else parse_envelope(refusal).digest())
        trail.record("hospital_refused", {**entry, "refusal_sha256": digest})
    report = verify_audit_dir(tmp_path / "a", trusted_server_key=server.public.raw)
    if forged is None:
        assert report.ok, report.problems
    elif forged == "no envelope":
        assert not report.ok and "no stored, validly signed hospital refusal" in report.problems[0]
    else:
        assert not report.ok and f"its {forged if forged != 'words' else 'reason'} differ" in report.problems[0]
