"""Hospital half of the ``ckks_threshold`` mode.

Stage ``commit`` (:meth:`ThresholdClient.first_message`): pack the slot vector of
:mod:`.layout` (a contributor slot reads 1 for each hospital in the sum), encrypt it under the
collective public key this hospital rebuilt and checked at set-up, and send only the signed hash
of its c1 parts. Stage ``reveal``: once the server relays every hospital's signed commitment
(checked: this hospital's own is there, enough contributors), send the ciphertext in the compact
form of :mod:`.threshold_upload` -- the c1 parts signed on their own (a
:class:`~.threshold_messages.ThresholdUpdate` naming the commitment set's digest) inside a
signed :class:`~.threshold_messages.ThresholdUpload` with the rounded c0 parts -- once a round.
Committing first means no contribution can be chosen after another's c1 is known: a hospital
colluding with the server could otherwise sign minus the other contributions' c1 (all but its
victim's), and the holders' sum would be the victim's ciphertext alone.
Stage ``decrypt`` (:meth:`ThresholdClient.handle`): from the server's
:class:`~.threshold_messages.ThresholdDecrypt`, :func:`.threshold_check.check_aggregate` checks
the signed contributions (at least ``max(plan.min_clients, the floor fixed at key generation,
2)`` of this round, each committed in the set this hospital saw and naming it) and adds their
c1 itself; the hospital answers with its smudged decryption
share of *that* sum (and of the canary it expanded itself), once a round. The server never
names a c1 to decrypt.

Guarantees: this hospital's share opens the round's aggregate and nothing else (no single
update, no sub-sum below the minimum, no ciphertext of another round); a second, different
request in the same round is refused (two shares of different sums would open their
difference); under t-of-N the *same* checked sum (the same signed, committed contributions and
canary seed) is answered again for another present set after a holder asked dropped, each set
once, with smudging and a zero-sharing mask fresh for that set -- shares of one sum under two
Lagrange coefficients open nothing but that sum (SECURITY.md, threshold CKKS). A replacement
holder answers only if it saw the same commitment set (every update names that set's digest).
Does not guarantee: that the contributors' inputs are honest (a hospital can poison the sum),
or privacy against the server colluding with ``min_clients - 1`` hospitals whose inputs it knows
(the sum then reveals the remaining one, as in every secure-sum mode).
"""

from __future__ import annotations

from typing import Any

from clinograph.core.errors import ConfigError, IntegrityError, ProtocolError

from ..aggregation.base import AggregationClient
from ..wire import open_envelope, parse_envelope, seal
from .layout import SlotLayout
from .threshold_check import Commitments, check_aggregate, checked_commitments
from .threshold_messages import (
    DecryptionRequest,
    ThresholdCommit,
    ThresholdCommitments,
    ThresholdDecrypt,
    ThresholdUpdate,
    ThresholdUpload,
    c1_digest,
    commitments_digest,
)
from .threshold_relayed import ThresholdKeyHolder
from .threshold_upload import encode

