"""The one message the Flower transport adds: a SuperNode's signed hello.

Flower's node authentication proves a SuperNode holds a registered key; it does not say which
hospital the node serves. The ServerApp therefore sends each node a fresh nonce, and the
hospital answers with a :class:`NodeHello` sealed with its Clinograph identity (the Ed25519
key enrolled in the federation file). The server maps Flower node ids to hospital names only
from hellos that verify, so a node cannot claim another hospital's name.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ...messages import ID_PATTERN, WireMessage


class NodeHello(WireMessage):
    """Hospital -> server: "Flower node ``node_id`` serves hospital ``hospital`` in ``run_id``"."""

    kind: Literal["node_hello"] = "node_hello"
    federation_id: str = Field(pattern=ID_PATTERN)
    hospital: str = Field(pattern=ID_PATTERN)
    node_id: int = Field(ge=0)
    run_id: int = Field(ge=0)
    nonce: bytes = Field(min_length=32, max_length=32)
