"""tests/listen_port.py: ports outside the kernel's ephemeral range, one holder at a time."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import listen_port
from listen_port import reserve_port


def test_a_reserved_port_is_below_the_ephemeral_range_free_and_not_handed_out_twice():
    ports = [reserve_port() for _ in range(20)]
    assert len(set(ports)) == 20
    assert all(1024 <= p < listen_port._ephemeral_start() for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0]))  # free until the server binds it


def test_a_port_another_process_reserved_is_skipped(monkeypatch):
    """Another process (another pytest-xdist worker) holds a port's lock: it is not handed out here."""
    code = "import sys, listen_port; print(listen_port.reserve_port(), flush=True); sys.stdin.read()"
    other = subprocess.Popen([sys.executable, "-c", code], cwd=Path(listen_port.__file__).parent,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        theirs = int(other.stdout.readline())
        draws = iter([theirs, theirs, theirs - 1])
        monkeypatch.setattr(listen_port.random.SystemRandom, "randrange", lambda self, lo, hi: next(draws))
        assert reserve_port() == theirs - 1
    finally:
        other.communicate("", timeout=30)
