"""Verifying an audit directory: chain, signatures, head, artefacts, envelopes, schemas.

Guarantees: :func:`verify_audit_dir` reports ``ok`` only if every line of ``audit.jsonl`` is
canonical, correctly numbered, linked to its predecessor's hash, hashed and signed by the
server key; ``head.json`` is signed and names the last entry (no truncation); every artefact
file is referenced by an entry, exists, and hashes to its name and recorded size; every stored
envelope parses, matches its entry, and its sender signature checks as recorded; every known
kind's payload fits its schema (kinds.py); every entry carries the run id its run's opening
(``audit_open``/``audit_reopen``) declared, and no run id repeats. So any single-byte change, insertion or deletion
anywhere in the directory, a truncated log, and a missing or extra file are all reported.
Does not guarantee: that the server was honest when it wrote an entry, or (without
``trusted_server_key``) that the log is the one the expected server wrote -- a forger can
write a fresh, self-consistent log with its own key; pin the key (``VerifyReport.trusted``
says whether it was pinned and matched). Rolling the whole
directory back to an earlier valid state is caught only by comparing against a head taken
elsewhere: ``verify_audit_dir(..., expect_head=)`` / ``clinograph audit verify --expect-head``.

Bounded reads: the verifier opens only *regular* files (a FIFO, a device such as /dev/zero,
a socket or a directory in place of a file -- directly or through a symlink -- is reported,
never read) and reads at most :data:`MAX_LOG_BYTES` of ``audit.jsonl`` (1 GiB),
:data:`MAX_HEAD_BYTES` of ``head.json`` (64 KiB) and :data:`MAX_ARTEFACT_BYTES` of each
artefact (256 MiB, the largest protocol message); a larger file is reported with its name and
the bound, so a hostile directory can neither hang the verifier nor exhaust its memory.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from clinograph.core.arguments import checked_arguments
from clinograph.core.errors import ClinographError, ConfigError, IntegrityError
from clinograph.core.fileio import NotRegularFile, TooLarge, read_regular
from clinograph.core.identity import PublicIdentity, small_order

from ..messages import MAX_MESSAGE_BYTES
from ..refusals import HospitalRefusal
from ..wire import MAGIC, load_payload
from .entry import AuditEntry, check_entry_signature, check_head, parse_entry
from .envelopes import keys_from, parse_stored, signature_status
from .kinds import check_payload

LOG, HEAD, ARTEFACTS = "audit.jsonl", "head.json", "artefacts"
MAX_PROBLEMS = 100
MAX_LOG_BYTES = 1024 ** 3
MAX_HEAD_BYTES = 64 * 1024
MAX_ARTEFACT_BYTES = MAX_MESSAGE_BYTES
def read_regular_file(path: Path, *, limit: int) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``limit`` bytes
    (:func:`clinograph.core.fileio.read_regular`).

    Raises:
        FileNotFoundError / OSError: the file is missing or unreadable.
        IntegrityError: not a regular file, or larger than ``limit``; names the file and bound.
    """
    try:
        return read_regular(path, limit=limit)
    except NotRegularFile as exc:
        raise IntegrityError(f"{path} is {exc.kind}, not a regular file; the verifier reads only regular files. "
                             "Replace it with the file the audit trail wrote.") from None
    except TooLarge as exc:
        raise IntegrityError(f"{path} is {exc.size} bytes, over the verifier's bound of {limit} bytes; "
                             "it was not read. An audit trail does not write files that large.") from None


@dataclass(frozen=True)
class VerifyReport:
    """Outcome of :func:`verify_audit_dir`. ``first_bad`` is the sequence number of the first
    entry found wrong (None if the problems are not tied to an entry, e.g. an extra file)."""

    ok: bool
    entries: int
    problems: list[str] = field(default_factory=list)
    first_bad: int | None = None
    head_hash: str | None = None
    server_key_fingerprint: str | None = None
    #: True only if a trusted server key was given and the log is signed by it. False: the log
    #: was checked against the key it names itself ("self-consistent", not "from this server").
    trusted: bool = False
    #: The run ids in the order the runs were opened (None for a format-1 run without one).
    runs: list[str | None] = field(default_factory=list)
    #: True: an AuditTrail holds the log's writer lock -- a run is still writing it, and the verdict
    #: covers the entries written so far (the head is rewritten after each one), not a finished run.
    being_written: bool = False


