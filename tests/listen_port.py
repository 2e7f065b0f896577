"""A TCP port on 127.0.0.1 for a server a test starts in another process, free until that server binds it.

The usual trick (bind port 0, read the port, close, pass the number on) hands out a port from the
kernel's ephemeral range, which every outgoing connection on the machine also draws its local port
from: in the seconds before the server process binds it (Python start-up, imports), another test's
client connection can take it, and the server exits with "address already in use" -- one
``make test`` on a fresh clone failed so (a SuperNode's Runtime API port, session 52). Here a port
comes from *below* the ephemeral range (``ip_local_port_range``), where the kernel never picks one
on its own; it is checked free by binding it, and reserved against the other pytest-xdist workers
and processes by an ``flock`` held on ``<tmp>/clinograph-test-ports/<port>.lock`` for the life of
this process (the kernel releases it when the process ends, so no stale reservation survives a crash).
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

_LOCKS = Path(tempfile.gettempdir()) / "clinograph-test-ports"
_held: dict[int, int] = {}  # port -> the file descriptor holding its lock (kept open on purpose)


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def reserve_port(*, low: int = 20000, attempts: int = 2000) -> int:
    """A free port in ``[low, ephemeral start)``, reserved for this process (see the module docstring)."""
    high = _ephemeral_start()
    if high - low < 1000:
        low = max(1024, high - 8000)
    _LOCKS.mkdir(exist_ok=True)
    rng = random.SystemRandom()
    for _ in range(attempts):
        port = rng.randrange(low, high)
        if port in _held:
            continue
        fd = os.open(_LOCKS / f"{port}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another process holds it
            os.close(fd)
            continue
        if not _bindable(port):
            os.close(fd)  # the lock goes with it
            continue
        _held[port] = fd
        return port
    raise AssertionError(f"no free TCP port in [{low}, {high}) after {attempts} attempts")
