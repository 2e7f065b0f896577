"""Client half of the ``masked`` mode (SecAgg+: Bonawitz et al. 2017, Bell et al. 2020).

Guarantees, against an honest-but-curious server: the server learns only the sum of the
survivors' vectors (per-module weighted sums, weight sums and counts), provided fewer than t
of a client's k+1 share holders collude with it. Against an active server that lies about who
dropped: the client reveals nothing when the server lists a neighbour both as surviving and
as dropped, or when the unmask request's survivor set U3 is not the one it signed at the
consistency check and vouched for by >= t valid signatures from distinct members of U3
(:mod:`.consistency`); each client reveals at most once a round. The bound against a lying
server is then fewer than 2t - (k+1) colluding holders for t = k (the default) or a complete graph;
below t = k on a sparse graph a split view needs no colluder (see :mod:`.params`). Does not guarantee: correctness against malicious clients (a
client can send garbage or bad shares and spoil the sum; it cannot learn others' updates),
or privacy of *which* clients took part (the server sees who sent messages).
"""

from __future__ import annotations

import logging
import os

from clinograph.core.errors import ConfigError, IntegrityError, ProtocolError
from clinograph.core.labels import KDF_PAIRWISE_MASK, KDF_SELF_MASK, KDF_SHARE_ENCRYPTION

from ..aggregation.base import AggregationClient
from ..hazmat.masking_prg import add_masks
from ..hazmat.shamir import split_secret
from ..hazmat.x25519 import agree, generate_keypair, hkdf, private_bytes
from ..messages import WireMessage
from ..wire import open_envelope, parse_envelope, seal
from .consistency import (
    check_confirmed_group,
    check_signatures,
    check_survivor_set,
    survivors_digest,
)
from .messages import (
    AdvertiseKeys,
    ConsistencyRequest,
    ConsistencySignature,
    ForwardShares,
    KeyDirectory,
    MaskedInput,
    RevealedShare,
    ShareKeys,
    UnmaskRequest,
    UnmaskResponse,
)
from .params import MaskingParams, neighbour_graph
from .stages import (
    MASKING_VERSION,
    Layout,
    check_unmask_request,
    check_update,
    decrypt_share,
    encode_update,
    encrypt_share,
    holders,
    open_relayed,
    pair_context,
    pairwise_sign,
    round_context,
    to_words,
)

log = logging.getLogger(__name__)

_EXPECT: dict[int, type[WireMessage]] = {1: KeyDirectory, 2: ForwardShares, 3: ConsistencyRequest,
                                         4: UnmaskRequest}
_ABORTED = -1


