"""AuditTrail: what it writes, what it refuses, reopening."""

from __future__ import annotations

import hashlib
import json
import pickle

import numpy as np
import pandas as pd
import pytest
from clinograph.secure.audit import AuditTrail, verify_audit_dir
from clinograph.secure.audit.entry import entry_hash
from clinograph.secure.messages import ClientReport
from clinograph.secure.wire import seal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clinograph.core.errors import ConfigError, IntegrityError, ProtocolError
from clinograph.core.identity import Identity

from .conftest import DICT_HASH, FED, manifest


def _lines(directory):
    return [json.loads(x) for x in (directory / "audit.jsonl").read_text().splitlines()]


def test_entries_are_chained_numbered_and_signed(federation_dir):
    lines = _lines(federation_dir.directory)
    assert lines[0]["kind"] == "audit_open"
    assert lines[0]["prev"] == "0" * 64
    for i, (a, b) in enumerate(zip(lines, lines[1:], strict=False)):
        assert b["seq"] == i + 1 and b["prev"] == a["hash"]
    last = lines[-1]
    assert last["hash"] == entry_hash(seq=last["seq"], time=last["time"], kind=last["kind"],
                                      payload=last["payload"], prev=last["prev"], run=last["run"])
    head = json.loads((federation_dir.directory / "head.json").read_text())
    assert (head["seq"], head["hash"]) == (last["seq"], last["hash"])
    report = verify_audit_dir(federation_dir.directory, trusted_server_key=federation_dir.server.public.raw)
    assert report.ok, report.problems
    assert report.entries == len(lines)


def test_publish_writes_content_addressed_file_and_entry(tmp_path):
    server = Identity.generate("server")
    with AuditTrail(tmp_path / "a", identity=server) as trail:
        sha = trail.publish("round-0000/global_model.json", b"weights", kind="global_model", meta={"round": 0})
        entry = trail.head
    assert sha == hashlib.sha256(b"weights").hexdigest()
    assert (tmp_path / "a" / "artefacts" / sha).read_bytes() == b"weights"
    assert entry.kind == "artefact"
    assert entry.payload == {"name": "round-0000/global_model.json", "kind": "global_model", "sha256": sha,
                             "size": 7, "meta": {"round": 0}}


@pytest.mark.parametrize("bad, match", [
    ({"values": np.zeros(3, dtype=np.float32)}, r"payload\.values: a ndarray with shape \(3,\)"),
    ({"t": pd.DataFrame({"hr": [80.0]})}, r"payload\.t: a DataFrame"),
    ({"s": pd.Series([1.0])}, r"payload\.s: a Series"),
    ({"raw": b"\x00\x01"}, r"payload\.raw: a bytes"),
    ({"nested": [{"x": object()}]}, r"payload\.nested\[0\]\.x: a object"),
    ({"f": np.float32(1.5)}, r"payload\.f: a float32"),
])
def test_record_refuses_non_json_payloads(tmp_path, bad, match):
    with AuditTrail(tmp_path / "a", identity=Identity.generate("server")) as trail:
        with pytest.raises(ConfigError, match=r"^Audit entry 'note': " + match):  # the one exception tree
            trail.record("note", bad)
        with pytest.raises(ConfigError, match=r"payload\.x: non-finite float nan cannot be audited; record None"):
            trail.record("note", {"x": float("nan")})
        with pytest.raises(ConfigError, match=r"^Artefact 'm' meta: payload\.raw: a bytes"):
            trail.publish("m", b"x", kind="note", meta={"raw": b"\x00"})
        assert trail.head.seq == 0  # nothing was written


def test_record_validates_known_kinds_and_reserved_kinds(tmp_path):
    server = Identity.generate("server")
    with AuditTrail(tmp_path / "a", identity=server) as trail:
        with pytest.raises(ConfigError, match=r"'ledger' schema .*epsilon"):
            trail.record("ledger", {"client": "h", "round": 0, "delta": 1e-5, "budget_epsilon": 1.0,
                                    "noise_multiplier": 1.0})
        with pytest.raises(ConfigError, match="extra_forbidden|Extra inputs"):
            trail.record("metrics", {"round": 0, "per_client": {}, "patient_rows": [1]})
        with pytest.raises(ConfigError, match="written by the trail itself"):
            trail.record("artefact", {"name": "x"})
        with pytest.raises(ConfigError, match="must match"):
            trail.record("Bad Kind", {})
        with pytest.raises(ConfigError, match="adjacency must be 2x2"):
            trail.record("dag_outcome", {"round": 0, "concepts": ["a", "b"], "adjacency": [[0]],
                                         "tallies": {"strength": [[0, 0], [0, 0]]}})
        trail.record("free_form_note", {"anything": [1, "two", None]})