@dataclass
class _Scan:
    directory: Path
    trusted: bytes | None
    entries: list[AuditEntry] = field(default_factory=list)
    problems: list[tuple[int | None, str]] = field(default_factory=list)
    key: PublicIdentity | None = None
    keys: dict[str, PublicIdentity] = field(default_factory=dict)
    referenced: set[str] = field(default_factory=set)
    allow_tail: bool = False
    tail: int = 0
    run: str | None = None
    runs: list[str | None] = field(default_factory=list)
    #: the federation of the latest ``manifest`` (None right after an opening)
    federation: str | None = None
    #: (federation, round) -> the inputs of an ``attribution_step`` that voided it
    voided: dict[tuple[str | None, int], frozenset[str]] = field(default_factory=dict)
    being_written: bool = False
    #: digest -> the signed hospital refusal an ``envelope`` entry stored (for ``hospital_refused``)
    refusals: dict[str, HospitalRefusal] = field(default_factory=dict)

    def bad(self, seq: int | None, message: str) -> None:
        self.problems.append((seq, message))


def _check_artefact(scan: _Scan, entry: AuditEntry) -> bytes | None:
    p = entry.payload
    sha, size = p.get("sha256"), p.get("size")
    if not isinstance(sha, str):
        return None
    scan.referenced.add(sha)
    path = scan.directory / ARTEFACTS / sha
    try:
        data = read_regular_file(path, limit=MAX_ARTEFACT_BYTES)
    except IntegrityError as exc:
        scan.bad(entry.seq, f"entry {entry.seq} ({entry.kind} {p.get('name') or p.get('sender')!r}): {exc}")
        return None
    except OSError:
        scan.bad(entry.seq, f"entry {entry.seq} ({entry.kind} {p.get('name') or p.get('sender')!r}): "
                            f"artefact file artefacts/{sha} is missing.")
        return None
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha or len(data) != size:
        found = (f"{len(data)} bytes, recorded {size}" if len(data) != size else
                 f"its SHA-256 is {actual[:16]}…, recorded {sha[:16]}…; same size, {size} bytes")
        scan.bad(entry.seq, f"entry {entry.seq} ({entry.kind} {p.get('name') or p.get('sender')!r}): artefact file "
                            f"artefacts/{sha} does not match what the entry recorded ({found}); it was changed.")
        return None
    return data


def _check_kind(scan: _Scan, entry: AuditEntry) -> None:
    problem = check_payload(entry.kind, entry.payload)
    if problem:
        scan.bad(entry.seq, f"entry {entry.seq} ({entry.kind}): {problem}")
        return
    p = entry.payload
    if entry.kind in ("audit_open", "audit_reopen", "manifest"):
        raw = base64.b64decode(p["server"]["public_key"])
        if scan.key is not None and raw != scan.key.raw:
            scan.bad(entry.seq, f"entry {entry.seq} ({entry.kind}) names a server key other than the "
                                "one that signs the log.")
        if entry.kind == "manifest" or not scan.keys:
            try:
                scan.keys = keys_from(p)
            except (ValueError, IntegrityError):
                scan.bad(entry.seq, f"entry {entry.seq} ({entry.kind}) holds a key that is not a valid "
                                    "Ed25519 public key.")
    if entry.kind in ("audit_open", "audit_reopen"):
        scan.federation = None
    elif entry.kind == "manifest":
        scan.federation = p.get("federation_id")
    elif entry.kind == "attribution_step" and p["outcome"] == "voided":
        scan.voided[(scan.federation, p["round"])] = frozenset(p["hospitals"])
    elif entry.kind == "hospital_retired":
        _check_retirement(scan, entry)
    elif entry.kind == "hospital_refused" and p["signed"]:
        _check_refused(scan, entry)
    if entry.kind == "artefact":
        data = _check_artefact(scan, entry)
        if data is not None and data.startswith(MAGIC):
            _check_embedded_envelope(scan, entry, data)
    elif entry.kind == "envelope":
        data = _check_artefact(scan, entry)
        if data is None:
            return
        try:
            env = parse_stored(data, what=f"entry {entry.seq}: artefacts/{p['sha256']}")
        except IntegrityError as exc:
            scan.bad(entry.seq, str(exc))
            return
        if (env.sender, env.kind, env.digest()) != (p["sender"], p["kind"], p["digest"]):
            scan.bad(entry.seq, f"entry {entry.seq}: stored envelope's sender/kind/digest differ from the entry.")
        status = signature_status(env, scan.keys)
        if status != p["signature"]:
            scan.bad(entry.seq, f"entry {entry.seq}: envelope from {env.sender!r} checks as {status!r}, "
                                f"but the log recorded {p['signature']!r}.")
        elif status == "valid" and env.kind == "hospital_refusal":
            try:
                scan.refusals[env.digest()] = load_payload(env, HospitalRefusal)
            except (ValidationError, ClinographError):
                pass  # not a refusal this verifier can read: a hospital_refused entry naming it is reported


