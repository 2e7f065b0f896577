"""A hospital's ledger file on disk: signed by the hospital, and never older than the last one it saw.

Every ledger (the local-DP :class:`~.accountant.PrivacyLedger`, the distributed-DP
:class:`~.distributed.DistributedLedger`) is a JSON object with a ``format``, a ``site`` and a
list of ``entries`` that only grows, one a round. :class:`SignedLedgerFile` signs the whole
object with the hospital's Ed25519 identity (a required argument: there is no unsigned ledger)
and, after every write, a **high-water mark** in a separate file beside it
(``<ledger>.highwater.json``, also signed): the number of entries, the SHA-256 of their
canonical JSON and the last ε. On every read the ledger must hold at least that many entries
and begin with exactly those (same digest), so a validly signed but older ledger -- a restored
backup, a copied file -- is refused, as is a ledger deleted while its mark remains.

Does not protect against rolling back (or deleting) the ledger *and* its mark together, i.e.
the whole state directory: keep a copy of the mark elsewhere if that is in your threat model.
A ledger that has no mark yet (written before marks existed) is accepted once and marked.

Re-verifying costs the whole file (parse, canonical JSON, signature, digest of every entry: about
12 ms at 1 000 rounds), so a caller that asks before every release uses :meth:`SignedLedgerFile.
unchanged` instead: both files are *pinned* when read or written (an open descriptor keeps their
inode from being reused by a later file, and their device, inode, size, mtime and ctime are
kept), and ``unchanged()`` is two ``stat`` calls. A file replaced since (every writer replaces it
atomically: a new inode) or edited in place (a new size or ctime) is not unchanged, and the caller
re-reads and re-verifies it. Not seen: an in-place edit of the same size within the clock tick of
the last write (the file system's timestamp granularity); such an edit still fails the signature
at the next read, and a writer that saw nothing overwrites it with what it verified.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import weakref
from collections.abc import Iterator
from pathlib import Path

from clinograph.core.errors import IntegrityError, PrivacyError
from clinograph.core.fileio import atomic_write, read_regular
from clinograph.core.identity import Identity
from clinograph.core.labels import SIG_LEDGER_HIGHWATER

MARK_FORMAT = "clinograph/ledger-highwater/v1"
RESTORE = ("A restored backup is checked against the high-water mark {mark}: only a ledger that holds every entry "
           "recorded so far is accepted, so restore the newest backup; an older one is refused.")


#: bound on a ledger or mark file read back (a ledger grows by one short entry a round)
MAX_LEDGER_BYTES = 64 * 2**20


def canonical(state: dict) -> bytes:
    """The bytes a ledger's signature covers."""
    return json.dumps(state, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def entries_digest(entries: list) -> str:
    return hashlib.sha256(canonical({"entries": entries})).hexdigest()


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _Pin:
    """What one file was when this process last read or wrote it (or that it was absent): its
    inode held open -- so no later file can reuse it while pinned -- and its identity."""

    def __init__(self, path: Path):
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            self.identity: tuple[int, ...] | None = None
            return
        except OSError:
            self.identity = (-1,)  # never the same: the reader reports what is wrong with it
            return
        self.identity = _identity(os.fstat(fd))
        weakref.finalize(self, os.close, fd)

    def holds(self, path: Path) -> bool:
        """True if ``path`` is still the pinned file, unmodified (or still absent)."""
        try:
            return self.identity == _identity(os.stat(path))
        except FileNotFoundError:
            return self.identity is None


class SignedLedgerFile:
    """Read and write one signed ledger file and its high-water mark.

    Args:
        path: the ledger file. site: the hospital (checked against the file).
        signer: the hospital's identity (required: it signs and verifies both files).
        context: the signature context of the ledger. what: its name in messages.
    """

    def __init__(self, path: Path, *, site: str, signer: Identity, context: bytes, what: str):
        if not isinstance(signer, Identity):
            raise PrivacyError(f"{what} of hospital {site!r} needs the hospital's signing identity (signer=), got "
                               f"{type(signer).__name__}: there is no unsigned ledger. Fix: pass the hospital's "
                               "Identity (its <name>.ed25519.pem from `clinograph keys init`).")
        self.path, self.site, self.signer, self.context, self.what = path, site, signer, context, what
        self.mark_path = path.with_name(path.stem + ".highwater.json")
        self.verifications = 0  # whole-file reads (tests count them)
        self._pins: tuple[_Pin, _Pin] | None = None

    def unchanged(self) -> bool:
        """True if the ledger and its mark are exactly the files this object last read (verified)
        or wrote, so that what it holds in memory is what they say; two ``stat`` calls."""
        return self._pins is not None and all(pin.holds(p) for pin, p in zip(self._pins, (self.path, self.mark_path),
                                                                              strict=True))

    @contextlib.contextmanager
    def locked(self, *, exclusive: bool) -> Iterator[None]:
        """An ``fcntl`` lock on ``<ledger>.lock`` beside the ledger (shared to read, exclusive to
        write): every process of the hospital that writes this ledger takes it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # releases the lock

    def forget(self) -> None:
        """Drop the pins: the next :meth:`unchanged` is False (the caller's memory may be ahead of the file)."""
        self._pins = None

    def read(self, *, fmt: str) -> dict | None:
        """The verified ledger state (without its signature), or None if there is no ledger yet.

        Raises:
            PrivacyError: unreadable, another format or site, a missing or invalid signature, or
                older than the high-water mark (or deleted while the mark remains).
        """
        self.forget()
        self.verifications += 1
        pins = (_Pin(self.path), _Pin(self.mark_path))  # before reading: a change after it is seen later
        state = self._load(self.path, fmt=fmt) if self.path.exists() else None
        mark = self._mark()
        if state is None:
            if mark is not None and mark["entries"] > 0:
                raise PrivacyError(
                    f"{self.what} {self.path} is missing, but hospital {self.site!r} has recorded {mark['entries']} "
                    f"round(s) in it (ε {mark['epsilon']:.3f}, high-water mark {self.mark_path.name}); refusing to "
                    "start again from ε = 0. " + RESTORE.format(mark=self.mark_path.name))
            return None
        entries = state.get("entries")
        if not isinstance(entries, list):
            raise PrivacyError(f"{self.what} {self.path} holds no list of entries. "
                               + RESTORE.format(mark=self.mark_path.name))
        if mark is not None and (len(entries) < mark["entries"]
                                 or entries_digest(entries[: mark["entries"]]) != mark["digest"]):
            eps = entries[-1].get("epsilon", 0.0) if entries and isinstance(entries[-1], dict) else 0.0
            raise PrivacyError(
                f"{self.what} {self.path} is not the latest ledger of hospital {self.site!r}: it holds "
                f"{len(entries)} round(s) (ε {eps:.3f}), but the high-water mark {self.mark_path.name} records "
                f"{mark['entries']} (ε {mark['epsilon']:.3f}) that this file does not "
                f"{'contain' if len(entries) < mark['entries'] else 'begin with'}: an older or another ledger, "
                "validly signed, would understate the privacy spent. " + RESTORE.format(mark=self.mark_path.name))
        if mark is None or len(entries) > mark["entries"]:
            self._write_mark(entries)  # first read of an unmarked ledger, or a write whose mark was interrupted
            pins = (pins[0], _Pin(self.mark_path))
        self._pins = pins
        return state

    def write(self, state: dict) -> None:
        """Sign and atomically write ``state``, then advance the high-water mark; both files are
        pinned after (they are this write's as long as the caller holds the ledger's write lock)."""
        self.forget()  # a write that fails part-way leaves the files to be re-read
        signed = {**state, "signature": base64.b64encode(self.signer.sign(canonical(state),
                                                                         context=self.context)).decode()}
        atomic_write(self.path, json.dumps(signed, indent=1, sort_keys=True))
        self._write_mark(state["entries"])
        self._pins = (_Pin(self.path), _Pin(self.mark_path))

    # -- files ------------------------------------------------------------------------------------
    def _load(self, path: Path, *, fmt: str, context: bytes | None = None) -> dict:
        context = context or self.context
        name = self.what if path == self.path else f"High-water mark of the {self.what.lower()}"
        try:
            # a regular file of bounded size (a link to /dev/zero read without bound took all memory)
            state = json.loads(read_regular(path, limit=MAX_LEDGER_BYTES).decode("utf-8"))
            if not isinstance(state, dict):
                raise ValueError("not an object")
        except (OSError, ValueError, RecursionError) as exc:
            raise PrivacyError(f"{name} {path} is unreadable ({type(exc).__name__}); refusing to train without it. "
                               + RESTORE.format(mark=self.mark_path.name)) from None
        if state.get("format") != fmt or state.get("site") != self.site:
            raise PrivacyError(f"{name} {path} is not a {fmt} {'ledger' if path == self.path else 'file'} of hospital "
                               f"{self.site!r}. Point [privacy] "
                               "state_dir at this hospital's own state directory.")
        signature = state.pop("signature", None)
        try:
            if not isinstance(signature, str):
                raise IntegrityError("no signature")
            self.signer.public.verify(base64.b64decode(signature, validate=True), canonical(state), context=context)
        except (IntegrityError, ValueError):
            raise PrivacyError(
                f"{name} {path} was modified outside Clinograph (its signature by hospital {self.site!r} is "
                f"{'missing' if signature is None else 'invalid'}); refusing to train on an accountant history that "
                "may understate the privacy spent. Fix: never edit it by hand. "
                + RESTORE.format(mark=self.mark_path.name)) from None
        return state

    def _mark(self) -> dict | None:
        if not self.mark_path.exists():
            return None
        mark = self._load(self.mark_path, fmt=MARK_FORMAT, context=SIG_LEDGER_HIGHWATER)
        if not (isinstance(mark.get("entries"), int) and isinstance(mark.get("digest"), str)
                and isinstance(mark.get("epsilon"), int | float)):
            raise PrivacyError(f"High-water mark {self.mark_path} is malformed. Restore it with the ledger's newest "
                               "backup.")
        return mark

    def _write_mark(self, entries: list) -> None:
        eps = entries[-1].get("epsilon", 0.0) if entries and isinstance(entries[-1], dict) else 0.0
        mark = {"format": MARK_FORMAT, "site": self.site, "ledger": self.path.name, "entries": len(entries),
                "digest": entries_digest(entries), "epsilon": float(eps)}
        mark["signature"] = base64.b64encode(self.signer.sign(canonical(mark), context=SIG_LEDGER_HIGHWATER)).decode()
        atomic_write(self.mark_path, json.dumps(mark, indent=1, sort_keys=True))