class MaskingClient(AggregationClient):
    """One hospital's half of a masked round. Answers the plan, then four server messages."""

    mode = "masked"

    def __init__(self, **kw):
        super().__init__(**kw)
        if self.plan.secure_mode != self.mode:
            raise ConfigError(f"RoundPlan.secure_mode is {self.plan.secure_mode!r}; MaskingClient needs 'masked'.")
        if self.identity.name not in self.plan.participants:
            raise ConfigError(f"{self.identity.name!r} is not a participant of round {self.plan.round}.")
        self.params = MaskingParams.from_plan(self.plan)
        self._layout = Layout.of(self.plan)
        self._graph = neighbour_graph(self.plan, self.params.neighbours)
        self._me = self.identity.name
        self._stage = 0
        self._spec_digest = self.plan.spec.digest()
        self.clipped: dict[str, int] = {}
        self._peer_keys: dict[str, tuple[bytes, bytes]] = {}
        self._pair_keys: dict[str, bytes] = {}
        self._pair_ctx: dict[str, bytes] = {}
        self._held: dict[str, tuple[int, bytes, bytes]] = {}
        self._masked_with: frozenset[str] = frozenset()
        self._signed_u3: tuple[str, ...] | None = None
        self._signed_digest: str | None = None  # survivors_digest of _signed_u3

    def __reduce__(self):  # noqa: D105
        raise TypeError("MaskingClient holds a round's key pairs, pairwise keys and self-mask seed and refuses "
                        "to be pickled.")

    def first_message(self) -> bytes:
        """Stage 0: check the update (fails early if out of range), make and sign round keys.

        The update is encoded only at stage 2, so a client holds no vector copy in between."""
        if self._stage != 0:
            raise ProtocolError("first_message() was already called for this round.")
        self.clipped = check_update(self.update, layout=self._layout, params=self.params)
        if self.clipped:
            log.warning("masked: clipped %d value(s) to masked.clip in %d module(s) (round %d)",
                        sum(self.clipped.values()), len(self.clipped), self.plan.round)
        self._c_sk, c_pk = generate_keypair()
        self._s_sk, s_pk = generate_keypair()
        self._stage = 1  # the envelope signature is the key signature (consistency.py: one signature, not two)
        return seal(AdvertiseKeys(**self._header(), version=MASKING_VERSION, c_pk=c_pk, s_pk=s_pk), self.identity)

    def handle(self, data: bytes) -> bytes | None:
        """Answer the server message of the current stage; anything else is a ProtocolError."""
        model = _EXPECT.get(self._stage)
        if model is None:
            raise ProtocolError(f"{self._me!r} expects no server message at this point (stage {self._stage}).")
        try:  # any refused server message ends this client's round: no second try for the server
            msg = open_envelope(parse_envelope(data), sender=self.server, model=model)
            if (msg.federation_id, msg.round, msg.recipient) != (self.plan.federation_id, self.plan.round, self._me):  # type: ignore[attr-defined]
                raise ProtocolError(f"Server message is for {msg.recipient!r} in round {msg.round} of "  # type: ignore[attr-defined]
                                    f"{msg.federation_id!r}, not for {self._me!r} in round {self.plan.round}.")  # type: ignore[attr-defined]
            if isinstance(msg, KeyDirectory):
                reply: WireMessage = self._share_keys(msg)
            elif isinstance(msg, ForwardShares):
                reply = self._masked_input(msg)
            elif isinstance(msg, ConsistencyRequest):
                reply = self._consistency(msg)
            else:
                reply = self._unmask(msg)  # type: ignore[arg-type]
        except (ProtocolError, IntegrityError):
            self._stage = _ABORTED
            raise
        self._stage += 1
        return seal(reply, self.identity)

    # -- stages -------------------------------------------------------------------------

    def _share_keys(self, msg: KeyDirectory) -> ShareKeys:
        neighbours = self._graph[self._me]
        for pk in msg.keys:
            if pk.client not in neighbours or pk.client in self._peer_keys:
                raise ProtocolError(f"Key directory lists {pk.client!r}, who is not a neighbour or is repeated.")
            adv = open_relayed(self.plan, client=pk.client, payload=pk.payload, signature=pk.signature,
                               key=self.peers[pk.client], model=AdvertiseKeys, spec_digest=self._spec_digest)
            self._peer_keys[pk.client] = (adv.c_pk, adv.s_pk)
        self._need(len(self._peer_keys) + 1, "neighbours with keys")
        self._b = os.urandom(32)
        order = holders(self._graph, self._me)
        t = self.params.threshold
        b_sh = split_secret(self._b, threshold=t, n_shares=len(order))
        s_sh = split_secret(private_bytes(self._s_sk), threshold=t, n_shares=len(order))
        out = []
        for pos, h in enumerate(order):
            idx, b_share = b_sh[pos]
            s_share = s_sh[pos][1]
            if h == self._me:
                self._held[h] = (idx, b_share, s_share)
            elif h in self._peer_keys:
                key = self._pair_key(h)
                out.append({"peer": h, "ciphertext": encrypt_share(  # an EncryptedShare, validated by ShareKeys
                    key, plan=self.plan, sender=self._me, recipient=h, index=idx, b_share=b_share, s_share=s_share)})
        return ShareKeys(**self._header(), shares=tuple(out))

    def _masked_input(self, msg: ForwardShares) -> MaskedInput:
        """Stage 2: mask with every keyed neighbour whose shares the server forwarded (U2, Bonawitz
        et al. 2017 round 2), holding the shares that open. A share that does not authenticate or
        carries another index (its dealer, or the server, altered it; or it is for another round)
        is not held, and this client still masks and contributes: refusing the round would let one
        hospital keep an honest neighbour out of every round, unnamed. Its dealer's secret then
        has one holder fewer; a secret left with fewer than t is voided by the server with the
        dealer among the inputs (:meth:`.server.MaskingServer._secret`)."""
        forwarded: set[str] = set()
        for es in msg.shares:
            if es.peer not in self._peer_keys or es.peer in self._held or es.peer in forwarded:
                raise ProtocolError(f"Forwarded share from {es.peer!r}, who is not a keyed neighbour or is repeated.")
            forwarded.add(es.peer)
            try:
                idx, b_share, s_share = decrypt_share(self._pair_key(es.peer), plan=self.plan, sender=es.peer,
                                                      recipient=self._me, ciphertext=es.ciphertext)
                if idx != holders(self._graph, es.peer).index(self._me) + 1:
                    raise ProtocolError(f"Share from {es.peer!r} carries index {idx}, not this client's index.")
            except ProtocolError as exc:
                log.warning("masked: round %d: %s This hospital masks with %r but holds none of its secrets.",
                            self.plan.round, exc, es.peer)
                continue
            self._held[es.peer] = (idx, b_share, s_share)
        self._masked_with = frozenset(forwarded)
        self._need(len(self._masked_with) + 1, "neighbours that shared")
        seeds = [(hkdf(self._b, label=KDF_SELF_MASK, context=round_context(self.plan, self._me)), 1)]
        for v in sorted(self._masked_with):
            try:
                seed = agree(self._s_sk, self._peer_keys[v][1], label=KDF_PAIRWISE_MASK, context=self._pair_context(v))
            except ValueError:  # an honest server refuses such a key at stage 0 (server._accept)
                raise ProtocolError(f"Pairwise-mask key of {v!r} is invalid (low-order point); the server relayed "
                                    "it. Refused.") from None
            seeds.append((seed, pairwise_sign(self._me, v)))
        y = encode_update(self.update, layout=self._layout, params=self.params, checked=True)
        add_masks(y, seeds)  # y_u = x_u + PRG(b_u) + sum_v +-PRG(s_uv), every seed in one pass over y
        return MaskedInput(**self._header(), words=to_words(y))

    def _consistency(self, msg: ConsistencyRequest) -> ConsistencySignature:
        """Stage 3: check and sign the survivor set U3 (once a round; Bonawitz et al. 2017, round 4)."""
        u3 = check_survivor_set(me=self._me, survivors=msg.survivors, participants=self.plan.participants,
                                threshold=self.params.threshold, min_clients=self.plan.min_clients,
                                neighbours=self._graph[self._me], masked_with=self._masked_with,
                                graph=self._graph)
        self._signed_u3 = u3  # the reply's envelope signature is the consistency signature
        self._signed_digest = survivors_digest(self.plan, u3)
        return ConsistencySignature(**self._header(), survivors_digest=self._signed_digest)

    def _unmask(self, msg: UnmaskRequest) -> UnmaskResponse:
        check_unmask_request(me=self._me, survivors=msg.survivors, dropped=msg.dropped,
                             masked_with=self._masked_with, threshold=self.params.threshold)
        if self._signed_u3 is None:  # unreachable through handle(): stage 4 follows stage 3
            raise ProtocolError("No survivor set was signed this round. Refused.")
        verified = check_signatures(plan=self.plan, signed=self._signed_u3, survivors=msg.survivors,
                                    signatures=msg.signatures, peers=self.peers, threshold=self.params.threshold,
                                    digest=self._signed_digest)
        check_confirmed_group(plan=self.plan, me=self._me, signed=self._signed_u3, signatures=msg.signatures,
                              peers=self.peers, graph=self._graph, digest=self._signed_digest, verified=verified,
                              floor=max(self.params.threshold, self.plan.min_clients))
        return UnmaskResponse(**self._header(), shares=self._reveal(set(msg.survivors), set(msg.dropped)))

    def _reveal(self, survivors: set[str], dropped: set[str]) -> tuple[RevealedShare, ...]:
        """The shares for an (already checked) unmask request: b-shares of survivors, s_sk-shares of
        the dropped. Private: only :meth:`_unmask` may call it, after the consistency check."""
        out = []
        for owner in sorted(self._held):  # itself and the neighbours whose shares opened (_masked_input)
            idx, b_share, s_share = self._held[owner]
            if owner in survivors:
                out.append(RevealedShare(owner=owner, secret="self_mask", index=idx, share=b_share))  # noqa: S106
            if owner in dropped:
                out.append(RevealedShare(owner=owner, secret="pairwise_key", index=idx, share=s_share))  # noqa: S106
        return tuple(out)

    # -- helpers --------------------------------------------------------------------------

    def _pair_key(self, peer: str) -> bytes:
        """The share-encryption secret shared with ``peer`` (one X25519 agreement a peer and round)."""
        key = self._pair_keys.get(peer)
        if key is not None:
            return key
        try:
            key = self._pair_keys[peer] = agree(self._c_sk, self._peer_keys[peer][0], label=KDF_SHARE_ENCRYPTION,
                                                context=self._pair_context(peer))
        except ValueError:
            raise ProtocolError(f"Public key of {peer!r} is invalid (low-order point).") from None
        return key

    def _pair_context(self, peer: str) -> bytes:
        """:func:`~.stages.pair_context` of this client and ``peer`` (built once a peer and round:
        both the share-encryption and the pairwise-mask agreement use it)."""
        ctx = self._pair_ctx.get(peer)
        if ctx is None:
            ctx = self._pair_ctx[peer] = pair_context(self.plan, self._me, peer)
        return ctx

    def _need(self, have: int, what: str) -> None:
        if have < self.params.threshold:
            raise ProtocolError(f"Only {have} {what} (counting this client); threshold is {self.params.threshold}. "
                                "This client cannot be unmasked safely and stops.")

    def _header(self) -> dict:
        p = self.plan
        return {"federation_id": p.federation_id, "round": p.round, "client": self._me,
                "spec_digest": self._spec_digest, "dictionary_hash": p.dictionary_hash,
                "global_state_digest": p.global_state_digest, "plan_digest": p.digest()}