def _check_refused(scan: _Scan, entry: AuditEntry) -> None:
    """A signed ``hospital_refused`` entry says what the hospital's own signed refusal says: it follows
    the ``envelope`` entry that stored that refusal (valid signature, from the hospital it names) and
    carries its round, finality and words (cut as the round loop cuts them). Before, an entry naming a
    digest alone verified -- a server could put words of its own, or another hospital's name, in the log."""
    p = entry.payload
    refusal = scan.refusals.get(p.get("refusal_sha256") or "")
    where = f"entry {entry.seq} (hospital_refused, {p.get('client')!r})"
    if refusal is None:
        scan.bad(entry.seq, f"{where} is marked signed, but no stored, validly signed hospital refusal with its "
                            "refusal_sha256 precedes it: the log does not hold the refusal it reports.")
        return
    text = f"{refusal.error}: {refusal.reason}"
    words = p["reason"] == text or (p["reason"].endswith("…") and text.startswith(p["reason"][:-1]))
    wrong = [what for what, same in (("client", refusal.hospital == p.get("client")),
                                     ("round", refusal.round == p.get("round")),
                                     ("final", refusal.final == p["final"]), ("reason", words)) if not same]
    if wrong:
        scan.bad(entry.seq, f"{where}: its {', '.join(wrong)} differ from the signed refusal it names: the entry "
                            "does not report what the hospital signed.")


def _check_retirement(scan: _Scan, entry: AuditEntry) -> None:
    """The trail's own proof of a ``hospital_retired``: each evidence round has a voided
    ``attribution_step`` before it (same federation) with the named hospital among its inputs, and
    that hospital is the only one in all of them (:mod:`clinograph.secure.runtime.attribution`)."""
    p = entry.payload
    sets = [scan.voided.get((scan.federation, r)) for r in p["evidence"]]
    missing = [r for r, s in zip(p["evidence"], sets, strict=True) if s is None]
    common = frozenset.intersection(*[s for s in sets if s is not None]) if not missing else frozenset()
    if missing or common != {p["client"]}:
        why = (f"round(s) {missing} have no voided attribution_step before it" if missing else
               f"the inputs common to its evidence rounds are {sorted(common)}, not only it")
        scan.bad(entry.seq, f"entry {entry.seq} (hospital_retired) names {p['client']!r}, but {why}: the trail does "
                            "not prove the retirement.")


def _check_embedded_envelope(scan: _Scan, entry: AuditEntry, data: bytes) -> None:
    """A published artefact that is a signed envelope (e.g. a round plan) must verify."""
    try:
        env = parse_stored(data, what="artefact")
    except IntegrityError:
        return  # published data that merely looks like an envelope
    if signature_status(env, scan.keys) == "invalid":
        scan.bad(entry.seq, f"entry {entry.seq}: published envelope {entry.payload.get('name')!r} "
                            f"carries an invalid signature by {env.sender!r}.")


def _server_key(scan: _Scan, first: AuditEntry) -> PublicIdentity | None:
    server: Any = first.payload.get("server") if first.kind == "audit_open" else None
    if not isinstance(server, dict) or not isinstance(server.get("public_key"), str):
        scan.bad(0, "entry 0 must be the trail's 'audit_open' entry naming the server key.")
        return None
    try:
        key = PublicIdentity(str(server.get("name", "server")), base64.b64decode(server["public_key"]))
    except (ValueError, IntegrityError) as e:
        why = " (a small-order point, which verifies forged signatures)" if "small-order" in str(e) else ""
        scan.bad(0, f"entry 0: the server key is not a valid Ed25519 public key{why}.")
        return None
    if scan.trusted is not None and key.raw != scan.trusted:
        scan.bad(0, f"the log is signed by key {key.fingerprint[:16]}, not by the trusted server key "
                    f"{hashlib.sha256(scan.trusted).hexdigest()[:16]}.")
    return key


