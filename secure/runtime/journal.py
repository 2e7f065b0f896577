"""The server's crash journal: its state at every stage boundary, in SQLite beside the audit trail.

A federation server keeps its state in memory; this journal makes a restarted server resume
the run instead of starting over. :func:`~.loop.run_rounds` (given ``journal=``) writes one
:class:`Boundary` at each stage boundary of every round -- the plan signed but not yet sent
(``open``), the plan exchange, each secure-mode stage, the close, the model delivery (``end``)
-- when a new journal starts (``start``, before the first plan) and when the run ends. Each
boundary is one SQLite transaction (stdlib :mod:`sqlite3`, WAL, ``synchronous = FULL``), so a
SIGKILL leaves either the previous boundary or the new one, never half of one.

What is persisted (and why it is enough):

- the server's next round number, its global state (float64, exact) or none (modes where the
  server never sees the sum), the closed rounds' results, and the DP ledgers' server view
  (each hospital's last accepted ledger entry and declared RDP, :mod:`clinograph.secure.dp_checks`);
- the loop's own state: how many rounds completed, hospitals out of the run (final refusals),
  liveness counters, and the models still owed to each hospital (deferred delivery);
- the audit trail's head (sequence number and entry hash) at the boundary, checked on resume;
- which round was open and at which stage -- but **not** the open round's secure-mode state
  (masking seeds and shares, CKKS ciphertexts).

Recovery rule (the simplest correct one): a round that was open when the server died is
aborted -- audited as ``round_aborted`` with reason ``server restart`` -- and its number is spent;
the run goes on with a new round (new round id) from the last closed round's state. So an
interrupted round is never counted and no update is applied twice: its updates were never
added to the journalled state. A round whose close was journalled is complete; its model is
delivered (again, if need be) before the next plan. Hospitals refuse a second plan for a round
they trained (replay guard), so they train afresh for the new round, their DP ledgers having
counted the aborted round's steps (that privacy was spent) and counting the new round's once.

Authentication: every boundary row carries an HMAC-SHA256 (:class:`JournalKey`) under a key the
server derives with HKDF from its own Ed25519 signing key (label ``KDF_JOURNAL_MAC`` in
:mod:`clinograph.core.labels`), over the previous row's MAC (a chain), the row's number,
round, stage, the audit head it records and its stored JSON exactly; blobs are named by SHA-256 in
the authenticated JSON. A new journal's first boundary (``start``) is written before the first plan.

Guarantees: the resumed run's audit chain is the same chain (the trail reopens, verifies and
appends ``audit_reopen``); :func:`~.resume.resume` refuses (IntegrityError) a journal altered
anywhere, one written under another server key, one whose audit head is not in the trail (the
audit directory was replaced or rolled back behind the journal), one older than the trail (the
trail holds what the server writes only after a later boundary: an older copy, a lost ``-wal``
file), and an empty journal beside a trail holding round plans of the federation. Does not
guarantee: that the journal was not rolled back together with the audit directory -- that is
what the hospitals' anchors are for (:mod:`clinograph.sdk.federation.anchor`); nor anything
against a holder of the server's signing key; a journal one boundary behind, at a point a crash
could have left, is resumed as that crash. Entries the audit trail wrote after the last
boundary stay in the chain (they are followed by the ``round_aborted`` entry that voids the
round). Strategies that keep server-side state between rounds (FedOpt's moments, DAG voting) are
only journalled if they expose ``state_dict()`` / ``load_state_dict()``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import sqlite3
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from clinograph.core.errors import ConfigError, IntegrityError
from clinograph.core.fields import RoundNumber
from clinograph.core.identity import Identity
from clinograph.core.labels import KDF_JOURNAL_MAC

FORMAT = "clinograph-journal/2"
#: Strategies whose whole server-side state is the global model (nothing else to journal).
STATELESS_STRATEGIES = frozenset({"fedavg", "fedsgd", "fedprox"})
#: The fix every refusal of a journal names.
FIX = ("Restore the journal that belongs to this audit directory (with its -wal file), or start a new federation "
       "(new federation id, journal and audit directory).")
#: Called after each boundary is committed with (stage, round) -- tests inject crashes here.
SavedHook = Callable[[str, int], None]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS boundary (
    seq INTEGER PRIMARY KEY,
    round INTEGER NOT NULL,
    stage TEXT NOT NULL,
    meta TEXT NOT NULL,
    mac TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS blob (
    sha256 TEXT PRIMARY KEY,
    data BLOB NOT NULL
);
"""