def test_store_envelope_records_signature_status(tmp_path):
    server, good, other = Identity.generate("server"), Identity.generate("hosp-a"), Identity.generate("hosp-a")
    report = ClientReport(federation_id=FED, round=0, client="hosp-a", dictionary_hash=DICT_HASH)
    with AuditTrail(tmp_path / "a", identity=server) as trail:
        early = seal(report, good)
        trail.store_envelope(early, kind="client_report", sender="hosp-a")
        assert trail.head.payload["signature"] == "unknown_sender"
        trail.record("manifest", manifest(server, {"hosp-a": good}))
        digest = trail.store_envelope(seal(report, good), kind="client_report", sender="hosp-a")
        assert trail.head.payload["signature"] == "valid"
        trail.store_envelope(seal(report, other), kind="client_report", sender="hosp-a")  # forged key
        assert trail.head.payload["signature"] == "invalid"
        with pytest.raises(IntegrityError, match="expected a 'client_report' from 'hosp-b'"):
            trail.store_envelope(early, kind="client_report", sender="hosp-b")
        with pytest.raises(IntegrityError, match="not a valid envelope"):
            trail.store_envelope(b"not json", kind="client_report", sender="hosp-a")
    assert digest == hashlib.sha256(report.model_dump_json().encode()).hexdigest()
    assert verify_audit_dir(tmp_path / "a").ok


def test_reopen_appends_and_refuses_broken_or_foreign_logs(tmp_path):
    server = Identity.generate("server")
    d = tmp_path / "a"
    with AuditTrail(d, identity=server) as trail:
        trail.record("note", {"n": 1})
    with AuditTrail(d, identity=server) as trail:
        assert trail.head.kind == "audit_reopen" and trail.head.seq == 2
    assert verify_audit_dir(d, trusted_server_key=server.public.raw).ok
    with pytest.raises(IntegrityError, match="not by the trusted server key"):
        AuditTrail(d, identity=Identity.generate("server"))
    log = d / "audit.jsonl"
    log.write_bytes(log.read_bytes().replace(b'"n":1', b'"n":2'))
    with pytest.raises(IntegrityError, match=r"does not verify, refusing to append \(first bad entry: 1\)"):
        AuditTrail(d, identity=server)


def test_refuses_nonempty_foreign_dir_second_writer_and_closed_trail(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "notes.txt").write_text("hi")
    with pytest.raises(ConfigError, match="not empty"):
        AuditTrail(tmp_path / "x", identity=Identity.generate("server"))
    server = Identity.generate("server")
    trail = AuditTrail(tmp_path / "a", identity=server)
    with pytest.raises(IntegrityError, match="Another process"):
        AuditTrail(tmp_path / "a", identity=server)
    trail.close()
    with pytest.raises(ProtocolError, match="closed"):
        trail.record("note", {})


def test_trail_has_redacted_repr_and_refuses_pickle(tmp_path):
    server = Identity.generate("server")
    with AuditTrail(tmp_path / "a", identity=server) as trail:
        assert "redacted" in repr(trail)
        with pytest.raises(TypeError, match="refuses to be pickled"):
            pickle.dumps(trail)


def test_reopen_after_a_crash_between_entry_and_head_recovers_the_signed_tail(tmp_path):
    server = Identity.generate("server")
    d = tmp_path / "a"
    with AuditTrail(d, identity=server) as trail:
        trail.record("note", {"n": 1})
        stale_head = (d / "head.json").read_bytes()
        trail.record("note", {"n": 2})
    (d / "head.json").write_bytes(stale_head)  # as if the process died before rewriting the head
    report = verify_audit_dir(d)
    assert not report.ok and "appended without a head" in report.problems[0]
    with AuditTrail(d, identity=server) as trail:
        assert trail.head.kind == "audit_reopen" and trail.head.payload["recovered_entries"] == 1
    assert verify_audit_dir(d, trusted_server_key=server.public.raw).ok
    # A truncated log (head ahead of the log) is never "recovered".
    log = d / "audit.jsonl"
    log.write_bytes(b"".join(log.read_bytes().splitlines(keepends=True)[:-1]))
    with pytest.raises(IntegrityError, match="truncated"):
        AuditTrail(d, identity=server)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads=st.lists(st.dictionaries(st.text(max_size=8), JSON, max_size=5), min_size=1, max_size=3),
       clock=st.floats(0, 4e9))
def test_any_json_payload_round_trips_and_verifies(tmp_path_factory, payloads, clock):
    """No false alarms: whatever plain JSON is recorded (unicode, -0.0, huge ints, 1e308) verifies."""
    d = tmp_path_factory.mktemp("prop") / "a"
    with AuditTrail(d, identity=Identity.generate("server"), clock=lambda: clock) as trail:
        written = [trail.record("note", p) for p in payloads]
    report = verify_audit_dir(d)
    assert report.ok, report.problems
    assert [json.loads(x)["payload"] for x in (d / "audit.jsonl").read_text().splitlines()[1:]] == \
        [e.payload for e in written]


def test_opening_records_the_software_an_auditor_needs_to_recompute(federation_dir):
    software = _lines(federation_dir.directory)[0]["payload"]["software"]
    assert software["numpy"] == np.__version__
    assert software["python"].count(".") == 2


def test_a_trail_without_a_signing_identity_is_a_config_error(tmp_path):
    """AuditTrail(d, identity=None) or a PublicIdentity: AttributeError ('no attribute name') before."""
    for wrong in (None, Identity.generate("server").public):
        with pytest.raises(ConfigError, match=r"AuditTrail needs identity= the server's signing Identity"):
            AuditTrail(tmp_path / "a", identity=wrong)
    assert not (tmp_path / "a").exists()  # nothing created