def _scan_log(scan: _Scan) -> int:
    """Check every line of the log; returns the number of lines (newlines) it holds."""
    try:
        data = read_regular_file(scan.directory / LOG, limit=MAX_LOG_BYTES)
    except IntegrityError as exc:
        scan.bad(None, str(exc))
        return 0
    except OSError:
        scan.bad(None, f"{LOG} is missing or unreadable in {scan.directory}.")
        return 0
    _check_lines(scan, data)
    scan.being_written = _writer_holds(scan.directory / LOG)
    return data.count(b"\n")


def _writer_holds(path: Path) -> bool:
    """Whether an :class:`AuditTrail` holds ``path``'s exclusive lock (a shared one is refused)."""
    import fcntl
    import os

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing releases a shared lock taken here
    return False


def _check_lines(scan: _Scan, data: bytes) -> None:
    if not data:
        scan.bad(0, f"{LOG} is empty.")
        return
    lines = data.split(b"\n")
    if lines[-1]:
        scan.bad(len(lines) - 1, f"{LOG} does not end with a newline: the last line is incomplete.")
    prev = "0" * 64
    shifted: list[int] = []  # consecutive entries after the first whose sequence number is off
    last_off: int | None = None  # the last line whose sequence number was off
    for index, line in enumerate(lines[:-1] if not lines[-1] else lines):
        if len(scan.problems) >= MAX_PROBLEMS:
            break
        try:
            entry = parse_entry(line, index=index)
        except IntegrityError as exc:
            if SEQ_PROBLEM in str(exc) and last_off == index - 1:
                shifted.append(index)  # the same insertion or deletion, once more: said once, below
            else:
                _say_shifted(scan, shifted)
                scan.bad(index, str(exc))
            last_off = index if SEQ_PROBLEM in str(exc) else None
            _claim_named_file(scan, line)
            prev = "?"
            continue
        _say_shifted(scan, shifted)
        last_off = None
        if prev != "?" and entry.prev != prev:
            scan.bad(index, f"entry {index} (kind {entry.kind!r}) does not link to entry {index - 1}'s hash "
                            "(an entry was changed, inserted or removed before it).")
        prev = entry.hash
        if index == 0:
            scan.key = _server_key(scan, entry)
        if scan.key is not None:
            try:
                check_entry_signature(entry, scan.key)
            except IntegrityError as exc:
                scan.bad(index, str(exc))
        _check_run(scan, entry)
        scan.entries.append(entry)
        try:
            _check_kind(scan, entry)
        except Exception as exc:  # a verifier reports, it never crashes on hostile input
            scan.bad(index, f"entry {index} ({entry.kind}) could not be checked: {type(exc).__name__}.")
    _say_shifted(scan, shifted)


SEQ_PROBLEM = "carries sequence number"


def _say_shifted(scan: _Scan, shifted: list[int]) -> None:
    """One line for a run of entries whose sequence numbers are off after the first one named:
    a deleted or inserted line shifts every later one, and one problem a line said nothing new."""
    if shifted:
        which = (f"entry {shifted[0]} also carries a sequence number that is not its position" if len(shifted) == 1
                 else f"entries {shifted[0]} to {shifted[-1]} ({len(shifted)}) also carry sequence numbers that are "
                      "not their position")
        scan.bad(None, f"{which}, after the same insertion, deletion or reordering; not checked further.")
        shifted.clear()


def _claim_named_file(scan: _Scan, line: bytes) -> None:
    """The file a refused line still names (``payload.sha256``) is that line's, not also an
    "extra file": the line is already the problem reported. Names only, nothing else trusted."""
    try:
        sha = json.loads(line)["payload"]["sha256"]
    except (ValueError, KeyError, TypeError, RecursionError):  # hostile lines: already reported
        return
    if isinstance(sha, str) and len(sha) == 64:
        scan.referenced.add(sha)