#: what a contributor writes in its own contributor slot (the holders check the sum themselves)
PRESENT = 1.0
OPTION_DIGEST = "tckks.public_key_digest"
OPTION_PRESET = "tckks.preset"
#: t under t-of-N (absent: N-of-N)
OPTION_THRESHOLD = "tckks.threshold"


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
        #: the checked decryption message answered this round (its canary seed and contributions) and
        #: the request this hospital built from it; t-of-N: the present sets it answered (the same
        #: sum may be asked again for another set when a holder asked dropped, each set once)
        self._answered: tuple[tuple[bytes, tuple[bytes, ...]], DecryptionRequest] | None = None
        self._presents: set[tuple[str, ...]] = set()
        self._c0: tuple[bytes, ...] = ()
        self._c1: tuple[bytes, ...] = ()
        #: the commitment set this hospital revealed its c1 against (once a round)
        self._commitments: Commitments | None = None

    def first_message(self) -> bytes:
        """Stage ``commit``: encrypt the slot vector and send the signed hash of its c1 parts (the
        ciphertext itself waits for the commitment set). Raises ConfigError for values the preset
        cannot carry."""
        me = self.identity.name
        if me not in self.plan.participants:
            raise ProtocolError(f"{me!r} is not a participant of round {self.plan.round}.")
        try:
            vec = self._layout.pack(self.update, client=me, tag=PRESENT)
        except ValueError as exc:
            raise ConfigError(f"Update of {me!r} does not fit the plan: {exc}.") from None
        self._c0, self._c1 = encode(self._public, vec)
        return seal(ThresholdCommit(**self._header(), c1_sha256=c1_digest(self._c1)), self.identity)

    def _header(self) -> dict[str, Any]:
        return dict(federation_id=self.plan.federation_id, round=self.plan.round, client=self.identity.name,
                    spec_digest=self.plan.spec.digest(), dictionary_hash=self.plan.dictionary_hash,
                    public_key_digest=self._public.digest)

    def handle(self, data: bytes) -> bytes | None:
        """Stage ``reveal``: this hospital's upload, once it checked the commitment set. Stage
        ``decrypt``: its signed decryption share of the checked aggregate.

        Raises:
            IntegrityError: a commitment set without this hospital's own commitment or with too
                few, a second set or request this round, or a request that is not the aggregate
                of enough committed, signed contributions (the server is named; nothing revealed
                or decrypted).
            ProtocolError: a message for another federation or round, or of an unknown kind.
        """
        env = parse_envelope(data)
        model = {"threshold_ckks_commitments": ThresholdCommitments,
                 "threshold_ckks_decrypt": ThresholdDecrypt}.get(env.kind)
        if model is None:
            raise ProtocolError(f"Unexpected {env.kind[:64]!r} message in a ckks_threshold round.")
        msg = open_envelope(env, sender=self.server, model=model)
        if msg.federation_id != self.plan.federation_id or msg.round != self.plan.round:
            raise ProtocolError(f"Threshold CKKS message for {msg.federation_id!r} round {msg.round}; this is "
                                f"{self.plan.federation_id!r} round {self.plan.round}.")
        if isinstance(msg, ThresholdCommitments):
            return self._reveal(msg)
        if self._commitments is None:
            raise IntegrityError(f"Hospital {self.identity.name!r} refuses to decrypt: it saw no commitment set this "
                                 "round, so it cannot tell whether a contribution was chosen after another's c1 "
                                 "was revealed (report the server).")
        if msg.present != tuple(sorted(set(msg.present))):  # one spelling a set: a reordered set is the same set
            raise IntegrityError(f"Hospital {self.identity.name!r} refuses a decryption request whose present set is "
                                 "not sorted and distinct: a reordered set would be answered again, with fresh "
                                 "smudging under the same Lagrange coefficient (report the server).")
        same = (msg.canary_seed, msg.updates)
        if self._answered is not None:  # t-of-N: only the same checked sum, for a present set not yet answered
            if (self._party.threshold is None or same != self._answered[0] or msg.present in self._presents
                    or len(self._presents) >= len(self._public.holders)):
                raise IntegrityError(f"Hospital {self.identity.name!r} refuses a second decryption request in round "
                                     f"{self.plan.round}: two shares of different sums would open their difference "
                                     "(report the server).")
            request = self._answered[1].model_copy(update={"present": msg.present})
        else:
            _, request = check_aggregate(msg, plan=self.plan, peers=self.peers, public=self._public,
                                         holder=self.identity.name, floor=self._holder.min_contributors,
                                         commitments=self._commitments)
            self._answered = (same, request)
        self._presents.add(msg.present)
        return seal(self._party.decryption_share(request), self.identity)  # on the sum it computed

    def _reveal(self, msg: ThresholdCommitments) -> bytes:
        me = self.identity.name
        if self._commitments is not None:
            raise IntegrityError(f"Hospital {me!r} refuses a second commitment set in round {self.plan.round}: it "
                                 "reveals its c1 once, against one set (report the server).")
        seen = checked_commitments(msg, plan=self.plan, peers=self.peers, public=self._public, holder=me,
                                   floor=self._holder.min_contributors)
        if seen.get(me) != c1_digest(self._c1):
            raise IntegrityError(f"Hospital {me!r} refuses to reveal its c1: the commitment set does not hold its "
                                 "own commitment unchanged (report the server).")
        self._commitments = Commitments(digest=commitments_digest(msg.commits), c1_sha256=seen)
        update = ThresholdUpdate(**self._header(), commitments_sha256=self._commitments.digest, c1=self._c1)
        return seal(ThresholdUpload(federation_id=self.plan.federation_id, round=self.plan.round, client=me,
                                    c0=self._c0, update=seal(update, self.identity)), self.identity)


def contributor_present(client: str) -> float:
    """The value a contributor's slot holds in the sum (for :meth:`.layout.SlotLayout.unpack`)."""
    return PRESENT


__all__ = ["ThresholdClient"]
