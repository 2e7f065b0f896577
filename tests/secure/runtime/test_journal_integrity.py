"""The crash journal is authenticated and anchored to the audit trail: tampered, foreign, older,
truncated or empty journals are refused with a pinned IntegrityError; a genuine crash still resumes.

Every refusal below is checked against a control that resumes (the same journal, untouched), so
the tests fail if the refusal were to come from anything but the tampering.
"""

from __future__ import annotations

import hmac
import json
import pickle
import sqlite3
import sys
from hashlib import sha256
from pathlib import Path

import pytest
from clinograph.secure.runtime import run_rounds
from clinograph.secure.runtime.journal import Journal, JournalKey
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from clinograph.core.errors import IntegrityError
from clinograph.core.identity import Identity
from clinograph.core.labels import KDF_JOURNAL_MAC

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hostile_helpers import audit_entries, federation  # noqa: E402

NOT_AUTHENTIC = "does not authenticate under this server's key"
OLDER = "is older than its audit trail"
LOST = r"holds no boundary, but the audit trail .* already holds \d+ round plan\(s\) of federation 'fed-hostile'"
FIX = "Restore the journal that belongs to this audit directory"


class Crash(BaseException):
    """Stands for the process dying."""


def _crash_at(stage: str, round_: int, *, before=None):
    def hook(s: str, r: int) -> None:
        if (s, r) == (stage, round_):
            if before is not None:
                before()
            raise Crash
    return hook


def _crashed(tmp_path: Path, *, stage: str = "close", round_: int = 1, rounds: int = 3) -> Path:
    """A run killed at (stage, round_): its audit trail and journal are left on disk."""
    server, transport, _ = federation(tmp_path, strategy="fedavg")
    journal = Journal(tmp_path / "j.sqlite", on_saved=_crash_at(stage, round_))
    with pytest.raises(Crash):
        run_rounds(server, transport, rounds=rounds, journal=journal)
    server.audit.close()
    journal.close()
    return tmp_path / "j.sqlite"


def _resume(tmp_path: Path, *, rounds: int = 3):
    server, transport, _ = federation(tmp_path, strategy="fedavg")
    try:
        return run_rounds(server, transport, rounds=rounds, journal=Journal(tmp_path / "j.sqlite"))
    finally:
        server.audit.close()


def _sql(path: Path, *statements: tuple) -> list:
    db = sqlite3.connect(path, isolation_level=None)
    try:
        out = [db.execute(*st).fetchall() for st in statements]
    finally:
        db.close()
    return out


def _remac(path: Path, key: JournalKey, edit=lambda seq, meta: meta) -> None:
    """Rewrite every boundary (``edit`` its meta) with a valid MAC chain under ``key``: what an
    attacker who holds ``key`` could write."""
    db = sqlite3.connect(path, isolation_level=None)
    prev = ""
    for seq, round_, stage, meta in db.execute("SELECT seq, round, stage, meta FROM boundary ORDER BY seq").fetchall():
        meta = edit(seq, meta)
        mac = key.tag(seq=seq, prev=prev, round_=round_, stage=stage, meta=meta)
        db.execute("UPDATE boundary SET meta = ?, mac = ? WHERE seq = ?", (meta, mac, seq))
        prev = mac
    db.close()


def _server_key() -> JournalKey:
    from hostile_helpers import identity
    return JournalKey(identity("server"))


def test_an_untouched_journal_resumes(tmp_path):  # the control for every refusal below
    _crashed(tmp_path)
    outcomes = _resume(tmp_path)
    assert [o.result.round for o in outcomes] == [1, 2]  # round 0 closed before the crash


def test_a_flipped_byte_in_a_boundary_is_refused(tmp_path):
    path = _crashed(tmp_path)
    [[(seq, meta)]] = _sql(path, ("SELECT seq, meta FROM boundary WHERE stage = 'plan' LIMIT 1",))
    flipped = meta.replace('"completed":0', '"completed":9')
    assert flipped != meta
    _sql(path, ("UPDATE boundary SET meta = ? WHERE seq = ?", (flipped, seq)))
    with pytest.raises(IntegrityError, match=f"boundary {seq} {NOT_AUTHENTIC}.*{FIX}"):
        _resume(tmp_path)


