"""A server whose audit directory and journal are rolled back to an earlier copy is refused.

Rolled back together, the audit directory and the journal agree and ``audit verify`` passes;
only the hospitals know better: each keeps the latest server-signed plan (audit head, round) it
saw (``sdk/federation/anchor.py``) and answers the replayed round with a signed refusal naming
both heads. The head a hospital anchored, given to ``audit verify --expect-head``, fails on the
rolled-back directory. Rolled back alone, the audit directory no longer holds the journal's
head and the server refuses to resume.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
from pathlib import Path

import pytest
from clinograph.secure.audit.verify import verify_audit_dir

from clinograph.core.errors import IntegrityError, ProtocolError

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import crash_harness  # noqa: E402
from test_crash_resume import _entries, _run  # noqa: E402

pytestmark = pytest.mark.slow  # forked server processes


def _backup(work: Path, to: Path) -> None:
    to.mkdir()
    shutil.copytree(work / "audit", to / "audit")
    for f in work.glob("journal.sqlite*"):  # the database and its WAL: what a disk copy takes
        shutil.copy2(f, to / f.name)


def _restore(backup: Path, work: Path, *, journal: bool) -> None:
    shutil.rmtree(work / "audit")
    shutil.copytree(backup / "audit", work / "audit")
    if journal:
        for f in work.glob("journal.sqlite*"):
            f.unlink()
        for f in backup.glob("journal.sqlite*"):
            shutil.copy2(f, work / f.name)


@pytest.fixture(scope="module")
def ran_past_a_backup(tmp_path_factory):
    """Round 0 ran, the server's disk was copied, round 1 ran (hospitals anchored its plan)."""
    root = tmp_path_factory.mktemp("rollback")
    work, backup = root / "work", root / "backup"
    assert _run(work, "--rounds", "3", "--kill", "end") == -signal.SIGKILL  # stops after round 0
    _backup(work, backup)
    assert _run(work, "--rounds", "3", "--kill", "end") == -signal.SIGKILL  # round 1, anchored by hospitals
    return work, backup


def test_hospitals_refuse_a_server_rolled_back_with_its_journal(ran_past_a_backup, tmp_path):
    work, backup = ran_past_a_backup
    shutil.copytree(work, tmp_path / "w")
    work = tmp_path / "w"
    anchor = json.loads((work / "state" / "h1" / "audit_anchor.json").read_text())
    (seen,) = anchor["anchors"].values()
    assert seen["round"] == 1
    _restore(backup, work, journal=True)
    assert verify_audit_dir(work / "audit").ok  # the copy verifies on its own
    with pytest.raises(ProtocolError, match="Only 0 client"):  # every hospital refused the replayed round 1
        crash_harness.main([str(work), "--rounds", "3"])
    refusals = [e["payload"] for e in _entries(work) if e["kind"] == "hospital_refused"]
    assert sorted(r["client"] for r in refusals) == list(crash_harness.HOSPITALS)
    for r in refusals:
        assert r["signed"] and r["round"] == 1 and r["stage"] == "plan"
        assert "RollbackDetected" in r["reason"] and "rolled back to an earlier copy" in r["reason"]
        assert f"round 1 at audit entry {seen['audit_seq']}" in r["reason"]
    report = verify_audit_dir(work / "audit", expect_head=seen["audit_head"])  # the out-of-band head
    assert not report.ok


def test_a_server_whose_audit_directory_alone_was_rolled_back_refuses_to_resume(ran_past_a_backup, tmp_path):
    work, backup = ran_past_a_backup
    shutil.copytree(work, tmp_path / "w")
    work = tmp_path / "w"
    _restore(backup, work, journal=False)
    with pytest.raises(IntegrityError, match="rolled back behind the journal"):
        crash_harness.main([str(work), "--rounds", "3"])


@pytest.mark.parametrize("mode", ["masked", "ckks"])
def test_a_restored_older_server_copy_is_refused_at_every_restart(tmp_path, mode):
    """Issue 31's fork experiment: the server's disk is restored from an older copy (audit directory
    and journal together) after the hospitals saw a later round, and the server is restarted three
    times. Every restart is refused by every hospital, in masked and in ckks mode (ckks plans carry
    no global-state digest: only the audit-head consistency proof stops the fork), however far the
    fork's own sequence number grows with the aborted rounds it records."""
    work, backup = tmp_path / "work", tmp_path / "backup"
    assert _run(work, "--rounds", "4", "--mode", mode, "--kill", "end") == -signal.SIGKILL  # round 0
    _backup(work, backup)
    assert _run(work, "--rounds", "4", "--mode", mode, "--kill", "end") == -signal.SIGKILL  # round 1, anchored
    anchors = {h: next(iter(json.loads((work / "state" / h / "audit_anchor.json").read_text())["anchors"].values()))
               for h in crash_harness.HOSPITALS}
    assert {a["round"] for a in anchors.values()} == {1}
    _restore(backup, work, journal=True)
    seqs = []
    for restart in range(3):
        with pytest.raises(ProtocolError, match="Only 0 (client|ckks update)"):  # nobody answered the plan
            crash_harness.main([str(work), "--rounds", "4", "--mode", mode])
        entries = _entries(work)
        seqs.append(len(entries))
        refusals = [e["payload"] for e in entries if e["kind"] == "hospital_refused"]
        latest = [r for r in refusals if r["round"] == max(x["round"] for x in refusals)]
        assert sorted(r["client"] for r in latest) == list(crash_harness.HOSPITALS), restart
        assert all("RollbackDetected" in r["reason"] for r in latest), restart
        assert not [e for e in entries if e["kind"] == "aggregate" and e["payload"]["round"] >= 1], restart
    assert seqs[-1] > max(a["audit_seq"] for a in anchors.values())  # the fork grew past the anchored sequence
    for h in crash_harness.HOSPITALS:  # no hospital moved its anchor onto the fork
        (now,) = json.loads((work / "state" / h / "audit_anchor.json").read_text())["anchors"].values()
        assert (now["round"], now["audit_head"]) == (anchors[h]["round"], anchors[h]["audit_head"])
