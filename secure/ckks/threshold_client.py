"""Hospital half of the ``ckks_threshold`` mode.

Stage ``updates`` (:meth:`ThresholdClient.first_message`): pack the slot vector of
:mod:`.layout` (a contributor slot reads 1 for each hospital in the sum), encrypt it under the
collective public key this hospital rebuilt and checked at set-up, and send it in the compact
form of :mod:`.threshold_upload`: the c1 parts signed on their own (a
:class:`~.threshold_messages.ThresholdUpdate`) inside a signed
:class:`~.threshold_messages.ThresholdUpload` with the rounded c0 parts.
Stage ``decrypt`` (:meth:`ThresholdClient.handle`): from the server's
:class:`~.threshold_messages.ThresholdDecrypt`, :func:`.threshold_check.check_aggregate` checks
the signed contributions (at least ``max(plan.min_clients, the floor fixed at key generation,
2)`` of this round) and adds their c1 itself; the hospital answers with its smudged decryption
share of *that* sum (and of the canary it expanded itself), once a round. The server never
names a c1 to decrypt.

Guarantees: this hospital's share opens the round's aggregate and nothing else (no single
update, no sub-sum below the minimum, no ciphertext of another round); a second, different
request in the same round is refused (two shares of different sums would open their
difference). Does not guarantee: that the contributors' inputs are honest (a hospital can
poison the sum), or privacy against the server colluding with ``min_clients - 1`` hospitals
whose inputs it knows (the sum then reveals the remaining one, as in every secure-sum mode).
"""

from __future__ import annotations

from typing import Any

from clinograph.core.errors import ConfigError, IntegrityError, ProtocolError

from ..aggregation.base import AggregationClient
from ..wire import open_envelope, parse_envelope, seal
from .layout import SlotLayout
from .threshold_check import check_aggregate
from .threshold_messages import ThresholdDecrypt, ThresholdUpdate, ThresholdUpload
from .threshold_relayed import ThresholdKeyHolder
from .threshold_upload import encode

#: what a contributor writes in its own contributor slot (the holders check the sum themselves)
PRESENT = 1.0
OPTION_DIGEST = "tckks.public_key_digest"
OPTION_PRESET = "tckks.preset"


class ThresholdClient(AggregationClient):
    """Encrypts this hospital's update; decrypts its share of the checked aggregate once."""

    mode = "ckks_threshold"

    def __init__(self, *, holder: ThresholdKeyHolder | None = None, **kw: Any):
        super().__init__(**kw)
        if holder is None or holder.party is None or holder.public is None:
            raise ProtocolError(f"Hospital {self.identity.name!r} holds no threshold CKKS key share or collective key: "
                                "the set-up's key generation did not reach it.")
        if self.plan.options.get(OPTION_DIGEST) != holder.public.digest:
            raise ConfigError(f"The plan's collective key ({str(self.plan.options.get(OPTION_DIGEST))[:12]}…) is not "
                              f"the one hospital {self.identity.name!r} checked at set-up "
                              f"({holder.public.digest[:12]}…). Re-run the set-up.")
        self._holder, self._public, self._party = holder, holder.public, holder.party
        self._layout = SlotLayout.from_plan(self.plan)
        self._answered: bytes | None = None

    def first_message(self) -> bytes:
        """The signed, encrypted slot vector. Raises ConfigError for values the preset cannot carry."""
        me = self.identity.name
        if me not in self.plan.participants:
            raise ProtocolError(f"{me!r} is not a participant of round {self.plan.round}.")
        try:
            vec = self._layout.pack(self.update, client=me, tag=PRESENT)
        except ValueError as exc:
            raise ConfigError(f"Update of {me!r} does not fit the plan: {exc}.") from None
        c0, c1 = encode(self._public, vec)
        update = ThresholdUpdate(federation_id=self.plan.federation_id, round=self.plan.round, client=me,
                                 spec_digest=self.plan.spec.digest(), dictionary_hash=self.plan.dictionary_hash,
                                 public_key_digest=self._public.digest, c1=c1)
        return seal(ThresholdUpload(federation_id=self.plan.federation_id, round=self.plan.round, client=me, c0=c0,
                                    update=seal(update, self.identity)), self.identity)

    def handle(self, data: bytes) -> bytes | None:
        """This hospital's signed decryption share of the checked aggregate.

        Raises:
            IntegrityError: the request is not the aggregate of enough signed contributions, or a
                second, different request came this round (the server is named; nothing decrypted).
            ProtocolError: a request for another federation or round.
        """
        msg = open_envelope(parse_envelope(data), sender=self.server, model=ThresholdDecrypt)
        if msg.federation_id != self.plan.federation_id or msg.round != self.plan.round:
            raise ProtocolError(f"Threshold decryption request for {msg.federation_id!r} round {msg.round}; this is "
                                f"{self.plan.federation_id!r} round {self.plan.round}.")
        if self._answered is not None:
            raise IntegrityError(f"Hospital {self.identity.name!r} refuses a second decryption request in round "
                                 f"{self.plan.round}: two shares of different sums would open their difference "
                                 "(report the server).")
        _, request = check_aggregate(msg, plan=self.plan, peers=self.peers, public=self._public,
                                     holder=self.identity.name, floor=self._holder.min_contributors)
        self._answered = seal(self._party.decryption_share(request), self.identity)  # on the sum it computed
        return self._answered


def contributor_present(client: str) -> float:
    """The value a contributor's slot holds in the sum (for :meth:`.layout.SlotLayout.unpack`)."""
    return PRESENT


__all__ = ["ThresholdClient"]