def test_a_flipped_byte_in_a_blob_is_refused(tmp_path):
    path = _crashed(tmp_path)
    [[(sha, data)]] = _sql(path, ("SELECT sha256, data FROM blob LIMIT 1",))
    data = bytearray(data)
    data[-1] ^= 1
    _sql(path, ("UPDATE blob SET data = ? WHERE sha256 = ?", (bytes(data), sha)))
    with pytest.raises(IntegrityError, match=f"lacks or altered blob {sha[:12]}.*{FIX}"):
        _resume(tmp_path)


def test_a_boundary_removed_from_the_middle_is_refused(tmp_path):
    path = _crashed(tmp_path)
    _sql(path, ("DELETE FROM boundary WHERE seq = 3",))
    with pytest.raises(IntegrityError, match=f"boundary 3 {NOT_AUTHENTIC}"):
        _resume(tmp_path)


def test_the_newest_boundaries_removed_an_older_journal_is_refused(tmp_path):
    path = _crashed(tmp_path, stage="open", round_=2)  # rounds 0 and 1 closed, round 2 planned
    [[(seq,)]] = _sql(path, ("SELECT MAX(seq) FROM boundary WHERE stage = 'close' AND round = 1",))
    _sql(path, ("DELETE FROM boundary WHERE seq >= ?", (seq,)))  # back to round 0 still open
    with pytest.raises(IntegrityError, match=f"{OLDER}: its last boundary .stage 4, round 0. recorded audit entry "
                                             rf"\d+, and the trail holds after it a 'round_plan' entry of round 1"):
        _resume(tmp_path)


def test_a_journal_replaced_by_an_older_copy_is_refused(tmp_path):
    server, transport, _ = federation(tmp_path, strategy="fedavg")
    copy = tmp_path / "old.sqlite"

    def snapshot():
        src = sqlite3.connect(tmp_path / "j.sqlite")
        dst = sqlite3.connect(copy)
        src.backup(dst)
        src.close()
        dst.close()

    journal = Journal(tmp_path / "j.sqlite", on_saved=lambda s, r: snapshot() if (s, r) == ("close", 1) else None)
    run_rounds(server, transport, rounds=2, journal=journal)  # the run completes and ends
    server.audit.close()
    journal.close()
    (tmp_path / "j.sqlite").unlink()
    copy.rename(tmp_path / "j.sqlite")  # the copy after round 0: its DP ledgers, model and history older
    with pytest.raises(IntegrityError, match=f"{OLDER}.*'aggregate' entry of round 1.*{FIX}"):
        _resume(tmp_path, rounds=2)


def test_a_journal_under_another_server_key_is_refused(tmp_path):
    path = _crashed(tmp_path)
    _remac(path, JournalKey(Identity.generate("server")))  # well-formed, chained, but not this server's
    with pytest.raises(IntegrityError, match=f"boundary 1 {NOT_AUTHENTIC}.*another server key"):
        _resume(tmp_path)


def test_an_empty_journal_beside_a_trail_with_rounds_is_refused_not_restarted(tmp_path):
    path = _crashed(tmp_path)
    _sql(path, ("DELETE FROM boundary",))
    with pytest.raises(IntegrityError, match=f"{LOST} .rounds 0..0.: the journal was lost.*{FIX}"):
        _resume(tmp_path)
    path.unlink()  # and a journal file that is not there at all
    for extra in ("-wal", "-shm"):
        Path(f"{path}{extra}").unlink(missing_ok=True)
    with pytest.raises(IntegrityError, match=LOST):
        _resume(tmp_path)
    plans = [e for e in audit_entries(tmp_path) if e["kind"] == "round_plan"]
    assert [p["payload"]["round"] for p in plans] == [0]  # no round 0 planned again


