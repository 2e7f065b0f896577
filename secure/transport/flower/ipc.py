"""Framing for the local socket between a ClientApp process and its SuperNode's hospital.

Flower 1.41 runs each ClientApp call in a fresh ``flwr-clientapp`` process, so a hospital's
round state (mask seeds, key shares, the model) cannot live there. It lives in the SuperNode
process (:mod:`.worker`), and each ClientApp relays its message over an ``AF_UNIX`` socket in
the hospital's state directory. Not a network server: the socket is a file in a directory
only the hospital's user can enter (mode 0700), and the worker also refuses any peer whose
kernel-reported uid differs from its own (``SO_PEERCRED``).

Frame: 4-byte big-endian header length, the JSON header (which lists every part's name and
length), then the parts' bytes in that order.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Mapping
from typing import Any

from clinograph.core.errors import ProtocolError

from ...messages import MAX_MESSAGE_BYTES

MAX_HEADER_BYTES = 1 << 20
MAX_FRAME_BYTES = 2 * MAX_MESSAGE_BYTES + MAX_HEADER_BYTES
SOCKET_NAME = "flower-worker.sock"
MAX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux, 104 on macOS


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ProtocolError("Local socket closed in the middle of a frame.")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def send_frame(sock: socket.socket, header: Mapping[str, Any], parts: Mapping[str, bytes]) -> None:
    """Send one frame: ``header`` (JSON-able, without 'parts') plus named byte parts."""
    head = dict(header)
    head["parts"] = [[name, len(data)] for name, data in parts.items()]
    raw = json.dumps(head, separators=(",", ":")).encode()
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError(f"Frame header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}.")
    sock.sendall(struct.pack(">I", len(raw)) + raw)
    for data in parts.values():
        sock.sendall(data)


def recv_frame(sock: socket.socket) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Receive one frame; ProtocolError if it is malformed or too large."""
    (n,) = struct.unpack(">I", _recv_exact(sock, 4))
    if n > MAX_HEADER_BYTES:
        raise ProtocolError(f"Frame header of {n} bytes exceeds {MAX_HEADER_BYTES}.")
    try:
        header = json.loads(_recv_exact(sock, n))
        spec = [(str(name), int(size)) for name, size in header.pop("parts")]
    except (ValueError, TypeError, KeyError):
        raise ProtocolError("Malformed frame header on the local socket.") from None
    if not isinstance(header, dict):
        raise ProtocolError("Malformed frame header on the local socket.")
    if any(size < 0 for _, size in spec) or sum(size for _, size in spec) > MAX_FRAME_BYTES:
        raise ProtocolError("Frame parts are negative or exceed the size limit.")
    return header, {name: _recv_exact(sock, size) for name, size in spec}


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected AF_UNIX socket (Linux)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def call(path: str, *, header: Mapping[str, Any], parts: Mapping[str, bytes],
         timeout: float) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Send one request to the worker at ``path`` and return its response (bounded by ``timeout``)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            raise ProtocolError(f"No Clinograph hospital worker listens on {path}. Start the SuperNode with "
                                "`python -m clinograph.secure.transport.flower.supernode` (see "
                                "examples/flower_deployment/README.md), not plain flower-supernode.") from None
        send_frame(sock, header, parts)
        return recv_frame(sock)
