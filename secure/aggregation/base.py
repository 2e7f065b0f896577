"""The interface every secure-aggregation mode implements, client and server half side by side.

One round, per mode:

1. The server broadcasts the signed :class:`~clinograph.secure.messages.RoundPlan`.
2. Each hospital trains, builds a :class:`LocalUpdate` and its mode's
   :class:`AggregationClient` answers the plan with ``first_message()``.
3. The driver (in-process or Flower) feeds every received envelope to
   :meth:`AggregationServer.receive`, then calls :meth:`AggregationServer.next_stage`, which
   returns the next per-client messages (or ``None`` when the mode is finished), and
   relays each to :meth:`AggregationClient.handle`, and so on.
4. :meth:`AggregationServer.result` gives the per-module *sums* the mode lets the server see
   (plaintext or masked), or raises :class:`ProtocolError` when the round must abort.

Weights are applied by the client *before* it hands the update to the mode, and the weight
sums travel inside the aggregated vector, so the server learns nothing in the clear beyond
what the plan says.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from clinograph.core.errors import ProtocolError
from clinograph.core.identity import Identity, PublicIdentity

from ..messages import RoundPlan
from ..wire import Envelope


@dataclass(frozen=True, repr=False)
class LocalUpdate:
    """A hospital's contribution before protection: per shared module, ``weight * delta``.

    ``modules`` holds only the modules the hospital trained (flat float64 vectors, already
    multiplied by ``weight``); ``weight`` is the weight it applied to each of them.
    Repr is redacted: it never shows values.
    """

    modules: Mapping[str, np.ndarray]
    weight: float
    metrics: Mapping[str, float] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"LocalUpdate(modules={len(self.modules)}, weight=<redacted>)"


@dataclass(frozen=True, repr=False)
class ModuleSums:
    """What aggregation yields, per module: Σ_i w_i Δ_i, Σ_i w_i and the contributor count.

    A module nobody trained is absent. (F-CMs 4.2.3: each module over its contributors.)
    """

    sums: Mapping[str, np.ndarray]
    weights: Mapping[str, float]
    counts: Mapping[str, int]
    contributors: tuple[str, ...]

    def mean(self, name: str) -> np.ndarray:
        """The weighted mean delta of module ``name``."""
        return self.sums[name] / self.weights[name]

    def __repr__(self) -> str:
        return f"ModuleSums(modules={len(self.sums)}, contributors={len(self.contributors)})"


class AggregateVoided(ProtocolError):
    """The round's sum was refused because of what went into it, not because too few hospitals
    took part: the masked bound check (:func:`clinograph.secure.masking.stages.check_total`),
    the distributed-DP noise test, or (ckks) a contributor refusing the aggregate it decrypted.
    ``inputs``: the hospitals whose inputs were in the refused sum; at least one of them voided
    it (:mod:`clinograph.secure.runtime.attribution` finds which)."""

    def __init__(self, message: str, *, inputs: tuple[str, ...] | list[str]):
        super().__init__(message)
        self.inputs = tuple(sorted(inputs))


class AggregationServer(ABC):
    """Server half of one round of a secure-aggregation mode."""

    mode: str = ""
    #: set when the mode refused the sum for what went into it: the hospitals whose inputs it held
    voided_inputs: tuple[str, ...] | None = None

    def __init__(self, *, plan: RoundPlan, peers: Mapping[str, PublicIdentity], identity: Identity):
        self.plan = plan
        self.peers = dict(peers)
        self.identity = identity

    @property
    @abstractmethod
    def expected(self) -> frozenset[str]:
        """The clients whose message the current stage waits for."""

    @abstractmethod
    def receive(self, envelope: Envelope) -> None:
        """Accept one client's message for the current stage. Raises ProtocolError or
        IntegrityError to reject it (the driver records the reason; the client is dropped)."""

    @abstractmethod
    def next_stage(self) -> dict[str, bytes] | None:
        """Close the current stage (missing clients count as dropped) and return the next
        stage's sealed messages per client, or ``None`` when the protocol is done."""

    @abstractmethod
    def result(self) -> ModuleSums:
        """The aggregate this mode reveals to the server. Raises ProtocolError on abort."""

    def rejected(self) -> dict[str, str]:
        """Client -> reason for every message this round refused (server log, audit)."""
        return {}


class AggregationClient(ABC):
    """Client half of one round of a secure-aggregation mode."""

    mode: str = ""

    def __init__(self, *, plan: RoundPlan, identity: Identity, server: PublicIdentity,
                 peers: Mapping[str, PublicIdentity], update: LocalUpdate):
        self.plan = plan
        self.identity = identity
        self.server = server
        self.peers = dict(peers)
        self.update = update

    @abstractmethod
    def first_message(self) -> bytes:
        """The sealed answer to the round plan."""

    @abstractmethod
    def handle(self, data: bytes) -> bytes | None:
        """Answer one server message of a later stage (``None``: nothing to send)."""

    def decrypted_result(self) -> ModuleSums | None:
        """Modes where the server never sees the sum (CKKS) give it to the client here."""
        return None