def _check_run(scan: _Scan, entry: AuditEntry) -> None:
    """An opening starts a run (format 2: with a fresh run id); every other entry carries it."""
    if entry.kind in ("audit_open", "audit_reopen"):
        declared = entry.payload.get("run_id")
        v2 = entry.payload.get("format") == "clinograph-audit/2"
        if v2 and (not isinstance(declared, str) or declared != entry.run):
            scan.bad(entry.seq, f"entry {entry.seq} ({entry.kind}) opens run {declared!r} but carries run "
                                f"{entry.run!r}.")
        elif not v2 and (declared is not None or entry.run is not None):
            scan.bad(entry.seq, f"entry {entry.seq} ({entry.kind}) is format 1 but carries a run id.")
        elif declared is not None and declared in scan.runs:
            scan.bad(entry.seq, f"entry {entry.seq} ({entry.kind}) reuses run id {declared}: runs must not be merged.")
        scan.run = entry.run
        scan.runs.append(entry.run)
    elif entry.run != scan.run:
        scan.bad(entry.seq, f"entry {entry.seq} (kind {entry.kind!r}) carries run {entry.run!r}, but the run "
                            f"opened before it is {scan.run!r} (an entry was moved between runs).")


def _scan_head(scan: _Scan, n_lines: int) -> str | None:
    if scan.key is None:
        return None
    try:
        head = check_head(read_regular_file(scan.directory / HEAD, limit=MAX_HEAD_BYTES), key=scan.key)
    except OSError:
        scan.bad(n_lines, f"{HEAD} is missing: truncation of the log cannot be ruled out.")
        return None
    except IntegrityError as exc:
        scan.bad(n_lines, str(exc))
        return None
    last = scan.entries[-1] if scan.entries else None
    signed = head["seq"] < len(scan.entries) and scan.entries[head["seq"]].hash == head["hash"]
    if scan.allow_tail and head["entries"] < n_lines and signed:
        scan.tail = n_lines - head["entries"]  # signed entries written after the head (a crash)
    elif head["entries"] != n_lines:
        scan.bad(min(head["entries"], n_lines), f"the signed head says the log has {head['entries']} "
                 f"entries, but {LOG} has {n_lines} (truncated or appended without a head).")
    elif last is not None and (last.seq, last.hash) != (head["seq"], head["hash"]):
        scan.bad(last.seq, f"the signed head names entry {head['seq']} hash {head['hash'][:16]}..., "
                           "which is not the log's last entry.")
    return str(head["hash"])


def _scan_files(scan: _Scan) -> None:
    for path in sorted(scan.directory.iterdir()):
        if path.name not in (LOG, HEAD, ARTEFACTS):
            scan.bad(None, f"unexpected file {path.name!r} in the audit directory (only {LOG}, "
                           f"{HEAD} and {ARTEFACTS}/ belong there).")
    art = scan.directory / ARTEFACTS
    if not art.is_dir():
        scan.bad(None, f"{ARTEFACTS}/ is missing.")
        return
    unread = [p for p in sorted(art.iterdir()) if p.name not in scan.referenced]
    if unread and not scan.entries:  # no log to reference them: one problem, not one "extra file" a file
        scan.bad(None, f"{len(unread)} file(s) in {ARTEFACTS}/ not checked: no readable entry of {LOG} references "
                       "them (the log's own problem is above).")
        return
    for path in unread:  # a referenced one that is no regular file: its entry said so
        scan.bad(None, f"extra file artefacts/{path.name!r}: no audit entry references it.")


#: the server key an auditor pins, as they hold it (:func:`trusted_key_bytes`)
TrustedKey = bytes | str | PublicIdentity | None

TRUSTED_KEY_FIX = ("Pass the server's Ed25519 public key: its 32 raw bytes, a PublicIdentity, or the base64 text of "
                   "the server.pub that `clinograph keys init` wrote (Path('server.pub').read_text()).")


