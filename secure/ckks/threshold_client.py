"""Hospital half of the ``ckks_threshold`` mode.

Stage ``commit`` (:meth:`ThresholdClient.first_message`): pack the slot vector of
:mod:`.layout` (a contributor slot reads 1 for each hospital in the sum) and send a signed
commitment with a fresh 32-byte nonce. Stage ``reveal``: once the server relays every hospital's
signed commitment (checked, :func:`.threshold_check.checked_commitments`: this hospital's own is
there, enough contributors, every one a key holder), encrypt under this hospital's own key share
with the set's common polynomials (:mod:`.threshold_sum`) and send the rounded c0 parts
(:mod:`.threshold_upload`), naming the set's digest -- once a round. Stage ``decrypt``
(:meth:`ThresholdClient.handle`): for a request naming that set
(:func:`.threshold_check.check_request`), answer with this holder's smudged, zero-masked share of
the members' sum and of the canary it expands itself, once a round for each present set.

Guarantees: this hospital's ciphertext opens only inside the sum of the set it encrypted for (the
common polynomials come from that set's digest, which holds this hospital's fresh nonce, so it
never encrypts twice under one ``a``); its share opens that sum and nothing else (no single update,
no set below the minimum, no other set, no other round); under t-of-N the same sum is answered
again for another present set after a holder asked dropped, each present set once, with smudging
and a zero-sharing mask fresh for that set -- shares of one sum under two Lagrange coefficients
open nothing but that sum (SECURITY.md, threshold CKKS).
Does not guarantee: that the contributors' inputs are honest (a hospital can poison the sum),
or privacy against the server colluding with ``min_clients - 1`` hospitals whose inputs it knows
(the sum then reveals the remaining one, as in every secure-sum mode).
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np

from clinograph.core.errors import ConfigError, IntegrityError, ProtocolError

from ..aggregation.base import AggregationClient
from ..wire import open_envelope, parse_envelope, seal
from .layout import SlotLayout
from .threshold_check import Commitments, check_request, checked_commitments
from .threshold_messages import (
    ThresholdCommit,
    ThresholdCommitments,
    ThresholdDecrypt,
    ThresholdUpload,
)
from .threshold_relayed import ThresholdKeyHolder
from .threshold_sum import round_polys, sum_share
from .threshold_upload import encode

#: what a contributor writes in its own contributor slot (the holders check the sum themselves)
PRESENT = 1.0
OPTION_DIGEST = "tckks.public_key_digest"
OPTION_PRESET = "tckks.preset"
#: t under t-of-N (absent: N-of-N)
OPTION_THRESHOLD = "tckks.threshold"


class ThresholdClient(AggregationClient):
    """Encrypts this hospital's update under its key share; decrypts its share of the set's sum."""

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
        self._n_ct = self._layout.ciphertext_count(self._public.preset.params.slot_count)
        self._nonce = secrets.token_bytes(32)
        self._vec: np.ndarray | None = None
        #: the commitment set this hospital encrypted for (once a round) and its common polynomials
        self._commitments: Commitments | None = None
        self._a: list[np.ndarray] = []
        #: the sum request answered this round (its canary seed) and the present sets answered
        self._answered: bytes | None = None
        self._presents: set[tuple[str, ...]] = set()

    def first_message(self) -> bytes:
        """Stage ``commit``: pack the slot vector and send a signed commitment with this round's
        fresh nonce. Raises ConfigError for an update that does not fit the plan."""
        me = self.identity.name
        if me not in self.plan.participants:
            raise ProtocolError(f"{me!r} is not a participant of round {self.plan.round}.")
        try:
            self._vec = self._layout.pack(self.update, client=me, tag=PRESENT)
        except ValueError as exc:
            raise ConfigError(f"Update of {me!r} does not fit the plan: {exc}.") from None
        return seal(ThresholdCommit(**self._header(), nonce=self._nonce), self.identity)

    def _header(self) -> dict[str, Any]:
        return dict(federation_id=self.plan.federation_id, round=self.plan.round, client=self.identity.name,
                    spec_digest=self.plan.spec.digest(), dictionary_hash=self.plan.dictionary_hash,
                    public_key_digest=self._public.digest, global_state_digest=self.plan.global_state_digest,
                    plan_digest=self.plan.digest())

    def handle(self, data: bytes) -> bytes | None:
        """Stage ``reveal``: this hospital's upload, once it checked the commitment set. Stage
        ``decrypt``: its signed decryption share of the set's sum.

        Raises:
            IntegrityError: a commitment set without this hospital's own commitment or with too
                few, a second set this round, or a request for another set or a present set already
                answered (the server is named; nothing encrypted or decrypted).
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
        me = self.identity.name
        check_request(msg, commitments=self._commitments, holder=me, ciphertexts=self._n_ct)
        n, t = len(self._public.holders), self._party.threshold or len(self._public.holders)
        if self._answered is not None and (self._answered != msg.canary_seed or msg.present in self._presents
                                           or len(self._presents) >= n - t + 1):
            raise IntegrityError(f"Hospital {me!r} refuses a second decryption request in round {self.plan.round}: "
                                 "only the same sum, for a present set not yet answered, is answered again, at most "
                                 f"N - t + 1 = {n - t + 1} times (each re-ask replaces a holder that went silent) "
                                 "(report the server).")
        seen = self._commitments
        if seen is None:  # check_request refuses this first; kept explicit (no assert in library code)
            raise IntegrityError(f"Hospital {me!r} refuses to decrypt: it encrypted for no commitment set this round.")
        share = sum_share(self._party, public=self._public, request=msg, members=tuple(seen.nonces), a=self._a)
        self._answered = msg.canary_seed
        self._presents.add(msg.present)
        return seal(share, self.identity)

    def _reveal(self, msg: ThresholdCommitments) -> bytes:
        me = self.identity.name
        if self._commitments is not None or self._vec is None:
            raise IntegrityError(f"Hospital {me!r} refuses a second commitment set in round {self.plan.round} (or one "
                                 "before its commitment): it encrypts once, for one set (report the server).")
        # a set below t could be opened by t - 1 colluders and one honest member: never encrypt for one
        seen = checked_commitments(msg, plan=self.plan, peers=self.peers, public=self._public, holder=me,
                                   floor=max(self._holder.min_contributors, self._party.threshold or 0))
        if seen.nonces.get(me) != self._nonce:
            raise IntegrityError(f"Hospital {me!r} refuses to encrypt its update: the commitment set does not hold its "
                                 "own commitment unchanged (report the server).")
        self._commitments = seen
        self._a = round_polys(public=self._public, round=self.plan.round, commitments_sha256=seen.digest,
                              count=self._n_ct)
        c0 = encode(self._party, self._public, self._vec, self._a)
        return seal(ThresholdUpload(**self._header(), commitments_sha256=seen.digest, c0=c0), self.identity)


def contributor_present(client: str) -> float:
    """The value a contributor's slot holds in the sum (for :meth:`.layout.SlotLayout.unpack`)."""
    return PRESENT


__all__ = ["ThresholdClient"]
