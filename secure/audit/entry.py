"""One audit entry and the signed head: their byte forms, hashes and signatures.

Entry (one line of ``audit.jsonl``, canonical JSON, ``\\n``-terminated)::

    {"hash": h_n, "kind": ..., "payload": {...}, "prev": h_{n-1}, "run": r, "seq": n, "sig": ..., "time": t}

    h_n = SHA-256(HASH_AUDIT_ENTRY || 0x00 || canonical({kind, payload, prev, run, seq, time}))

``run`` (format ``clinograph-audit/2``) is the random id of the run the entry belongs to: each
opening of the trail (``audit_open``, ``audit_reopen``) starts a run and names its id in its
payload, and every entry until the next opening carries it, inside the hash -- so runs in one
directory are never merged and an entry cannot be moved from one run to another. Entries of
format 1 (written before run ids) have no ``run`` field and hash without it.
    sig = Ed25519(SIG_AUDIT_ENTRY || 0x00 || h_n)          (by the server's Identity)
    h_{-1} = 64 zeros

Hashing is domain separated as in RFC 6962 (which prefixes leaves with 0x00 and nodes with
0x01): a labelled prefix means an entry hash can never be confused with any other hash the
protocol computes. Each entry covers its predecessor's hash, so changing, inserting,
reordering or deleting an entry breaks every later link. Truncating the tail is caught by the
signed head (``head.json``)::

    {"entries": n+1, "hash": h_n, "seq": n, "server_key": b64, "sig": ..., "time": t}
    sig = Ed25519(SIG_AUDIT_HEAD || 0x00 || canonical(head without "sig"))

Not guaranteed: a server that keeps an *old* valid head can roll both files back to it; an
auditor who needs that protection compares the head hash with one published out of band
(``clinograph audit verify`` prints it).
"""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from clinograph.core.errors import IntegrityError
from clinograph.core.identity import Identity, PublicIdentity
from clinograph.core.labels import HASH_AUDIT_ENTRY, SIG_AUDIT_ENTRY, SIG_AUDIT_HEAD

from .canonical import b64_strict, canonical_json, parse_canonical

GENESIS = "0" * 64
HEX64 = re.compile(r"^[0-9a-f]{64}$")
KIND = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
RUN_ID = re.compile(r"^[0-9a-f]{32}$")
ENTRY_FIELDS_V1 = frozenset({"hash", "kind", "payload", "prev", "seq", "sig", "time"})
ENTRY_FIELDS = ENTRY_FIELDS_V1 | {"run"}
HEAD_FIELDS = frozenset({"entries", "hash", "seq", "server_key", "sig", "time"})


class AuditEntry(BaseModel):
    """One verified (or just written) entry of the log."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seq: int
    time: float
    kind: str
    payload: dict[str, Any]
    prev: str
    hash: str
    sig: str
    run: str | None = None  # None: a format-1 entry (no run id)

    def line(self) -> bytes:
        """The entry's exact bytes on disk, newline included."""
        return canonical_json(self.model_dump(exclude={"run"} if self.run is None else None)) + b"\n"


def entry_hash(*, seq: int, time: float, kind: str, payload: dict[str, Any], prev: str,
               run: str | None = None) -> str:
    """h_n of the module docstring, hex (without ``run`` for a format-1 entry)."""
    fields: dict[str, Any] = {"kind": kind, "payload": payload, "prev": prev, "seq": seq, "time": time}
    if run is not None:
        fields["run"] = run
    return hashlib.sha256(HASH_AUDIT_ENTRY + b"\x00" + canonical_json(fields)).hexdigest()


def make_entry(*, identity: Identity, seq: int, time: float, kind: str,
               payload: dict[str, Any], prev: str, run: str) -> AuditEntry:
    """Hash and sign a new entry of run ``run`` (payload must already be plain, see canonical.to_plain)."""
    time = float(time)
    digest = entry_hash(seq=seq, time=time, kind=kind, payload=payload, prev=prev, run=run)
    sig = identity.sign(bytes.fromhex(digest), context=SIG_AUDIT_ENTRY)
    return AuditEntry(seq=seq, time=time, kind=kind, payload=payload, prev=prev, hash=digest,
                      sig=base64.b64encode(sig).decode("ascii"), run=run)


