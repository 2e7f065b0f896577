"""Server half of the ``masked`` mode (SecAgg+: Bonawitz et al. 2017 sec. 4; Bell et al. 2020).

The server relays keys and encrypted shares, streams the ring sum of masked vectors as they
arrive (memory O(P), never n vectors), then removes the survivors' self-masks and the dropped
clients' pairwise masks from t-of-(k+1) Shamir shares. Between the masked input and the
unmasking it runs the consistency check of Bonawitz et al. 2017 (round 4): it sends every
survivor the survivor set U3, verifies and collects their Ed25519 signatures on it, and
forwards t of them (all it has verified, so any t serve) with the unmask request, and those
of the signers the recipient's confirmed group goes through (:func:`.params.confirmed_group`;
a recipient whose group is below max(t, min_clients) would refuse, so the round aborts):
O(t + min_clients / k) bytes, not O(n) (:mod:`.consistency`). A client silent or refused at
the consistency check is dropped from the rest of the round (it gets no unmask request), but
its masked input is already in the sum and is unmasked through its self-mask shares, as in
the paper (U4 subset of U3); fewer than max(t, min_clients) signers aborts the round.

    sum_{u in U3} y_u - sum_{u in U3} PRG(b_u)
        - sum_{v in U2 minus U3} sum_{u in N(v) cap U3} sign(u, v) PRG(s_{u,v})  = sum_{u in U3} x_u  (mod 2^32)

Stages close when the driver calls :meth:`next_stage` (its deadline); clients that did not
answer count as dropped. Fewer than max(t, plan.min_clients) clients at any stage, or a secret
with fewer than t revealed shares, aborts the round: :meth:`result` raises ProtocolError and
nothing is published. When t of a secret's holders answered but fewer than t shares of it came
(its owner dealt shares that do not open, or a holder withheld one) or the shares do not rebuild
it, the round is voided with the owner and the survivors as its inputs (``voided_inputs``).
"""

from __future__ import annotations

import numpy as np
from pydantic import ValidationError

from clinograph.core.errors import ConfigError, IntegrityError, ProtocolError
from clinograph.core.labels import KDF_PAIRWISE_MASK, KDF_SELF_MASK

from ..aggregation.base import AggregationServer, ModuleSums
from ..aggregation.checks import Unattributed, authenticate, check_header
from ..hazmat.masking_prg import add_masks
from ..hazmat.shamir import combine_shares
from ..hazmat.x25519 import agree, check_public, hkdf, private_from_bytes, public_bytes
from ..messages import WireMessage
from ..wire import Envelope, parse_envelope, seal
from .consistency import survivors_digest
from .messages import (
    MAX_VOUCHED_PAYLOAD,
    AdvertiseKeys,
    ConsistencyRequest,
    ConsistencySignature,
    ForwardShares,
    KeyDirectory,
    MaskedInput,
    PeerKeys,
    ShareKeys,
    SurvivorSignature,
    UnmaskRequest,
    UnmaskResponse,
)
from .params import MaskingParams, confirmed_group, neighbour_graph, smallest_group
from .stages import (
    STAGES,
    Layout,
    check_total,
    decode_sum,
    from_words,
    holders,
    pair_context,
    pairwise_sign,
    round_context,
    split_modules,
    word_bytes,
)

_MODELS: dict[int, type[WireMessage]] = {0: AdvertiseKeys, 1: ShareKeys, 2: MaskedInput, 3: ConsistencySignature,
                                         4: UnmaskResponse}
_DONE = 5


def _relayable(model: type[PeerKeys] | type[SurvivorSignature], sender: str, envelope: Envelope):
    """``sender``'s envelope as the server will relay it (payload and signature as received).

    Raises ProtocolError, charged to the sender, when the payload is longer than a relayed
    message may be (a validly signed message padded with JSON whitespace): refused here, it
    cannot make the stage's relay fail for everyone."""
    try:
        return model(client=sender, payload=envelope.payload, signature=envelope.signature)
    except ValidationError:
        raise ProtocolError(f"{sender!r}'s {envelope.kind[:64]!r} payload has {len(envelope.payload)} bytes; at most "
                            f"{MAX_VOUCHED_PAYLOAD} can be relayed to its peers.") from None