class Boundary(BaseModel):
    """The server's state at one stage boundary (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    format: Literal["clinograph-journal/2"] = FORMAT
    federation_id: str
    spec_digest: str
    secure_mode: str = Field(max_length=64)
    strategy_name: str = Field(max_length=64)
    #: open, plan, stage <k>, close, aborted, end, run_ended
    stage: str = Field(max_length=32)
    #: the server's next round number
    round: RoundNumber
    #: the round open at this boundary (None: between rounds)
    open_round: int | None = None
    #: sha256 of the global state blob (None: the server holds no plaintext model)
    state: str | None = None
    history: list[str] = Field(default_factory=list)  # RoundResult JSON, in order
    ledgers: dict[str, dict[str, Any]] = Field(default_factory=dict)
    strategy: dict[str, Any] | None = None
    completed: int = Field(ge=0, default=0)
    retired: dict[str, str] = Field(default_factory=dict)
    liveness: dict[str, dict[str, int]] | None = None
    pending: dict[str, str] = Field(default_factory=dict)  # hospital -> sha256 of the model owed
    audit_seq: int | None = None
    audit_hash: str | None = None
    run_ended: bool = False
    #: the run's control (:class:`~.loop.RunControl`: selection so far), the evaluation-only
    #: rounds the federation ran (one a run; not training rounds), whether this run's scoring round
    #: ran and whether the stop rule ended its training
    control: dict[str, Any] | None = None
    scored: int = Field(ge=0, default=0)
    score_done: bool = False
    stopped: bool = False
    #: the federation's runs in this journal: 1 + the extensions (:func:`~.resume.resume`)
    runs: int = Field(ge=1, default=1)


def encode_state(names: list[str], state: Mapping[str, np.ndarray]) -> bytes:
    """Modules in ``names`` order as one JSON header line plus little-endian float64 bytes."""
    sizes = [int(np.asarray(state[n]).size) for n in names]
    head = json.dumps({"names": names, "sizes": sizes}).encode() + b"\n"
    return head + b"".join(np.ascontiguousarray(state[n], dtype="<f8").reshape(-1).tobytes() for n in names)


def decode_state(data: bytes) -> dict[str, np.ndarray]:
    """The inverse of :func:`encode_state` (IntegrityError when the blob does not add up)."""
    head, _, body = data.partition(b"\n")
    try:
        meta = json.loads(head)
        names, sizes = list(meta["names"]), [int(s) for s in meta["sizes"]]
    except (ValueError, KeyError, TypeError):
        raise IntegrityError("Journal state blob has no valid header; the journal is damaged.") from None
    if len(body) != 8 * sum(sizes) or len(names) != len(sizes):
        raise IntegrityError(f"Journal state blob holds {len(body)} bytes, not the {8 * sum(sizes)} its header "
                             "declares; the journal is damaged.")
    out, at = {}, 0
    flat = np.frombuffer(body, dtype="<f8")
    for name, size in zip(names, sizes, strict=True):
        out[name] = flat[at:at + size].astype(np.float64)
        at += size
    return out


class JournalKey:
    """The key that authenticates the journal's boundaries: HMAC-SHA256 under HKDF(the server's
    Ed25519 signing key, :data:`~clinograph.core.labels.KDF_JOURNAL_MAC`). Redacted repr;
    refuses to pickle."""

    __slots__ = ("_key",)

    def __init__(self, identity: Identity):
        self._key = identity.derive_key(purpose=KDF_JOURNAL_MAC)

    def tag(self, *, seq: int, prev: str, round_: int, stage: str, meta: str) -> str:
        """The MAC of boundary ``seq``: it covers the previous boundary's tag (a chain: none can be
        removed, reordered or replaced in the middle), its round and stage, the audit head it
        records (bound explicitly, and again inside ``meta``) and ``meta`` exactly as stored."""
        try:
            head = json.loads(meta)
            audit = [head.get("audit_seq"), head.get("audit_hash")] if isinstance(head, dict) else None
        except ValueError:
            audit = None
        header = json.dumps([FORMAT, seq, prev, round_, stage, audit], separators=(",", ":")).encode()
        return hmac.new(self._key, header + b"\x00" + meta.encode(), hashlib.sha256).hexdigest()

    def __repr__(self) -> str:
        return "JournalKey(<redacted>)"

    def __reduce__(self):  # noqa: D105
        raise TypeError("JournalKey holds a secret key and refuses to be pickled.")


class Journal:
    """The SQLite journal file (one per federation server; beside its audit directory).

    Every boundary row carries a MAC (:class:`JournalKey`) chained to the row before; only
    :meth:`latest` with the server's key returns a boundary, after checking the whole chain.

    Args:
        path: the database file (created if missing).
        on_saved: called with (stage, round) after each boundary is committed (crash tests).

    Raises:
        ConfigError: the file is not an SQLite database.
        IntegrityError: the file is a journal of the unauthenticated format 1.
    """

    def __init__(self, path: Path, *, on_saved: SavedHook | None = None):
        self.path = Path(path)
        self.on_saved = on_saved
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            columns = {str(r[1]) for r in self._db.execute("PRAGMA table_info(boundary)")}
            self._stored = {str(r[0]) for r in self._db.execute("SELECT sha256 FROM blob")}
            last = self._db.execute("SELECT mac FROM boundary ORDER BY seq DESC LIMIT 1").fetchone() \
                if "mac" in columns else None
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"Journal {self.path} is not a Clinograph journal (SQLite said: {exc}). Point the "
                              "server at its own journal file or move this one away.") from None
        if "mac" not in columns:
            self._db.close()
            raise IntegrityError(f"Journal {self.path} is a format-1 journal (clinograph-journal/1), whose boundaries "
                                 "are not authenticated; this version resumes only authenticated journals "
                                 f"({FORMAT}). Finish the run with the Clinograph version that wrote it, or start "
                                 "a new federation (new federation id, journal and audit directory).")
        self._prev = "" if last is None else str(last[0])

    def save(self, boundary: Boundary, *, key: JournalKey, blobs: Mapping[str, bytes] = ()) -> None:  # type: ignore[assignment]
        """Write ``boundary`` (MACed with ``key``, chained to the last boundary) and the blobs it
        references in one transaction; drop blobs no longer referenced by the newest boundary."""
        blobs = {sha: data for sha, data in dict(blobs).items() if sha not in self._stored}  # state: once per close
        for sha, data in blobs.items():
            if hashlib.sha256(data).hexdigest() != sha:
                raise IntegrityError("Journal blob does not match its digest.")
        keep = {boundary.state, *boundary.pending.values()} - {None}
        meta = boundary.model_dump_json()
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            for sha, data in blobs.items():
                db.execute("INSERT OR IGNORE INTO blob (sha256, data) VALUES (?, ?)", (sha, data))
            row = db.execute("SELECT COALESCE(MAX(seq), 0) FROM boundary").fetchone()
            seq = int(row[0]) + 1
            mac = key.tag(seq=seq, prev=self._prev, round_=boundary.round, stage=boundary.stage, meta=meta)
            db.execute("INSERT INTO boundary (seq, round, stage, meta, mac) VALUES (?, ?, ?, ?, ?)",
                       (seq, boundary.round, boundary.stage, meta, mac))
            marks = ",".join("?" * len(keep))
            db.execute(f"DELETE FROM blob WHERE sha256 NOT IN ({marks})", tuple(keep))  # noqa: S608 - placeholders
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self._stored = set(keep)
        self._prev = mac
        if self.on_saved is not None:
            self.on_saved(boundary.stage, boundary.round)

    def empty(self) -> bool:
        """Whether the journal holds no boundary at all (a new -- or a lost or truncated -- journal)."""
        return self._db.execute("SELECT 1 FROM boundary LIMIT 1").fetchone() is None

    def peek(self) -> Boundary | None:
        """The last boundary as stored, **not authenticated** -- only to refuse a journal of another
        run with a clear message before :meth:`latest` checks it (None: none, or it does not parse)."""
        row = self._db.execute("SELECT meta FROM boundary ORDER BY seq DESC LIMIT 1").fetchone()
        if row is None:
            return None
        try:
            return Boundary.model_validate_json(row[0])
        except ValueError:
            return None

    def latest(self, *, key: JournalKey) -> Boundary | None:
        """The last committed boundary (None for a new journal), after checking every boundary's
        MAC and the chain from the first one.

        Raises:
            IntegrityError: a boundary was altered, removed from the middle or reordered, or the
                journal was written under another server key; or the last boundary does not parse.
        """
        prev, expect, last = "", 1, None
        for seq, round_, stage, meta, mac in self._db.execute(
                "SELECT seq, round, stage, meta, mac FROM boundary ORDER BY seq"):
            good = (isinstance(seq, int) and isinstance(round_, int) and isinstance(stage, str)
                    and isinstance(meta, str) and isinstance(mac, str))
            if not good or seq != expect or not hmac.compare_digest(
                    key.tag(seq=seq, prev=prev, round_=round_, stage=stage, meta=meta), mac):
                raise IntegrityError(
                    f"Journal {self.path}: boundary {expect} does not authenticate under this server's key "
                    f"(expected the chain's boundary {expect} with a valid MAC): the journal was altered, a boundary "
                    f"was removed or reordered, or it was written by another server key. {FIX}")
            prev, expect, last = mac, expect + 1, meta
        if last is None:
            return None
        try:
            return Boundary.model_validate_json(last)
        except ValueError:
            raise IntegrityError(f"Journal {self.path}: the last boundary authenticates but does not parse as a "
                                 f"{FORMAT} boundary; it was written by another Clinograph version. Resume with "
                                 "that version, or start a new federation.") from None

    def blob(self, sha256: str) -> bytes:
        """A blob the latest boundary references (IntegrityError when missing or altered)."""
        row = self._db.execute("SELECT data FROM blob WHERE sha256 = ?", (sha256,)).fetchone()
        if row is None or hashlib.sha256(row[0]).hexdigest() != sha256:
            raise IntegrityError(f"Journal {self.path} lacks or altered blob {sha256[:12]}… (state its last "
                                 f"boundary names): the journal is damaged. {FIX}")
        return bytes(row[0])

    def stages(self) -> list[tuple[int, str]]:
        """Every boundary written, as (round, stage), oldest first (for audits and tests)."""
        return [(int(r), str(s)) for r, s in self._db.execute("SELECT round, stage FROM boundary ORDER BY seq")]

    def close(self) -> None:
        """Checkpoint the WAL into the database file and close (idempotent)."""
        try:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.ProgrammingError:
            return  # already closed
        self._db.close()

    def __repr__(self) -> str:
        return f"Journal(path={str(self.path)!r})"
