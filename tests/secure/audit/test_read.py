"""secure/audit/read.py: the one reader of a log's entries by kind (the demo's privacy lines, the
support matrix and a refused run's summary read through it)."""

import pytest
from clinograph.secure.audit import AuditTrail
from clinograph.secure.audit.read import entries, payloads

from clinograph.core.errors import IntegrityError
from clinograph.core.identity import Identity


def test_payloads_of_a_kind_come_in_log_order_and_an_empty_folder_has_none(tmp_path):
    assert entries(tmp_path) == [] and payloads(tmp_path, "note") == []
    with AuditTrail(tmp_path / "a", identity=Identity.generate("server")) as trail:
        trail.record("note_a", {"i": 1})
        trail.record("note_b", {"i": 2})
        trail.record("note_a", {"i": 3})
    assert payloads(tmp_path / "a", "note_a") == [{"i": 1}, {"i": 3}]
    kinds = [e["kind"] for e in entries(tmp_path / "a")]
    assert kinds[0] == "audit_open" and kinds[1:4] == ["note_a", "note_b", "note_a"]


@pytest.mark.parametrize("line", ['{"kind": "note"}', "[1, 2]", "not json", '{"kind": 3, "payload": {}}'])
def test_a_line_that_is_no_entry_is_an_error_naming_its_line_not_skipped(tmp_path, line):
    with AuditTrail(tmp_path / "a", identity=Identity.generate("server")) as trail:
        trail.record("note_a", {"i": 1})
    with open(tmp_path / "a" / "audit.jsonl", "a", encoding="utf-8") as fh:
        fh.write("\n" + line + "\n")
    n = len((tmp_path / "a" / "audit.jsonl").read_text().splitlines())
    with pytest.raises(IntegrityError, match=rf"audit\.jsonl, line {n}: not an audit entry .*clinograph audit verify"):
        payloads(tmp_path / "a", "note_a")
