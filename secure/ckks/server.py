"""Server half of the ``ckks`` mode: it only ever adds ciphertexts.

Guarantees: the server holds SEAL parameters and nothing else (no secret, public,
relinearisation or Galois key), so it sees neither any update nor the sum; it streams the
sum (memory O(P): one hospital's ciphertexts at a time plus the running sum); every refused
message is recorded with its reason and the round goes on without that hospital.
Does not guarantee: integrity of the sum against a malicious server (CKKS is malleable; the
hospitals' contributor-tag check catches a forged contributor set, not an added offset), or
that a ciphertext under the right parameters was made with the federation's key (only
key-holding hospitals can tell: their tag check then refuses the aggregate, the round is voided
and the round loop names the hospital, :mod:`clinograph.secure.runtime.attribution`; a hospital
can always poison the sum under the right key).

Stages: ``"updates"`` (expects :class:`CkksUpdate` from every participant) ->
:meth:`CkksServer.next_stage` returns one signed :class:`CkksAggregate`, the same bytes to every contributor ->
``"done"``. :meth:`CkksServer.result` always raises: in this mode the hospitals decrypt
(``SecureMode.server_sees_sum`` is False; call ``CkksClient.decrypted_result()``).

Constructing: ``CkksServer(context=ctx, plan=..., peers=..., identity=...)`` or the factory
``CkksServer.with_context(ctx)`` which has the base constructor's signature.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from typing import Any

from clinograph.core.errors import ConfigError, ProtocolError

from ..aggregation.base import AggregationServer, ModuleSums
from ..aggregation.checks import Unattributed, authenticate, check_header
from ..hazmat.ckks_context import dump_ciphertext
from ..wire import Envelope, seal
from .keys import CkksServerContext, check_plan_options
from .layout import SlotLayout
from .messages import MAX_CIPHERTEXT_BYTES, CkksAggregate, CkksUpdate

_ENVELOPE_SLACK = 64 * 1024


class CkksServer(AggregationServer):
    """Validates, loads and adds the hospitals' ciphertexts; returns the sum to each contributor."""

    mode = "ckks"

    def __init__(self, *, context: CkksServerContext | None = None, **kw: Any):
        super().__init__(**kw)
        if context is None:
            raise ConfigError("CkksServer needs the federation's public CKKS context: "
                              "CkksServer.with_context(CkksServerContext.load(...))(plan=..., ...).")
        check_plan_options(self.plan.options, preset=context.preset.value, digest=context.digest, who="the server")
        self.context = context
        self._layout = SlotLayout.from_plan(self.plan)
        self._n_ct = self._layout.ciphertext_count(context.preset.params.slot_count)
        # Ciphertexts travel as raw envelope attachments (secure/wire.py): SEAL bytes plus a small header.
        self._max_payload = self._n_ct * MAX_CIPHERTEXT_BYTES + _ENVELOPE_SLACK
        self._stage = "updates"
        self._waiting = set(self.plan.participants)
        self._accepted: list[str] = []
        self._sum: list[Any] | None = None
        self._rejected: dict[str, str] = {}
        self._digests: set[str] = set()
        #: SHA-256 of the sealed aggregate broadcast (set by next_stage; audited as the round's release id)
        self.aggregate_sha256: str | None = None

    @classmethod
    def with_context(cls, context: CkksServerContext) -> Callable[..., CkksServer]:
        """A factory with the base constructor's signature, bound to ``context``."""
        return functools.partial(cls, context=context)

    @property
    def expected(self) -> frozenset[str]:
        return frozenset(self._waiting) if self._stage == "updates" else frozenset()

    @property
    def contributors(self) -> tuple[str, ...]:
        """Hospitals whose ciphertexts are in the sum."""
        return tuple(sorted(self._accepted))

    def receive(self, envelope: Envelope) -> None:
        """Accept one :class:`CkksUpdate`; raise (and record) ProtocolError/IntegrityError
        for a wrong-stage, foreign-dictionary, oversized, truncated or foreign-context update.

        A message that is not its sender's update for this round (forged, replayed from an
        earlier round, an exact re-send) raises
        :class:`~clinograph.secure.aggregation.checks.Unattributed` before any state changes."""
        sender = envelope.sender
        try:
            msg = authenticate(self.plan, envelope, peers=self.peers, model=CkksUpdate, max_bytes=self._max_payload,
                               seen=self._digests)
        except Unattributed:
            raise
        except ProtocolError as exc:  # validly signed by the sender for this stage, but malformed: its own doing
            self._waiting.discard(sender)
            self._rejected[sender] = str(exc)
            raise
        if sender in self._accepted:
            # Keep the first update; a second one must not knock an honest hospital out.
            reason = f"Second, different update from {sender!r} in round {self.plan.round} (the first was kept)."
            self._rejected.setdefault(sender, reason)
            raise ProtocolError(reason)
        try:
            if self._stage != "updates":
                raise ProtocolError(f"Wrong stage: the ckks round is {self._stage!r}, no update is accepted now.")
            if sender not in self._waiting:
                raise ProtocolError(f"Unexpected update from {sender!r}: not awaited in round {self.plan.round}.")
            check_header(self.plan, sender=sender, federation_id=msg.federation_id, round_=msg.round,
                         spec_digest=msg.spec_digest, dictionary_hash=msg.dictionary_hash)
            if msg.client != sender:
                raise ProtocolError(f"Update names client {msg.client!r} but was sent by {sender!r}.")
            if msg.context_digest != self.context.digest:
                raise ProtocolError(f"Update from {sender!r} is encrypted under another CKKS context "
                                    f"({msg.context_digest[:12]}…, this round uses {self.context.digest[:12]}…). "
                                    "The hospital must redo the key ceremony.")
            if len(msg.ciphertexts) != self._n_ct:
                raise ProtocolError(f"Update from {sender!r} has {len(msg.ciphertexts)} ciphertexts; "
                                    f"this plan needs {self._n_ct}.")
            cts = []
            for i, raw in enumerate(msg.ciphertexts):
                try:
                    cts.append(self.context.evaluator.load_ciphertext(raw))
                except ValueError as exc:
                    raise ProtocolError(f"Ciphertext {i} from {sender!r} is truncated, corrupt or not under "
                                        f"this round's CKKS parameters: {exc}.") from None
        except Exception as exc:
            self._waiting.discard(sender)
            self._rejected[sender] = str(exc)
            raise
        self._waiting.discard(sender)
        if self._sum is None:
            self._sum = cts
        else:
            for acc, ct in zip(self._sum, cts, strict=True):
                self.context.evaluator.add_inplace(acc, ct)
        self._accepted.append(sender)
        self._digests.add(envelope.digest())

    def next_stage(self) -> dict[str, bytes] | None:
        """First call: close the update stage and return the signed aggregate for each
        contributor. Raises ProtocolError (round aborted) below ``plan.min_clients``.
        Later calls: ``None``."""
        if self._stage != "updates":
            return None
        self._stage, self._waiting = "done", set()
        if len(self._accepted) < self.plan.min_clients or self._sum is None:
            self._stage = "aborted"
            raise ProtocolError(f"Only {len(self._accepted)} ckks update(s) were accepted; the plan needs "
                                f"{self.plan.min_clients}. Round aborted, nothing sent.")
        msg = CkksAggregate(federation_id=self.plan.federation_id, round=self.plan.round,
                            spec_digest=self.plan.spec.digest(), context_digest=self.context.digest,
                            contributors=self.contributors,
                            ciphertexts=tuple(dump_ciphertext(ct) for ct in self._sum))
        self._sum = None
        sealed = seal(msg, self.identity)  # one broadcast: the same bytes for every contributor
        self.aggregate_sha256 = hashlib.sha256(sealed).hexdigest()
        return {client: sealed for client in self.contributors}

    def result(self) -> ModuleSums:
        """Always raises: the server never sees the sum in ckks mode."""
        raise ProtocolError("In ckks mode the server never sees the sum: only the hospitals can decrypt it. "
                            "Call CkksClient.decrypted_result() at each hospital (SecureMode.server_sees_sum is "
                            f"False); contributors this round: {len(self._accepted)}.")

    def rejected(self) -> dict[str, str]:
        return dict(self._rejected)
