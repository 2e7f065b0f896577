"""Reading a file a user or an attacker named: regular files only, bounded, never blocking.

One mechanism for every reader (TOML configs, hospital tables, the audit verifier): open
without blocking (a FIFO cannot stall the open), check the *opened* descriptor (no race between
a check and the open), never read more than ``limit + 1`` bytes. Callers turn the exceptions
into their own error class with a message that names the file and the fix.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device",
         stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


class NotRegularFile(OSError):
    """The path is a directory, FIFO, device or socket; ``kind`` says which."""

    def __init__(self, path: Path, kind: str):
        super().__init__(f"{path} is {kind}, not a regular file")
        self.kind = kind


class TooLarge(OSError):
    """The file is (or grew) larger than the reader's bound; ``size`` is what was seen."""

    def __init__(self, path: Path, size: int, limit: int):
        super().__init__(f"{path} is {size} bytes, over the bound of {limit} bytes")
        self.size, self.limit = size, limit


def read_regular(path: str | Path, *, limit: int | None = None) -> bytes:
    """The bytes of ``path`` if it is a regular file (of at most ``limit`` bytes).

    Raises:
        FileNotFoundError / OSError: missing or unreadable (``strerror`` says why).
        NotRegularFile: not a regular file. TooLarge: larger than ``limit``.
    """
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(path, KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file"))
        if limit is not None and st.st_size > limit:
            raise TooLarge(path, st.st_size, limit)
        chunks, total = [], 0
        while limit is None or total <= limit:
            chunk = os.read(fd, 1 << 20 if limit is None else min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if limit is not None and total > limit:
            raise TooLarge(path, total, limit)
        return b"".join(chunks)
    finally:
        os.close(fd)


def atomic_write(path: str | Path, data: bytes | str, *, sync: bool = True, private: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically: a temporary file in the same directory, then
    ``os.replace``; with ``sync`` the data is fsync'ed before the rename (durable across a power
    loss, not only a crash). A reader sees the old file or the new one, never a torn write. The
    temporary file is removed if anything fails. ``str`` data is written as UTF-8. ``private``
    files (ledgers, anchors) are readable by their owner only (0600); published ones (the audit
    trail an auditor copies) are 0644.
    """
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    try:
        if not private:
            os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