def test_a_journal_that_lost_its_wal_is_refused(tmp_path):
    server, transport, _ = federation(tmp_path, strategy="fedavg")
    lost = tmp_path / "lost.sqlite"

    def copy_main_file_only():  # the database file as it is on disk, without the -wal beside it
        lost.write_bytes((tmp_path / "j.sqlite").read_bytes())

    journal = Journal(tmp_path / "j.sqlite", on_saved=_crash_at("close", 1, before=copy_main_file_only))
    with pytest.raises(Crash):
        run_rounds(server, transport, rounds=3, journal=journal)
    server.audit.close()
    journal.close()
    (tmp_path / "j.sqlite").unlink()
    lost.rename(tmp_path / "j.sqlite")
    with pytest.raises(IntegrityError, match=f"{LOST}|{OLDER}"):
        _resume(tmp_path)


def test_a_crash_between_the_plan_entry_and_its_boundary_still_resumes(tmp_path):
    # The journal one boundary behind the trail, as a crash right after round_plan leaves it.
    path = _crashed(tmp_path, stage="open", round_=0)
    _sql(path, ("DELETE FROM boundary WHERE stage = 'open'",))
    outcomes = _resume(tmp_path, rounds=1)
    assert [o.result.round for o in outcomes] == [0]


def test_a_crash_between_the_aggregate_and_the_close_boundary_still_resumes(tmp_path):
    server, transport, _ = federation(tmp_path, strategy="fedavg")
    record = server.audit.record

    def dies_after_the_aggregate(kind, payload):  # the process dies right after the aggregate entry
        entry = record(kind, payload)
        if kind == "aggregate":
            raise Crash
        return entry

    server.audit.record = dies_after_the_aggregate
    journal = Journal(tmp_path / "j.sqlite")
    with pytest.raises(Crash):
        run_rounds(server, transport, rounds=1, journal=journal)
    server.audit.close()
    journal.close()
    outcomes = _resume(tmp_path, rounds=1)
    assert [o.result.round for o in outcomes] == [1]  # round 0 aborted (server restart), re-run as round 1
    aborted = [e["payload"]["round"] for e in audit_entries(tmp_path) if e["kind"] == "round_aborted"]
    assert aborted == [0]


def test_hostile_but_authentic_state_gives_an_integrity_error_not_a_traceback(tmp_path):
    path = _crashed(tmp_path, stage="close", round_=1)

    def edit(seq, meta):
        data = json.loads(meta)
        data["ledgers"] = {"h0": {"last": {"epsilon": "a lot"}, "rdp": ["0x1p+0"]}}
        return json.dumps(data)

    _remac(path, _server_key(), edit)  # only the server key can do this: validation still holds
    with pytest.raises(IntegrityError, match=r"its last boundary \(close, round 1\) authenticates but its state "
                                             r"does not validate \(ValidationError: .*\)"):
        _resume(tmp_path)


def test_a_format_1_journal_is_refused(tmp_path):
    _sql(tmp_path / "j.sqlite", ("CREATE TABLE boundary (seq INTEGER PRIMARY KEY AUTOINCREMENT, round INTEGER "
                                 "NOT NULL, stage TEXT NOT NULL, meta TEXT NOT NULL)",))
    with pytest.raises(IntegrityError, match="format-1 journal .* not authenticated"):
        Journal(tmp_path / "j.sqlite")


def test_the_journal_key_is_hkdf_of_the_signing_key_under_its_label_and_stays_secret():
    raw = bytes(range(32))
    ident = Identity("server", Ed25519PrivateKey.from_private_bytes(raw))
    # RFC 5869 by hand: extract with a zero salt, one expand block.
    prk = hmac.new(b"\x00" * 32, raw, sha256).digest()
    okm = hmac.new(prk, KDF_JOURNAL_MAC + b"\x01", sha256).digest()
    assert ident.derive_key(purpose=KDF_JOURNAL_MAC) == okm
    assert ident.derive_key(purpose=b"clinograph/v1/other") != okm
    assert okm != ident._key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                           serialization.NoEncryption())
    key = JournalKey(ident)
    assert repr(key) == "JournalKey(<redacted>)" and okm.hex() not in repr(key)
    with pytest.raises(TypeError, match="refuses to be pickled"):
        pickle.dumps(key)
