"""Server half of the ``ckks_threshold`` mode: it adds ciphertexts, then opens the sum with
every key holder's decryption share (it is the combiner; it learns the sum, as in ``masked``).

Stages: ``commit`` (a :class:`~.threshold_messages.ThresholdCommit` from every participant: the
hash of its c1) -> :meth:`ThresholdServer.next_stage` relays them all
(:class:`~.threshold_messages.ThresholdCommitments`) -> ``updates`` (a
:class:`~.threshold_messages.ThresholdUpload` from every committed hospital: rounded c0 parts and
the separately signed c1 parts, :mod:`.threshold_upload`, matching its commitment)
-> :meth:`ThresholdServer.next_stage` adds them and sends every key holder asked (N-of-N: all;
t-of-N: t whose upload arrived) one signed :class:`~.threshold_messages.ThresholdDecrypt` (every
contributor's signed c1 parts, a fresh public canary seed and the present set: each holder adds
the c1 itself and decrypts that sum) -> ``decrypt`` (a
:class:`~.threshold_messages.DecryptionShare` from every holder asked; t-of-N: one that does not
answer is replaced, the same message re-sent with another present set) -> :meth:`ThresholdServer.next_stage` combines (:class:`~.threshold.Combiner`: a share
failing the canary check names its holder) -> ``done``; :meth:`ThresholdServer.result` gives
the :class:`~clinograph.secure.aggregation.ModuleSums`.

Guarantees: the server never holds the secret key nor any share of it; it decrypts nothing
without every holder (N-of-N) or t of them (t-of-N, ``[federation] tckks_threshold``), and each
holder answers only a request it checked (:mod:`.threshold_check`). Dropouts: under t-of-N the
server asks the first t holders (by name) whose update arrived; holders that left before
uploading are simply not asked, and the next round goes on under the same key. Does not
guarantee: liveness when fewer than t holders remain -- a holder asked that does not answer is
replaced by another live one for the same sum (the holders answer the same ``c1`` halves again
for the new present set, :mod:`.threshold_client`); N-of-N: any holder absent aborts the round
(re-run the set-up without it).
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable
from typing import Any

import numpy as np

from clinograph.core.errors import ClinographError, ConfigError, ProtocolError

from ..aggregation.base import AggregationServer, ModuleSums
from ..aggregation.checks import Unattributed, authenticate, check_header
from ..wire import Envelope, open_envelope, parse_envelope, seal
from . import threshold_upload as upload
from .layout import SlotLayout
from .threshold import CollectivePublicKey, Combiner
from .threshold_client import OPTION_DIGEST, contributor_present
from .threshold_messages import (
    MAX_UPDATE_ENVELOPE,
    DecryptionShare,
    ThresholdCommit,
    ThresholdCommitments,
    ThresholdDecrypt,
    ThresholdUpdate,
    ThresholdUpload,
    c1_digest,
    commitments_digest,
)
from .threshold_upload import read_c0, read_c1, sum_c1


class ThresholdServer(AggregationServer):
    """Adds the updates, asks every key holder to decrypt the checked sum, combines the shares."""

    mode = "ckks_threshold"

    def __init__(self, *, public: CollectivePublicKey | None = None, **kw: Any):
        super().__init__(**kw)
        if public is None:
            raise ConfigError("ThresholdServer needs the collective public key from the set-up: "
                              "ThresholdServer.with_key(public)(plan=..., ...).")
        if self.plan.options.get(OPTION_DIGEST) != public.digest:
            raise ConfigError("The plan does not name this collective threshold CKKS key (option "
                              f"{OPTION_DIGEST!r}); plan options come from the mode's set-up.")
        self.public = public
        self._layout = SlotLayout.from_plan(self.plan)
        self._n_ct = self._layout.ciphertext_count(public.preset.params.slot_count)
        self._stage = "commit"
        self._waiting = set(self.plan.participants)
        #: per committed hospital: its signed ThresholdCommit envelope and its c1 hash
        self._commits: dict[str, tuple[bytes, str]] = {}
        self._commit_digest: str | None = None
        #: per contributor: its signed ThresholdUpdate envelope (forwarded to the holders), its c1, its rounded c0
        self._updates: dict[str, tuple[bytes, list[np.ndarray], list[np.ndarray]]] = {}
        self._shares: dict[str, DecryptionShare] = {}
        self._combiner: Combiner | None = None
        self._decrypt_message: ThresholdDecrypt | None = None
        self._silent: set[str] = set()  # t-of-N: holders asked this round that did not answer
        self._result: ModuleSums | None = None
        self._rejected: dict[str, str] = {}
        self._digests: set[str] = set()

    @classmethod
    def with_key(cls, public: CollectivePublicKey) -> Callable[..., ThresholdServer]:
        """A factory with the base constructor's signature, bound to ``public``."""
        return functools.partial(cls, public=public)

    @property
    def expected(self) -> frozenset[str]:
        return frozenset(self._waiting) if self._stage in ("commit", "updates", "decrypt") else frozenset()

    def receive(self, envelope: Envelope) -> None:
        """Accept one commitment (stage ``commit``), update (stage ``updates``) or decryption share
        (stage ``decrypt``)."""
        sender = envelope.sender
        model = {"commit": ThresholdCommit, "updates": ThresholdUpload}.get(self._stage, DecryptionShare)
        # a commitment: a hash; an upload: its c0 and c1 parts (< 2 x 160 000 bytes a ciphertext); a share: one
        # 2-limb polynomial per c1 (+ the canary)
        limit = {ThresholdCommit: 0, ThresholdUpload: self._n_ct * 320_000}.get(model, (self._n_ct + 1) * 2 * 8 * 8192)
        try:
            msg = authenticate(self.plan, envelope, peers=self.peers, model=model, max_bytes=limit + 64 * 1024,
                               seen=self._digests)
        except Unattributed:
            raise
        try:
            if sender not in self._waiting:
                raise ProtocolError(f"Unexpected {self._stage} message from {sender!r} in round {self.plan.round}.")
            if isinstance(msg, ThresholdCommit):
                self._check_commit(sender, msg)
                self._commits[sender] = (envelope.to_bytes(), msg.c1_sha256)
            elif isinstance(msg, ThresholdUpload):
                self._updates[sender] = self._check_upload(sender, msg)
            else:
                self._shares[sender] = msg  # checked by the combiner (canary, request digest)
        except Exception as exc:
            self._rejected[sender] = str(exc)
            raise
        finally:
            self._waiting.discard(sender)
        self._digests.add(envelope.digest())

    def _check_commit(self, sender: str, msg: ThresholdCommit) -> None:
        check_header(self.plan, sender=sender, federation_id=msg.federation_id, round_=msg.round,
                     spec_digest=msg.spec_digest, dictionary_hash=msg.dictionary_hash)
        if msg.client != sender or msg.public_key_digest != self.public.digest:
            raise ProtocolError(f"Commitment from {sender!r} names another client or collective key.")

    def _check_upload(self, sender: str, upload: ThresholdUpload) -> tuple[bytes, list[np.ndarray], list[np.ndarray]]:
        """The signed c1 envelope inside ``upload`` (what the holders will check), its c1 and the c0."""
        try:
            msg = open_envelope(parse_envelope(upload.update, max_bytes=MAX_UPDATE_ENVELOPE), sender=self.peers[sender],
                                model=ThresholdUpdate)
        except ClinographError:
            raise ProtocolError(f"The c1 parts in {sender!r}'s upload are not its signed threshold CKKS update.") from None
        check_header(self.plan, sender=sender, federation_id=msg.federation_id, round_=msg.round,
                     spec_digest=msg.spec_digest, dictionary_hash=msg.dictionary_hash)
        if msg.client != sender or upload.client != sender or msg.public_key_digest != self.public.digest:
            raise ProtocolError(f"Update from {sender!r} names another client or collective key.")
        if msg.commitments_sha256 != self._commit_digest or c1_digest(msg.c1) != self._commits[sender][1]:
            raise ProtocolError(f"Update from {sender!r} is not the c1 it committed to, against this round's "
                                "commitments.")
        if len(msg.c1) != self._n_ct or len(upload.c0) != self._n_ct:
            raise ProtocolError(f"Update from {sender!r} has {len(msg.c1)} c1 and {len(upload.c0)} c0 parts; the plan "
                                f"needs {self._n_ct} of each.")
        who = f"{sender!r}'s update"
        return upload.update, read_c1(self.public, msg.c1, who), read_c0(self.public, upload.c0, who)

    def next_stage(self) -> dict[str, bytes] | None:
        """After ``commit``: every hospital's signed commitment, to every committed hospital. After
        ``updates``: the signed decryption message for every key holder asked. After
        ``decrypt``: t-of-N, the same message to a new present set if a holder asked did not
        answer; else combine (ProtocolError: a holder's share is missing; IntegrityError: a bad
        share, named) and return ``None``."""
        if self._stage == "commit":
            return self._relay_commitments()
        if self._stage == "updates":
            return self._request()
        if self._stage == "decrypt":
            if self._combiner is None:
                raise ProtocolError("Threshold CKKS: no decryption request was made this round.")
            retry = self._retry()
            if retry is not None:
                return retry
            self._stage, self._waiting = "done", set()
            vec = self._combiner.combine(self._shares, length=self._layout.length)
            self._result = self._layout.unpack(vec, claimed=tuple(sorted(self._updates)), tag_of=contributor_present)
        return None

    def _relay_commitments(self) -> dict[str, bytes]:
        self._stage = "aborted"
        if len(self._commits) < self.plan.min_clients:
            raise ProtocolError(f"Only {len(self._commits)} threshold CKKS commitment(s) were accepted; the plan needs "
                                f"{self.plan.min_clients}. Round aborted, nothing revealed.")
        names = sorted(self._commits)
        commits = tuple(self._commits[n][0] for n in names)
        self._commit_digest = commitments_digest(commits)
        sealed = seal(ThresholdCommitments(federation_id=self.plan.federation_id, round=self.plan.round,
                                           commits=commits), self.identity)
        self._stage, self._waiting = "updates", set(names)
        return dict.fromkeys(names, sealed)

    def _request(self) -> dict[str, bytes]:
        self._stage = "aborted"
        if len(self._updates) < self.plan.min_clients:
            raise ProtocolError(f"Only {len(self._updates)} threshold CKKS update(s) were accepted; the plan needs "
                                f"{self.plan.min_clients}. Round aborted, nothing decrypted.")
        present = self._present()
        if set(self._updates) != set(self._commits):  # the holders decrypt only the whole commitment set
            raise ProtocolError(f"{', '.join(sorted(set(self._commits) - set(self._updates)))} committed but sent no "
                                "update; the holders decrypt only the sum of every committed contribution. "
                                "Round aborted, nothing decrypted; the next round starts a new commitment set.")
        names = sorted(self._updates)
        c1_sums = sum_c1(self.public, [self._updates[n][1] for n in names])
        aggregate = upload.aggregate(self.public, c0=[self._updates[n][2] for n in names], c1_sums=c1_sums)
        seed = secrets.token_bytes(32)  # public: the holders recompute the canary from it
        self._combiner = Combiner(public=self.public, round=self.plan.round, aggregate=aggregate,
                                  contributions=len(names), canary_seed=seed, present=present)
        # no c1 to decrypt: each holder adds the signed contributions' c1 itself; the combiner's request
        # (the same sums, canary last, this present set) must match the digest its share names
        msg = ThresholdDecrypt(federation_id=self.plan.federation_id, round=self.plan.round, canary_seed=seed,
                               updates=tuple(self._updates[n][0] for n in names),
                               present=self._combiner.request.present)
        sealed = seal(msg, self.identity)
        self._decrypt_message = msg
        self._stage, self._waiting = "decrypt", set(self._combiner.present)
        return {h: sealed for h in self._combiner.present}

    def _present(self) -> tuple[str, ...]:
        """Who decrypts: every holder (N-of-N; one absent aborts), or (t-of-N) the first t, by
        name, of the holders whose update arrived this round -- alive a moment ago; the others
        are not asked, so fewer key holders see the request."""
        holders = self.public.holders
        if self.public.threshold is None:
            absent = sorted(set(holders) - set(self.plan.participants))
            if absent:
                raise ProtocolError(f"Key holder(s) {', '.join(absent)} are not in round {self.plan.round}: every "
                                    "holder's share is needed (N-of-N). Re-run the set-up without them.")
            return holders
        live = sorted(set(holders) & set(self._updates))
        if len(live) < self.public.threshold:
            raise ProtocolError(f"Only {len(live)} key holder(s) sent an update in round {self.plan.round} "
                                f"({', '.join(live) or 'none'}); threshold CKKS {self.public.rule} needs "
                                f"{self.public.threshold} to decrypt. Round aborted, nothing decrypted.")
        return tuple(live[:self.public.threshold])

    def _retry(self) -> dict[str, bytes] | None:
        """t-of-N: a holder asked did not answer (it dropped after uploading): ask t holders again
        -- those that answered, then others whose update arrived, never one that went silent --
        with the same decryption message (the same committed, signed contributions and canary seed)
        under the new present set; None when all answered, or N-of-N."""
        if self._combiner is None or self._decrypt_message is None:
            return None
        asked = self._combiner.present
        silent = {h for h in asked if h not in self._shares}
        if not silent or self.public.threshold is None:
            return None
        self._silent |= silent
        answered = sorted(h for h in asked if h in self._shares)
        others = sorted(set(self.public.holders) & set(self._updates) - self._silent - set(answered))
        present = (answered + others)[:self.public.threshold]
        if len(present) < self.public.threshold:
            return None  # combine() names the holders that did not answer
        self._combiner.retarget(present)
        msg = self._decrypt_message.model_copy(update={"present": self._combiner.request.present})
        sealed = seal(msg, self.identity)
        self._shares, self._waiting = {}, set(self._combiner.present)
        return {h: sealed for h in self._combiner.present}

    @property
    def decrypted_by(self) -> tuple[str, ...]:
        """The key holders asked for decryption shares this round (the audit's ``decrypted_by``)."""
        return self._combiner.present if self._combiner is not None else ()

    @property
    def contributors(self) -> tuple[str, ...]:
        """Hospitals whose ciphertexts are in the sum."""
        return tuple(sorted(self._updates))

    def result(self) -> ModuleSums:
        """The decrypted per-module sums. Raises ProtocolError before the decryption is done."""
        if self._result is None:
            raise ProtocolError(f"The threshold CKKS aggregate of round {self.plan.round} was not decrypted "
                                f"(stage {self._stage!r}).")
        return self._result

    def rejected(self) -> dict[str, str]:
        return dict(self._rejected)


__all__ = ["ThresholdServer"]
