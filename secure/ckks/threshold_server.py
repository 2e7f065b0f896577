"""Server half of the ``ckks_threshold`` mode: it adds ciphertexts, then opens the sum with
the key holders' decryption shares (it is the combiner; it learns the sum, as in ``masked``).

Stages: ``commit`` (a :class:`~.threshold_messages.ThresholdCommit` from every participant, each a
key holder: a fresh nonce) -> :meth:`ThresholdServer.next_stage` relays them all
(:class:`~.threshold_messages.ThresholdCommitments`) -> ``updates`` (a
:class:`~.threshold_messages.ThresholdUpload` from every committed hospital: its rounded c0
parts, encrypted under its own key share with the set's common polynomials, :mod:`.threshold_sum`)
-> :meth:`ThresholdServer.next_stage` adds them and sends the key holders asked (the first t, by
name, of the members; t = N unless ``[federation] tckks_threshold``) one signed
:class:`~.threshold_messages.ThresholdDecrypt` (the set's digest, a fresh public canary seed, the
present set) -> ``decrypt`` (a :class:`~.threshold_messages.DecryptionShare` from every holder
asked; t-of-N: one that does not answer is replaced, the same request re-sent with another present
set) -> :meth:`ThresholdServer.next_stage` combines (:class:`~.threshold_sum.SumCombiner`: the
canary check of the shares' sum names the present set when it fails) -> ``done``;
:meth:`ThresholdServer.result` gives the :class:`~clinograph.secure.aggregation.ModuleSums`.

Guarantees: the server never holds the secret key nor any share of it; it decrypts nothing
without t holders, and each holder answers only the sum of the set it encrypted for
(:mod:`.threshold_check`). Dropouts: a hospital that does not commit is not in the set; one that
committed but sends no upload aborts the round before any decryption (the sum of the others
would not open: its key share is in the holders' answer); a holder asked that does not answer is
replaced by another member for the same sum (t-of-N). Does not guarantee: liveness when fewer
than t holders remain (N-of-N: any holder absent aborts the round; re-run the set-up without it).
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable
from typing import Any

import numpy as np

from clinograph.core.errors import ConfigError, ProtocolError

from ..aggregation.base import AggregationServer, ModuleSums
from ..aggregation.checks import Unattributed, authenticate, check_header
from ..wire import Envelope, seal
from . import threshold_upload as upload
from .layout import SlotLayout
from .threshold import CollectivePublicKey
from .threshold_client import OPTION_DIGEST, contributor_present
from .threshold_messages import (
    DecryptionShare,
    ThresholdCommit,
    ThresholdCommitments,
    ThresholdUpload,
    commitments_digest,
)
from .threshold_sum import SumCombiner
from .threshold_upload import read_c0


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
        #: per committed hospital: its signed ThresholdCommit envelope
        self._commits: dict[str, bytes] = {}
        self._commit_digest: str | None = None
        #: per contributor: its rounded c0 digits, one array a ciphertext
        self._updates: dict[str, list[np.ndarray]] = {}
        self._shares: dict[str, DecryptionShare] = {}
        self._combiner: SumCombiner | None = None
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
        # a commitment: a nonce; an upload: its c0 parts (< 160 000 bytes a ciphertext); a share: one 2-limb
        # polynomial a ciphertext (+ the canary)
        limit = {ThresholdCommit: 0, ThresholdUpload: self._n_ct * 160_000}.get(model, (self._n_ct + 1) * 2 * 8 * 8192)
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
                self._commits[sender] = envelope.to_bytes()
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
                     spec_digest=msg.spec_digest, dictionary_hash=msg.dictionary_hash,
                     global_state_digest=msg.global_state_digest, plan_digest=msg.plan_digest)
        if msg.client != sender or msg.public_key_digest != self.public.digest:
            raise ProtocolError(f"Commitment from {sender!r} names another client or collective key.")
        if sender not in self.public.holders:
            raise ProtocolError(f"{sender!r} holds no share of the collective key (it was not reachable at set-up): "
                                "it encrypts under its own key share, so it cannot contribute. Re-run the set-up.")

    def _check_upload(self, sender: str, msg: ThresholdUpload) -> list[np.ndarray]:
        """The rounded c0 digits of ``sender``'s upload, checked against its commitment."""
        check_header(self.plan, sender=sender, federation_id=msg.federation_id, round_=msg.round,
                     spec_digest=msg.spec_digest, dictionary_hash=msg.dictionary_hash,
                     global_state_digest=msg.global_state_digest, plan_digest=msg.plan_digest)
        if msg.client != sender or msg.public_key_digest != self.public.digest:
            raise ProtocolError(f"Update from {sender!r} names another client or collective key.")
        if msg.commitments_sha256 != self._commit_digest:
            raise ProtocolError(f"The upload of {sender!r} was encrypted for another commitment set than this round's.")
        if len(msg.c0) != self._n_ct:
            raise ProtocolError(f"Update from {sender!r} has {len(msg.c0)} c0 parts; the plan needs {self._n_ct}.")
        return read_c0(self.public, msg.c0, f"{sender!r}'s update")

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
        commits = tuple(self._commits[n] for n in names)
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
        if self._commit_digest is None:  # set when the commitments were relayed; no assert in library code
            raise ProtocolError("Threshold CKKS: updates arrived before any commitment set was relayed.")
        self._combiner = SumCombiner(public=self.public, round=self.plan.round, commitments_sha256=self._commit_digest,
                                     members=names, c0=upload.aggregate(self.public, [self._updates[n] for n in names]),
                                     canary_seed=secrets.token_bytes(32), present=present)
        sealed = seal(self._combiner.request, self.identity)
        self._stage, self._waiting = "decrypt", set(self._combiner.present)
        return {h: sealed for h in self._combiner.present}

    def _present(self) -> tuple[str, ...]:
        """Who decrypts: the first t, by name, of the holders whose update arrived this round --
        alive a moment ago; the others are not asked, so fewer key holders see the request (N-of-N:
        t = N, every holder)."""
        t, holders = self.public.threshold, self.public.holders
        if t is None:
            raise ProtocolError("The ckks_threshold mode decrypts with re-shared keys; this collective key was not "
                                "re-shared at set-up. Re-run the set-up.")
        live = sorted(set(holders) & set(self._updates))
        if len(live) < t:
            fix = ("every holder's share is needed (N-of-N): re-run the set-up without the absent ones"
                   if t == len(holders) else "round aborted")
            raise ProtocolError(f"Only {len(live)} key holder(s) sent an update in round {self.plan.round} "
                                f"({', '.join(live) or 'none'}); threshold CKKS {self.public.rule} needs {t} to decrypt; "
                                f"{fix}. Nothing was decrypted.")
        return tuple(live[:t])

    def _retry(self) -> dict[str, bytes] | None:
        """t-of-N: a holder asked did not answer (it dropped after uploading): ask t holders again
        -- those that answered, then others whose update arrived, never one that went silent --
        with the same decryption message (the same committed, signed contributions and canary seed)
        under the new present set; None when all answered, or N-of-N."""
        if self._combiner is None:
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
        sealed = seal(self._combiner.retarget(present), self.identity)
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
