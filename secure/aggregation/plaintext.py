"""``insecure_plaintext``: the server sees every hospital's update.

Exists for debugging and for strategies that need individual updates. It warns every time it
is used, the audit log marks the run insecure, and it is refused in production
(:func:`clinograph.secure.policy.require_allowed`).
"""

from __future__ import annotations

import numpy as np

from clinograph.core.errors import ProtocolError

from ..messages import ClientUpdate
from ..wire import Envelope, open_envelope, seal
from .base import AggregationClient, AggregationServer, ModuleSums
from .checks import check_header, decode_modules, encode_modules


class PlaintextClient(AggregationClient):
    """Sends the weighted deltas in the clear, signed."""

    mode = "insecure_plaintext"

    def first_message(self) -> bytes:
        upd = ClientUpdate(
            federation_id=self.plan.federation_id, round=self.plan.round, client=self.identity.name,
            spec_digest=self.plan.spec.digest(), dictionary_hash=self.plan.dictionary_hash,
            weight=float(self.update.weight), modules=encode_modules(self.update.modules, "<f4"),
            metrics=dict(self.update.metrics),
        )
        return seal(upd, self.identity)

    def handle(self, data: bytes) -> bytes | None:
        return None


class PlaintextServer(AggregationServer):
    """Streams the sum: memory O(P), not O(n·P)."""

    mode = "insecure_plaintext"

    def __init__(self, **kw):
        super().__init__(**kw)
        self._waiting = set(self.plan.participants)
        self._sums: dict[str, np.ndarray] = {}
        self._weights: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._contributors: list[str] = []
        self._rejected: dict[str, str] = {}
        self.metrics: dict[str, dict[str, float]] = {}

    @property
    def expected(self) -> frozenset[str]:
        return frozenset(self._waiting)

    def receive(self, envelope: Envelope) -> None:
        sender = envelope.sender
        try:
            if sender not in self._waiting:
                raise ProtocolError(f"Replayed or unexpected update from {sender!r} in round {self.plan.round}.")
            if sender not in self.peers:
                raise ProtocolError(f"{sender!r} is not enrolled.")
            msg = open_envelope(envelope, sender=self.peers[sender], model=ClientUpdate)
            check_header(self.plan, sender=sender, federation_id=msg.federation_id, round_=msg.round,
                         spec_digest=msg.spec_digest, dictionary_hash=msg.dictionary_hash)
            if msg.client != sender:
                raise ProtocolError(f"Update names client {msg.client!r} but was sent by {sender!r}.")
            modules = decode_modules(self.plan, msg.modules, sender=sender)
        except Exception as exc:
            self._waiting.discard(sender)
            self._rejected[sender] = str(exc)
            raise
        self._waiting.discard(sender)
        for name, vec in modules.items():
            if name in self._sums:
                self._sums[name] += vec
            else:
                self._sums[name] = vec.astype(np.float64)
            self._weights[name] = self._weights.get(name, 0.0) + msg.weight
            self._counts[name] = self._counts.get(name, 0) + 1
        self._contributors.append(sender)
        self.metrics[sender] = dict(msg.metrics)

    def next_stage(self) -> dict[str, bytes] | None:
        self._waiting.clear()
        return None

    def result(self) -> ModuleSums:
        if len(self._contributors) < self.plan.min_clients:
            raise ProtocolError(f"Only {len(self._contributors)} update(s) arrived; the plan needs "
                                f"{self.plan.min_clients}. Round aborted, nothing published.")
        return ModuleSums(sums=self._sums, weights=self._weights, counts=self._counts,
                          contributors=tuple(sorted(self._contributors)))

    def rejected(self) -> dict[str, str]:
        return dict(self._rejected)