class MaskingServer(AggregationServer):
    """Server half of one masked round. See the module docstring for what it learns."""

    mode = "masked"

    def __init__(self, **kw):
        super().__init__(**kw)
        if self.plan.secure_mode != self.mode:
            raise ConfigError(f"RoundPlan.secure_mode is {self.plan.secure_mode!r}; MaskingServer needs 'masked'.")
        self.params = MaskingParams.from_plan(self.plan)
        self._layout = Layout.of(self.plan)
        self._graph = neighbour_graph(self.plan, self.params.neighbours)
        self._stage = 0
        self._waiting: set[str] = set(self.plan.participants)
        self._accepted: set[str] = set()
        self._alive: list[set[str]] = []  # U1..U5 of the paper: who completed stage 0..4
        self._rejected: dict[str, str] = {}
        self._keys: dict[str, AdvertiseKeys] = {}
        self._outbox: dict[str, list[dict]] = {}  # EncryptedShare fields, by recipient
        self._sum: list[np.ndarray] | None = None
        self._vouched: dict[str, PeerKeys] = {}  # AdvertiseKeys envelopes (payload, signature), to relay
        self._signatures: dict[str, SurvivorSignature] = {}  # ConsistencySignature envelopes, likewise
        self._digests: set[str] = set()  # payload digests of accepted messages (exact re-sends)
        self._revealed: dict[tuple[str, str], list[tuple[int, bytes]]] = {}
        self._result: ModuleSums | None = None
        self._abort: str | None = None
        self._spec_digest = self.plan.spec.digest()
        self._u3_digest: str | None = None  # survivors_digest of U3, once U3 is known (stage 3)
        self._max_bytes = (64 * 1024 + 1024 * len(self.plan.participants),  # max_message_bytes: other stages,
                           word_bytes(self._layout, self.params) + 4096)  # and the masked input's

    @property
    def expected(self) -> frozenset[str]:
        return frozenset(self._waiting)

    @property
    def stage(self) -> str:
        """Name of the current stage."""
        return STAGES[self._stage]

    @property
    def max_message_bytes(self) -> int:
        """Largest envelope accepted at the current stage (a masked vector is one raw attachment
        of its word bytes, plus a small JSON header)."""
        return self._max_bytes[self._stage == 2]

    def receive_bytes(self, sender: str, data: bytes) -> None:
        """Parse raw bytes that arrived on ``sender``'s authenticated channel, then :meth:`receive`.

        Bytes that are no envelope, or name another hospital, raise :class:`Unattributed` and
        change nothing.
        """
        try:
            env = parse_envelope(data, max_bytes=self.max_message_bytes)
        except ProtocolError as exc:
            raise Unattributed("malformed_envelope", str(exc)) from None
        if env.sender != sender:
            raise Unattributed("channel_mismatch", f"Envelope claims sender {env.sender!r} but arrived from "
                               f"{sender!r}.")
        self.receive(env)

    def receive(self, envelope: Envelope) -> None:
        """Accept one client message of the current stage.

        A message that is not its sender's, for this round and stage (forged, replayed from
        another round or stage, an exact re-send) raises :class:`Unattributed` *before* any
        state changes: it cannot knock the hospital it names out of the round. An authenticated
        message that breaks a rule drops its sender (ProtocolError / IntegrityError, recorded).
        """
        sender = envelope.sender
        try:
            msg = authenticate(self.plan, envelope, peers=self.peers, model=_MODELS[self._stage],
                               max_bytes=self.max_message_bytes, seen=self._digests)
        except Unattributed:
            raise
        except ProtocolError as exc:  # validly signed for this stage but malformed: the sender's own doing
            if sender in self._waiting:
                self._refuse(sender, exc)
            raise
        try:
            if sender not in self._waiting:
                raise ProtocolError(f"Unexpected message from {sender!r} at stage '{self.stage}' of round "
                                    f"{self.plan.round} (already answered, dropped or not asked).")
            spec_digest = msg.spec_digest  # type: ignore[attr-defined]
            check_header(self.plan, sender=sender, federation_id=msg.federation_id, round_=msg.round,  # type: ignore[attr-defined]
                         spec_digest=None if spec_digest == self._spec_digest else spec_digest,  # known good: not rehashed
                         dictionary_hash=msg.dictionary_hash,  # type: ignore[attr-defined]
                         global_state_digest=msg.global_state_digest,  # type: ignore[attr-defined]
                         plan_digest=msg.plan_digest)  # type: ignore[attr-defined]
            if msg.client != sender:  # type: ignore[attr-defined]
                raise ProtocolError(f"Message names client {msg.client!r} but was sent by {sender!r}.")  # type: ignore[attr-defined]
            self._accept(sender, msg, envelope)
        except (ProtocolError, IntegrityError) as exc:
            self._refuse(sender, exc)
            raise
        self._waiting.discard(sender)
        self._accepted.add(sender)
        self._digests.add(envelope.digest())

    def _refuse(self, sender: str, exc: Exception) -> None:
        if sender in self._waiting:
            self._waiting.discard(sender)
            self._rejected[sender] = str(exc)
        else:
            self._rejected.setdefault(sender, str(exc))

    def _accept(self, sender: str, msg: WireMessage, envelope: Envelope) -> None:
        if isinstance(msg, AdvertiseKeys):  # its envelope signature, verified, is the key signature
            for what, raw in (("c_pk", msg.c_pk), ("s_pk", msg.s_pk)):
                try:
                    check_public(raw)
                except ValueError:  # relayed, it would make each neighbour fail later, unattributed
                    raise ProtocolError(f"{sender!r} advertised an unusable {what} (a low-order X25519 point: "
                                        "every agreement with it is zero). Refused for this round.") from None
            self._vouched[sender] = _relayable(PeerKeys, sender, envelope)  # first: may refuse
            self._keys[sender] = msg
        elif isinstance(msg, ShareKeys):
            keyed = self._graph[sender] & self._alive[0]
            peers = [s.peer for s in msg.shares]
            if sorted(peers) != sorted(keyed):
                raise ProtocolError(f"{sender!r} sent shares for {len(peers)} peer(s); expected exactly one for "
                                    f"each of its {len(keyed)} neighbour(s) with keys.")
            for s in msg.shares:  # ForwardShares validates each (strictly) when it is built: no model a share here
                self._outbox.setdefault(s.peer, []).append({"peer": sender, "ciphertext": s.ciphertext})
        elif isinstance(msg, MaskedInput):
            parts = split_modules(from_words(msg.words, layout=self._layout, params=self.params, sender=sender),
                                  layout=self._layout)  # kept per module: decode_sum frees each in turn
            if self._sum is None:
                self._sum = [p.astype(p.dtype.newbyteorder("=")) for p in parts]
            else:
                for acc, p in zip(self._sum, parts, strict=True):
                    np.add(acc, p, out=acc)
        elif isinstance(msg, ConsistencySignature):  # its envelope signature is the consistency signature
            if self._u3_digest is None:
                self._u3_digest = survivors_digest(self.plan, self._alive[2])  # U3 is fixed from stage 3 on
            if msg.survivors_digest != self._u3_digest:
                raise ProtocolError(f"{sender!r} signed a survivor set U3 other than the one it was sent; its "
                                    "consistency signature does not verify on this round's U3.")
            self._signatures[sender] = _relayable(SurvivorSignature, sender, envelope)
        elif isinstance(msg, UnmaskResponse):
            self._take_shares(sender, msg)

    def _take_shares(self, sender: str, msg: UnmaskResponse) -> None:
        survivors, shared = self._alive[2], self._alive[1]
        seen, staged, held = set(), [], self._graph[sender] | {sender}  # whose shares the sender holds
        for r in msg.shares:
            want = "self_mask" if r.owner in survivors else "pairwise_key" if r.owner in shared else None
            if r.owner not in held or r.secret != want or r.owner in seen:
                raise ProtocolError(f"{sender!r} revealed an unexpected or repeated share ({r.secret} of {r.owner!r}).")
            if r.index != holders(self._graph, r.owner).index(sender) + 1:
                raise ProtocolError(f"{sender!r} revealed a share of {r.owner!r} under the wrong index.")
            seen.add(r.owner)
            staged.append(r)
        for r in staged:
            self._revealed.setdefault((r.owner, r.secret), []).append((r.index, r.share))

    def next_stage(self) -> dict[str, bytes] | None:
        if self._stage >= _DONE:
            return None
        answered = set(self._accepted)
        alive = self._prune(answered) if self._stage < 2 else answered
        self._alive.append(alive)
        self._accepted, self._waiting = set(), set()
        need = max(self.params.threshold, self.plan.min_clients)
        if len(alive) < need:
            short = (f", and {len(answered) - len(alive)} of them were left with fewer than t - 1 = "
                     f"{self.params.threshold - 1} neighbours (their secrets could not be rebuilt)"
                     if len(alive) < len(answered) else "")
            return self._stop(f"Only {len(answered)} client(s) completed stage '{self.stage}'{short}; the round needs "
                              f"{need} (max of masked.threshold and min_clients). Round aborted, nothing published.")
        closing, self._stage = self._stage, self._stage + 1
        p = self.plan
        out: dict[str, WireMessage] = {}
        if closing == 0:
            for u in alive:
                keys = tuple(self._vouched[v] for v in sorted(self._graph[u] & alive))  # built once a client
                out[u] = KeyDirectory(federation_id=p.federation_id, round=p.round, recipient=u, keys=keys)
        elif closing == 1:
            for u in alive:
                fwd = tuple(s for s in self._outbox.get(u, ()) if s["peer"] in alive)
                out[u] = ForwardShares(federation_id=p.federation_id, round=p.round, recipient=u, shares=fwd)
            self._outbox.clear()
        elif closing == 2:
            u3 = tuple(sorted(alive))
            small = smallest_group(self._graph, alive)
            if len(small) < need:  # each hospital of that group would refuse to sign (check_survivor_set)
                return self._stop(f"The {len(alive)} clients with masked inputs fall apart into groups that share no "
                                  f"pairwise mask; the smallest has {len(small)} (the round needs {need}: max of "
                                  "masked.threshold and min_clients), so its sum could be opened on its own. Round "
                                  "aborted, nothing published (too many dropouts for this neighbour graph).")
            for u in alive:
                out[u] = ConsistencyRequest(federation_id=p.federation_id, round=p.round, recipient=u, survivors=u3)
        elif closing == 3:
            survivors = tuple(sorted(self._alive[2]))
            dropped = tuple(sorted(self._alive[1] - self._alive[2]))
            quorum = sorted(alive)[:self.params.threshold]  # t: what a client checks (consistency.py)
            for u in alive:  # and the signers its confirmed group goes through (check_confirmed_group)
                group, through = confirmed_group(self._graph, u, survivors, alive.__contains__, need)
                if len(group) < need:  # u would refuse the request (a signer's input masks with all its group)
                    return self._stop(f"Only {len(group)} of the survivors are joined to {u!r} through hospitals that "
                                      f"confirmed the survivor set (the round needs {need}: max of masked.threshold "
                                      "and min_clients); the others may not have masked with their neighbours, so "
                                      "that sum could be opened on its own. Round aborted, nothing published (too "
                                      "many hospitals left at the consistency check for this neighbour graph).")
                sigs = tuple(self._signatures[c] for c in sorted(set(quorum) | set(through)))
                out[u] = UnmaskRequest(federation_id=p.federation_id, round=p.round, recipient=u,
                                       survivors=survivors, dropped=dropped, signatures=sigs)
        else:
            try:
                self._unmask()
            except ProtocolError as exc:
                return self._stop(str(exc))
            return None
        self._waiting = set(out)
        return {u: seal(m, self.identity) for u, m in out.items()}

    def _prune(self, alive: set[str]) -> set[str]:
        """``alive`` without the hospitals that would stop at the next stage (:meth:`.client.MaskingClient._need`):
        fewer than t - 1 of their neighbours left (at stage 0: with keys; at stage 1: that shared), so their
        secrets could never be rebuilt. Each is treated as having dropped now -- its message not used, no
        message sent to it -- which may leave a neighbour short in turn (repeated until none is). Before
        (session 53), the honest server sent them the stage's message and each refused it, an alarm for
        nothing (n = 8, two neighbouring hospitals silent from the start: four refusals)."""
        t, alive = self.params.threshold, set(alive)
        short = {u for u in alive if len(self._graph[u] & alive) + 1 < t}
        while short:
            alive -= short
            short = {u for u in alive if len(self._graph[u] & alive) + 1 < t}
        return alive

    def _stop(self, reason: str) -> None:
        self._abort, self._stage, self._sum = reason, _DONE, None
        return None

    def _secret(self, owner: str, kind: str) -> bytes:
        shares = self._revealed.get((owner, kind), [])
        t = self.params.threshold
        if len(shares) < t:
            answered = [h for h in holders(self._graph, owner) if h in self._alive[4]]
            if len(answered) >= t:  # holders that answered without a share of it: it dealt bad shares, or they lie
                self._void_by(owner)
                raise ProtocolError(f"Too few shares of the {kind.replace('_', ' ')} of {owner!r}: {len(shares)} of its "
                                    f"{len(holders(self._graph, owner))} holders revealed one; {len(answered)} answered "
                                    f"(the threshold is {t}). It dealt shares that do not open, or a holder withheld "
                                    "one. Round voided, nothing published.")
            raise ProtocolError(f"Only {len(shares)} share(s) of {owner!r}'s {kind.replace('_', ' ')} arrived; "
                                f"{t} are needed. Round aborted, nothing published.")
        try:
            return combine_shares(shares[:t])
        except ValueError:
            self._void_by(owner)
            raise ProtocolError(f"The shares of {owner!r}'s {kind.replace('_', ' ')} do not rebuild a secret (it "
                                "dealt, or a holder revealed, a bad share). Round voided, nothing published.") from None

    def _void_by(self, owner: str) -> None:
        """A secret of ``owner`` did not rebuild: ``owner`` dealt a bad share, or a survivor revealed
        one (shares are authenticated end to end, so nobody else can spoil them). The round is voided
        with all of them as its inputs, so group testing can name whoever it was
        (:mod:`clinograph.secure.runtime.attribution`)."""
        self.voided_inputs = tuple(sorted(self._alive[2] | {owner}))

    def _unmask(self) -> None:
        shared, survivors = self._alive[1], self._alive[2]
        total = self._sum
        if total is None:
            raise ProtocolError("No masked vector arrived. Round aborted, nothing published.")
        seeds = [(hkdf(self._secret(v, "self_mask"), label=KDF_SELF_MASK, context=round_context(self.plan, v)), -1)
                 for v in sorted(survivors)]
        for v in sorted(shared - survivors):
            sk = private_from_bytes(self._secret(v, "pairwise_key"))
            if public_bytes(sk) != self._keys[v].s_pk:
                self._void_by(v)
                raise ProtocolError(f"The key rebuilt for dropped client {v!r} does not match its advertised key (it "
                                    "dealt, or a holder revealed, a bad share). Round voided, nothing published.")
            for u in sorted(self._graph[v] & survivors):
                seed = agree(sk, self._keys[u].s_pk, label=KDF_PAIRWISE_MASK, context=pair_context(self.plan, u, v))
                seeds.append((seed, -pairwise_sign(u, v)))
        add_masks(total, seeds)  # every secret rebuilt and checked first: one pass over the sum
        try:
            check_total(total, layout=self._layout, params=self.params, plan=self.plan, survivors=survivors)
        except ProtocolError:
            self.voided_inputs = tuple(sorted(survivors))  # every vector in the refused sum
            raise
        self._sum = None
        self._result = decode_sum(total, layout=self._layout, params=self.params, contributors=survivors,
                                  consume=True)
        self._revealed = {}

    def result(self) -> ModuleSums:
        if self._abort is not None:
            raise ProtocolError(self._abort)
        if self._result is None:
            raise ProtocolError(f"The masked round is not finished (stage '{self.stage}').")
        return self._result

    def rejected(self) -> dict[str, str]:
        return dict(self._rejected)