def parse_entry(line: bytes, *, index: int) -> AuditEntry:
    """Parse one line (without its newline) and check its form and its own hash.

    The signature and the link to the previous entry are checked by the caller.
    """
    what = f"entry {index}"
    obj = parse_canonical(line, what=what)
    if set(obj) not in (ENTRY_FIELDS, ENTRY_FIELDS_V1):
        raise IntegrityError(f"{what} has fields {sorted(obj)}, expected {sorted(ENTRY_FIELDS)}.")
    run = obj.get("run")
    if run is not None and (not isinstance(run, str) or not RUN_ID.match(run)):
        raise IntegrityError(f"{what}: run must be 32 lowercase hex digits.")
    seq, time, kind = obj["seq"], obj["time"], obj["kind"]
    if type(seq) is not int or seq != index:
        raise IntegrityError(f"{what} carries sequence number {seq!r}; entries must be numbered "
                             "0, 1, 2, ... (an entry was inserted, deleted or reordered).")
    if type(time) not in (int, float):
        raise IntegrityError(f"{what}: time must be a number.")
    if not isinstance(kind, str) or not KIND.match(kind):
        raise IntegrityError(f"{what}: kind {kind!r} does not match {KIND.pattern}.")
    if not isinstance(obj["payload"], dict):
        raise IntegrityError(f"{what}: payload must be an object.")
    for name in ("prev", "hash"):
        if not isinstance(obj[name], str) or not HEX64.match(obj[name]):
            raise IntegrityError(f"{what}: {name} must be 64 lowercase hex digits.")
    b64_strict(obj["sig"], size=64, what=f"{what} signature")
    entry = AuditEntry(seq=seq, time=float(time), kind=kind, payload=obj["payload"], prev=obj["prev"],
                       hash=obj["hash"], sig=obj["sig"], run=run)
    if entry.line()[:-1] != line:  # int time written as float, for instance
        raise IntegrityError(f"{what} is not in canonical form.")
    recomputed = entry_hash(seq=seq, time=entry.time, kind=kind, payload=entry.payload, prev=entry.prev,
                            run=entry.run)
    if recomputed != entry.hash:
        raise IntegrityError(f"{what} (kind {kind!r}): content does not match its hash "
                             "(the entry was modified after it was written).")
    return entry


def check_entry_signature(entry: AuditEntry, key: PublicIdentity) -> None:
    """Raise :class:`IntegrityError` unless the server key signed this entry's hash."""
    sig = b64_strict(entry.sig, size=64, what=f"entry {entry.seq} signature")
    try:
        key.verify(sig, bytes.fromhex(entry.hash), context=SIG_AUDIT_ENTRY)
    except IntegrityError:
        raise IntegrityError(f"entry {entry.seq} (kind {entry.kind!r}): the server signature does "
                             f"not verify under key {key.fingerprint[:16]}.") from None


def make_head(*, identity: Identity, last: AuditEntry, time: float) -> bytes:
    """The signed head's bytes for a log whose last entry is ``last``."""
    body = {"entries": last.seq + 1, "hash": last.hash, "seq": last.seq,
            "server_key": identity.public.b64(), "time": time}
    sig = identity.sign(canonical_json(body), context=SIG_AUDIT_HEAD)
    return canonical_json({**body, "sig": base64.b64encode(sig).decode("ascii")}) + b"\n"


def check_head(data: bytes, *, key: PublicIdentity) -> dict[str, Any]:
    """Parse and verify ``head.json``; returns its fields (IntegrityError otherwise)."""
    if not data.endswith(b"\n") or data.count(b"\n") != 1:
        raise IntegrityError("head.json must be one canonical JSON line ending in a newline.")
    obj = parse_canonical(data[:-1], what="head.json")
    if set(obj) != HEAD_FIELDS:
        raise IntegrityError(f"head.json has fields {sorted(obj)}, expected {sorted(HEAD_FIELDS)}.")
    sig = b64_strict(obj.pop("sig"), size=64, what="head.json signature")
    raw = b64_strict(obj["server_key"], size=32, what="head.json server_key")
    if raw != key.raw:
        raise IntegrityError("head.json names a different server key than the log.")
    try:
        key.verify(sig, canonical_json(obj), context=SIG_AUDIT_HEAD)
    except IntegrityError:
        raise IntegrityError("head.json: the server signature does not verify.") from None
    if type(obj["seq"]) is not int or type(obj["entries"]) is not int or obj["entries"] != obj["seq"] + 1:
        raise IntegrityError("head.json: seq and entries disagree.")
    return obj
