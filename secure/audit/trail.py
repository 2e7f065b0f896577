"""The server's audit trail and artefact store: the only way anything leaves the server.

Layout of an audit directory (nothing else belongs there; the verifier flags extra files)::

    audit.jsonl          append-only, hash-chained, signed entries (entry.py)
    head.json            signed head naming the last entry (truncation is detected)
    artefacts/<sha256>   published bytes, content addressed, each referenced by an entry

Guarantees: every artefact is written (atomically, by rename) before the entry that
references it, and the head is rewritten (atomically) after every entry, so a verified
directory has no unlogged artefact and no unsigned tail. Payloads pass the PHI guard
(canonical.to_plain) and, for known kinds, their schema (kinds.py) before anything is written.
An exclusive lock stops two writers on one directory. Reopening verifies the existing chain
first and refuses a broken one or a different server key; signed entries found after the
head (a crash between appending a line and rewriting the head) are accepted on reopen and
counted in the ``audit_reopen`` entry (``recovered_entries``).
Runs: each opening (``audit_open`` or ``audit_reopen``) starts a new run with a fresh random
id (128 bits, :attr:`AuditTrail.run_id`), named in the opening's payload and carried by every
entry of the run (entry.py), so several runs in one directory stay apart.
Does not guarantee: durability of entries written since the last :meth:`checkpoint` after
a power loss (it fsyncs); a crash between an artefact and its entry leaves an extra file
that the verifier reports.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import math
import os
import platform
import re
import secrets
import threading
import time as _time
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any, NamedTuple

from clinograph.core.errors import ConfigError, IntegrityError, ProtocolError
from clinograph.core.fileio import atomic_write
from clinograph.core.identity import Identity, PublicIdentity

from .canonical import plain_payload
from .entry import GENESIS, KIND, AuditEntry, make_entry, make_head
from .envelopes import keys_from, parse_stored, signature_status
from .kinds import RESERVED, check_payload
from .verify import (
    ARTEFACTS,
    HEAD,
    LOG,
    MAX_ARTEFACT_BYTES,
    MAX_HEAD_BYTES,
    read_regular_file,
    scan_audit_dir,
)

FORMAT = "clinograph-audit/2"
ARTEFACT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-/]{0,199}$")


SOFTWARE = ("clinograph", "numpy", "cryptography", "pydantic", "flwr", "tenseal")


def software_versions() -> dict[str, str]:
    """Installed versions of the packages whose behaviour a recomputation depends on (and Python)."""
    out = {"python": platform.python_version()}
    for name in SOFTWARE:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


class EntryFacts(NamedTuple):
    """What the crash journal needs to know of one entry (:meth:`AuditTrail.facts`)."""

    seq: int
    kind: str
    #: the payload's ``round`` when it is an int (round_plan, aggregate, round_aborted, ...)
    round: int | None
    #: the payload's ``federation_id`` (manifest entries)
    federation_id: str | None


def _facts(entry: AuditEntry) -> EntryFacts:
    rnd, fed = entry.payload.get("round"), entry.payload.get("federation_id")
    return EntryFacts(entry.seq, entry.kind, rnd if type(rnd) is int else None,
                      fed if isinstance(fed, str) else None)



def _plain(payload: Mapping[str, Any], *, what: str) -> dict[str, Any]:
    """:func:`.canonical.plain_payload`, its refusal (TypeError, ValueError: the PHI guard, a
    non-finite float, a payload over 1 MiB) as a ConfigError naming the entry and the path."""
    try:
        return plain_payload(payload)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{what}: {exc}") from None

class AuditTrail:
    """Append-only signed audit log plus content-addressed artefact store (see module doc).

    Args:
        directory: created if missing; reopened (after full verification) if it holds a log.
        identity: the server's signing identity; a reopened log must be signed by it.
        clock: seconds since the epoch (injectable for tests).

    Raises:
        IntegrityError: an existing log does not verify, or another process holds the lock.
        ConfigError: ``directory`` holds files that are not an audit log, or ``identity`` is no
            Identity (a PublicIdentity cannot sign).
    """

    def __init__(self, directory: Path, *, identity: Identity, clock: Callable[[], float] = _time.time):
        if not isinstance(identity, Identity):
            raise ConfigError(f"AuditTrail needs identity= the server's signing Identity (Identity.load(name, path) "
                              f"or Identity.generate(name)), got {type(identity).__name__}.")
        self._dir = Path(directory)
        self._identity = identity
        self._clock = clock
        self._keys: dict[str, PublicIdentity] = {}
        self._run = secrets.token_hex(16)
        self._lock = threading.RLock()
        self._dir.mkdir(parents=True, exist_ok=True)
        log = self._dir / LOG
        reopen = log.exists()
        self._ends: list[int] = []  # byte offset of the end of each entry's line in audit.jsonl
        self._plans: dict[int, int] = {}  # round -> seq of its (latest) round_plan entry
        self._facts: list[EntryFacts] = []  # kind, round, federation id of every entry (crash journal)
        if reopen:
            report, entries = scan_audit_dir(self._dir, trusted_server_key=identity.public.raw, allow_tail=True)
            if not report.ok:
                raise IntegrityError(f"Audit log in {self._dir} does not verify, refusing to append "
                                     f"(first bad entry: {report.first_bad}): {report.problems[0]}")
            self._last: AuditEntry | None = entries[-1]
            self._hashes = [e.hash for e in entries]
            self._facts = [_facts(e) for e in entries]
            self._ends.extend(itertools.accumulate(len(e.line()) for e in entries))
            self._plans.update({int(e.payload["round"]): e.seq for e in entries
                                if e.kind == "round_plan" and isinstance(e.payload.get("round"), int)})
            head_entries = json.loads(read_regular_file(self._dir / HEAD, limit=MAX_HEAD_BYTES))["entries"]
            recovered = len(entries) - int(head_entries)
            for e in entries:
                if e.kind in ("audit_open", "manifest"):
                    self._keys = keys_from(e.payload)
        else:
            stray = sorted(p.name for p in self._dir.iterdir())
            if stray:
                raise ConfigError(f"{self._dir} is not empty ({', '.join(stray[:5])}) and holds no "
                                  f"{LOG}: choose an empty or new directory for the audit trail.")
            (self._dir / ARTEFACTS).mkdir()
            self._last = None
            self._hashes = []
            recovered = 0
        self._fh = open(log, "ab")  # noqa: SIM115 - held open for the trail's lifetime
        try:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._fh.close()
            raise IntegrityError(f"Another process is writing the audit log in {self._dir}.") from None
        opened: dict[str, Any] = {"format": FORMAT, "run_id": self._run,
                                  "server": {"name": identity.name, "public_key": identity.public.b64()}}
        opened["software"] = software_versions()
        if recovered:
            opened["recovered_entries"] = recovered  # signed entries found after the head (a crash)
        self._append("audit_reopen" if reopen else "audit_open", opened)

    # -- writing ------------------------------------------------------------------------
    def _append(self, kind: str, payload: dict[str, Any]) -> AuditEntry:
        with self._lock:
            return self._append_locked(kind, payload)

    def _append_locked(self, kind: str, payload: dict[str, Any]) -> AuditEntry:
        if self._fh.closed:
            raise ProtocolError(f"The audit trail in {self._dir} is closed; reopen it to append.")
        keys = self._keys
        if kind in ("audit_open", "manifest"):
            try:
                keys = keys_from(payload)
            except (ValueError, IntegrityError) as exc:
                raise ConfigError(f"Audit entry {kind!r} holds an invalid public key: {exc}") from None
        now = float(self._clock())
        if not math.isfinite(now):
            raise ConfigError(f"The audit clock returned {now!r}; it must return finite seconds.")
        seq = 0 if self._last is None else self._last.seq + 1
        prev = GENESIS if self._last is None else self._last.hash
        entry = make_entry(identity=self._identity, seq=seq, time=now, kind=kind,
                           payload=payload, prev=prev, run=self._run)
        line = entry.line()
        self._fh.write(line)
        self._fh.flush()
        self._last = entry
        self._hashes.append(entry.hash)
        self._facts.append(_facts(entry))
        self._ends.append((self._ends[-1] if self._ends else 0) + len(line))
        if kind == "round_plan" and isinstance(payload.get("round"), int):
            self._plans[int(payload["round"])] = seq
        self._keys = keys
        atomic_write(self._dir / HEAD, make_head(identity=self._identity, last=entry,
                                                  time=entry.time), sync=False, private=False)
        return entry

    def record(self, kind: str, payload: Mapping[str, Any]) -> AuditEntry:
        """Append one entry. ``payload`` must be plain JSON data (arrays, DataFrames, bytes and
        objects are refused: the PHI guard) and fit ``kind``'s schema in kinds.py, if any.

        Raises:
            ConfigError: bad or reserved kind, a payload that is not plain JSON data (names the
                path and the fix), or one that does not fit the kind's schema.
        """
        if not isinstance(kind, str) or not KIND.match(kind):
            raise ConfigError(f"Audit kind {kind!r} must match {KIND.pattern}.")
        if kind in RESERVED:
            raise ConfigError(f"Audit kind {kind!r} is written by the trail itself; use publish() "
                              "for artefacts and store_envelope() for signed messages.")
        plain = _plain(payload, what=f"Audit entry {kind!r}")
        problem = check_payload(kind, plain)
        if problem:
            raise ConfigError(f"Audit entry {kind!r}: {problem}.")
        return self._append(kind, plain)

    def _store(self, data: bytes) -> str:
        if not isinstance(data, bytes):
            raise TypeError(f"Artefact data must be bytes, got {type(data).__name__}.")
        sha = hashlib.sha256(data).hexdigest()
        path = self._dir / ARTEFACTS / sha
        if path.exists():
            if hashlib.sha256(read_regular_file(path, limit=MAX_ARTEFACT_BYTES)).hexdigest() != sha:
                raise IntegrityError(f"Stored artefact artefacts/{sha} was altered on disk.")
        else:
            atomic_write(path, data, sync=False, private=False)
        return sha

    def publish(self, name: str, data: bytes, *, kind: str, meta: Mapping[str, Any] | None = None) -> str:
        """Write ``data`` as ``artefacts/<sha256>`` and append its ``artefact`` entry
        ``{name, kind, sha256, size, meta}``; returns the SHA-256 (hex)."""
        if not isinstance(name, str) or not ARTEFACT_NAME.match(name) or ".." in name:
            raise ConfigError(f"Artefact name {name!r} must match {ARTEFACT_NAME.pattern} without '..'.")
        if not isinstance(kind, str) or not KIND.match(kind):
            raise ConfigError(f"Artefact kind {kind!r} must match {KIND.pattern}.")
        plain_meta = _plain(dict(meta or {}), what=f"Artefact {name!r} meta")
        with self._lock:
            sha = self._store(data)
            self._append("artefact", {"name": name, "kind": kind, "sha256": sha, "size": len(data),
                                      "meta": plain_meta})
        return sha

    def store_envelope(self, envelope_bytes: bytes, *, kind: str, sender: str) -> str:
        """Keep a signed envelope (as received) as an artefact and log an ``envelope`` entry
        with the result of checking its signature against the enrolled key (the verifier
        re-checks it). Returns the envelope's digest (SHA-256 of its payload).

        Raises:
            IntegrityError: the bytes are not an envelope, or its sender/kind differ from the arguments.
        """
        env = parse_stored(envelope_bytes, what="store_envelope: the data")
        if env.sender != sender or env.kind != kind:
            raise IntegrityError(f"store_envelope: envelope is a {env.kind!r} from {env.sender!r}, "
                                 f"expected a {kind!r} from {sender!r}.")
        with self._lock:
            status = signature_status(env, self._keys)
            sha = self._store(envelope_bytes)
            self._append("envelope", {"sender": sender, "kind": kind, "digest": env.digest(), "sha256": sha,
                                      "size": len(envelope_bytes), "signature": status})
        return env.digest()

    def checkpoint(self) -> None:
        """Make everything so far durable: fsync the log, rewrite and fsync the signed head."""
        if self._fh.closed or self._last is None:
            return
        os.fsync(self._fh.fileno())
        atomic_write(self._dir / HEAD, make_head(identity=self._identity, last=self._last,
                                                  time=self._last.time), sync=True, private=False)
        dir_fd = os.open(self._dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def close(self) -> None:
        """Checkpoint and release the log (idempotent)."""
        if not self._fh.closed:
            self.checkpoint()
            self._fh.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (nothing more can be recorded in this run)."""
        return self._fh.closed

    # -- reading ------------------------------------------------------------------------
    @property
    def directory(self) -> Path:
        """The audit directory."""
        return self._dir

    @property
    def run_id(self) -> str:
        """The id of the run this opening of the trail started (32 hex digits)."""
        return self._run

    def hash_at(self, seq: int) -> str | None:
        """The hash of entry ``seq`` of this log (None if it has no such entry); the crash
        journal checks with it that the trail still holds the head it journalled."""
        return self._hashes[seq] if 0 <= seq < len(self._hashes) else None

    def facts(self, after: int) -> list[EntryFacts]:
        """Kind, round and federation id of entries ``after + 1`` .. head (the crash journal checks
        that what follows the head it journalled is what a crash could have left)."""
        with self._lock:
            return self._facts[max(after + 1, 0):]

    def plan_entry_seq(self, round_: int) -> int | None:
        """The sequence number of the (latest) ``round_plan`` entry of round ``round_``, if any."""
        return self._plans.get(round_)

    def segment(self, after: int) -> bytes:
        """The exact lines of entries ``after + 1`` .. head, without the last newline: the
        proof that the head extends entry ``after`` (:mod:`.consistency`)."""
        with self._lock:
            start = self._ends[after] if after >= 0 else 0
            end = self._ends[-1] if self._ends else 0
            with open(self._dir / LOG, "rb") as fh:
                fh.seek(start)
                return fh.read(end - start).rstrip(b"\n")

    @property
    def head(self) -> AuditEntry | None:
        """The last entry written."""
        return self._last

    def __enter__(self) -> AuditTrail:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"AuditTrail(directory={str(self._dir)!r}, server={self._identity.name!r}, identity=<redacted>)"

    def __reduce__(self) -> Any:  # noqa: D105
        raise TypeError("AuditTrail holds the server's signing key and refuses to be pickled.")