def trusted_key_bytes(value: object) -> bytes | None:
    """``trusted_server_key`` as the key's 32 raw bytes: given as bytes, a :class:`PublicIdentity` or
    the base64 text of ``server.pub``. Anything else is a ConfigError naming what came and the fix
    (a 3-byte value was taken as a key that merely did not match: "WRONG KEY" for a typo)."""
    if value is None:
        return None
    if isinstance(value, PublicIdentity):
        return value.raw
    if isinstance(value, str):
        try:
            raw = base64.b64decode(value.strip(), validate=True)
        except ValueError:
            raise ConfigError(f"trusted_server_key: the text given is not base64 ({len(value)} character(s)). "
                              f"{TRUSTED_KEY_FIX}") from None
        what = f"base64 text decoding to {len(raw)} byte(s)"
    elif isinstance(value, bytes | bytearray | memoryview):
        raw, what = bytes(value), f"{len(value)} byte(s)"
    else:
        raise ConfigError(f"trusted_server_key: got a {type(value).__name__}. {TRUSTED_KEY_FIX}")
    if len(raw) != 32:
        raise ConfigError(f"trusted_server_key: got {what}, not the 32 bytes of an Ed25519 public key. "
                          f"{TRUSTED_KEY_FIX}")
    if small_order(raw):  # it would "verify" a forged log: every signature under it can be forged
        raise ConfigError("trusted_server_key: got a small-order Ed25519 point (e.g. all zeros), which verifies "
                          f"forged signatures. {TRUSTED_KEY_FIX}")
    return raw


def scan_audit_dir(directory: Path, *, trusted_server_key: TrustedKey = None, allow_tail: bool = False
                   ) -> tuple[VerifyReport, list[AuditEntry]]:
    """:func:`verify_audit_dir` plus the entries that parsed (for the report).

    ``allow_tail`` (for the writer reopening its own log only) accepts signed entries after
    the head -- what a crash between appending a line and rewriting the head leaves.
    """
    scan = _Scan(directory=Path(directory), trusted=trusted_key_bytes(trusted_server_key), allow_tail=allow_tail)
    head_hash = None
    if not scan.directory.is_dir():
        scan.bad(None, f"{scan.directory} is not a directory.")
    else:
        n_lines = _scan_log(scan)
        head_hash = _scan_head(scan, n_lines)
        _scan_files(scan)
    seqs = [s for s, _ in scan.problems if s is not None]
    report = VerifyReport(
        ok=not scan.problems, entries=len(scan.entries), problems=[m for _, m in scan.problems],
        first_bad=min(seqs) if seqs else None, head_hash=head_hash,
        server_key_fingerprint=scan.key.fingerprint if scan.key else None,
        trusted=scan.trusted is not None and scan.key is not None and scan.key.raw == scan.trusted,
        runs=list(scan.runs), being_written=scan.being_written)
    return report, scan.entries


@checked_arguments(unchecked=("trusted_server_key",))  # trusted_key_bytes names its forms
def verify_audit_dir(directory: Path, *, trusted_server_key: TrustedKey = None,
                     expect_head: str | None = None) -> VerifyReport:
    """Check everything in ``directory`` (see the module docstring for what is and is not
    guaranteed). Never raises for a bad directory: every problem is listed in the report.

    Args:
        directory: an audit directory written by :class:`AuditTrail`.
        trusted_server_key: the server's Ed25519 public key, obtained out of band: its 32 bytes, a
            ``PublicIdentity`` or the base64 text of ``server.pub`` (anything else: ConfigError).
            Without it the log is checked against the key it names itself.
        expect_head: an entry hash taken out of band earlier (e.g. the ``head hash`` an auditor or
            a hospital noted at the end of a run). The log must contain that entry: a directory
            rolled back to an earlier valid state -- which verifies on its own -- fails here.
    """
    report, entries = scan_audit_dir(directory, trusted_server_key=trusted_server_key)
    if expect_head is None:
        return report
    want = expect_head.strip().lower()
    if len(want) != 64 or any(c not in "0123456789abcdef" for c in want):
        problem = f"expect_head (--expect-head) must be a 64-hex-digit entry hash, got {len(want)} character(s)."
    elif any(e.hash == want for e in entries):
        return report
    else:
        problem = (f"Rolled back or a different log: no entry has the expected head hash {want[:16]}… "
                   f"(this log ends at {str(report.head_hash)[:16]}… after {report.entries} entries).")
    return dataclasses.replace(report, ok=False, problems=[*report.problems, problem])
