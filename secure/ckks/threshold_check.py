"""A key holder's check, before it decrypts, that it opens the *aggregate* and nothing else.

Threshold decryption alone opens whatever ``c1`` it is given: a malicious server could ask
every key holder to decrypt one hospital's ciphertext and read that update, or change one
coefficient of the aggregate's ``c1`` by delta and learn ``s_i*delta`` unless smudging covers
it. So the server names no c1 at all: a :class:`~.threshold_messages.ThresholdDecrypt` carries
every contributor's signed :class:`~.threshold_messages.ThresholdUpdate` (its c1 parts only)
and a public canary seed, and the holder

1. verifies each envelope's signature against the contributor's enrolled key, and that it is
   that hospital's update for this federation, round, model version, dictionary and collective
   key, one per hospital, from a participant of the plan;
   and that it is the c1 that hospital committed to (its hash) in the commitment set this holder
   saw before it revealed its own c1, naming that set's digest -- so no contribution was chosen
   after another's c1 was known (a contributor colluding with the server could otherwise sign
   minus the others' c1, all but its victim's, and the sum would be the victim's c1 alone);
2. counts at least ``floor`` distinct contributors: the larger of ``plan.min_clients`` and the
   floor the holder fixed at key generation (never below 2), so a plan that lowers
   ``min_clients`` to 1 opens nothing;
3. adds their c1 parts itself (:func:`.threshold_upload.sum_c1`) and expands the canary from
   ``canary_seed`` (:func:`.threshold.seeded_canary`), and returns the
   :class:`~.threshold_messages.DecryptionRequest` of exactly those: the sums, then the canary.

The holder's share is computed on that request and nothing else, and it names the request's
digest; the combiner's own request must have the same digest (the same sums, canary last), or
the shares are refused as answering another request. Any failure here is an
:class:`~clinograph.core.errors.IntegrityError` naming the server: nothing is decrypted. Cost:
each holder downloads every contributor's c1 parts (n x 30 bytes a slot, half of the full
ciphertexts) and adds them in numpy (SECURITY.md,
benchmarks/secure_aggregation_cost/threshold_ckks.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from pydantic import ValidationError

from clinograph.core.errors import ClinographError, IntegrityError, ProtocolError
from clinograph.core.identity import PublicIdentity

from ..messages import RoundPlan
from ..wire import open_envelope, parse_envelope
from .threshold import CollectivePublicKey, seeded_canary
from .threshold_messages import (
    MAX_UPDATE_ENVELOPE,
    DecryptionRequest,
    ThresholdCommit,
    ThresholdCommitments,
    ThresholdDecrypt,
    ThresholdUpdate,
    c1_digest,
)
from .threshold_upload import read_c1, sum_c1


def _refuse(holder: str, why: str, *, action: str = "decrypt") -> IntegrityError:
    done = "revealed" if action == "reveal its c1" else "decrypted"
    return IntegrityError(f"Hospital {holder!r} refuses to {action}: {why} Nothing was {done}; the server "
                          "sent this request (report the server).")


@dataclass(frozen=True)
class Commitments:
    """The commitment set a hospital revealed its c1 against: its digest, and each hospital's
    committed c1 hash."""

    digest: str
    c1_sha256: Mapping[str, str]


M = TypeVar("M", ThresholdUpdate, ThresholdCommit)


def _signed(items: Sequence[bytes], *, model: type[M], max_bytes: int, what: str, plan: RoundPlan,
            peers: Mapping[str, PublicIdentity], public: CollectivePublicKey, floor: int,
            refuse: Callable[[str], IntegrityError]) -> dict[str, M]:
    """Steps 1-2 of the module docstring for signed ``items`` of ``model``: by hospital."""
    out: dict[str, M] = {}
    for i, raw in enumerate(items):
        try:
            env = parse_envelope(raw, max_bytes=max_bytes)
        except ClinographError:
            raise refuse(f"{what} {i} is not a signed envelope.") from None
        key = peers.get(env.sender)
        if key is None:
            raise refuse(f"{what} {i} names {env.sender[:64]!r}, who is not enrolled.")
        try:
            msg = open_envelope(env, sender=key, model=model)
        except IntegrityError:
            raise refuse(f"{what} {i} is not validly signed by the hospital it names.") from None
        except (ClinographError, ValidationError):
            raise refuse(f"{what} {i} is not a threshold CKKS {what}.") from None
        if (msg.client != env.sender or msg.federation_id != plan.federation_id or msg.round != plan.round
                or msg.spec_digest != plan.spec.digest() or msg.dictionary_hash != plan.dictionary_hash
                or msg.public_key_digest != public.digest or env.sender not in plan.participants):
            raise refuse(f"the {what} signed by {env.sender!r} is not its {what} for round "
                         f"{plan.round} of {plan.federation_id!r} under this collective key.")
        if env.sender in out:
            raise refuse(f"{env.sender!r} is counted twice.")
        out[env.sender] = msg
    need = max(plan.min_clients, floor)
    if len(out) < need:
        raise refuse(f"the sum has {len(out)} signed contributor(s); the mode's minimum is "
                     f"{need} (a smaller sum could expose one hospital's update).")
    return out


def checked_commitments(msg: ThresholdCommitments, *, plan: RoundPlan, peers: Mapping[str, PublicIdentity],
                        public: CollectivePublicKey, holder: str, floor: int) -> dict[str, str]:
    """The commitment set's c1 hashes by hospital, each signed by its hospital for this round,
    at least ``max(plan.min_clients, floor)`` of them. Raises IntegrityError (nothing revealed)."""
    commits = _signed(msg.commits, model=ThresholdCommit, max_bytes=64 * 1024, what="commitment", plan=plan,
                      peers=peers, public=public, floor=floor,
                      refuse=lambda why: _refuse(holder, why, action="reveal its c1"))
    return {name: c.c1_sha256 for name, c in commits.items()}


def signed_contributions(msg: ThresholdDecrypt, *, plan: RoundPlan, peers: Mapping[str, PublicIdentity],
                         public: CollectivePublicKey, holder: str, floor: int,
                         commitments: Commitments) -> dict[str, ThresholdUpdate]:
    """Steps 1-2 of the module docstring: the contributors' checked updates, by hospital, each
    committed in ``commitments`` (the set this holder saw) and naming that set."""
    out = _signed(msg.updates, model=ThresholdUpdate, max_bytes=MAX_UPDATE_ENVELOPE, what="update", plan=plan,
                  peers=peers, public=public, floor=floor, refuse=lambda why: _refuse(holder, why))
    if set(out) != set(commitments.c1_sha256):  # a sub-sum to one holder, the full sum to another: their
        missing = sorted(set(commitments.c1_sha256) - set(out))  # difference would open the hospitals left out
        raise _refuse(holder, f"the sum leaves out committed contribution(s) of {', '.join(map(repr, missing))}: "
                              "every holder decrypts only the sum of the whole commitment set it saw.")
    for name, upd in sorted(out.items()):
        if upd.commitments_sha256 != commitments.digest or c1_digest(upd.c1) != commitments.c1_sha256.get(name):
            raise _refuse(holder, f"{name!r} signed a c1 it did not commit to among the commitments this hospital "
                                  "saw (a contribution chosen after another's c1 was revealed?).")
    return out


def check_aggregate(msg: ThresholdDecrypt, *, plan: RoundPlan, peers: Mapping[str, PublicIdentity],
                    public: CollectivePublicKey, holder: str, floor: int,
                    commitments: Commitments) -> tuple[tuple[str, ...], DecryptionRequest]:
    """Check ``msg`` (steps 1-2) and build the request to answer (step 3): the contributors, and
    the sums of their c1 with the canary last. Raises IntegrityError."""
    updates = signed_contributions(msg, plan=plan, peers=peers, public=public, holder=holder, floor=floor,
                                   commitments=commitments)
    names = sorted(updates)
    try:
        c1 = [read_c1(public, updates[n].c1, f"{n!r}'s contribution") for n in names]
        request = holder_request(public, round=plan.round, c1=c1, canary_seed=msg.canary_seed, present=msg.present)
    except ProtocolError as exc:
        raise _refuse(holder, f"the signed contributions do not add up ({exc}).") from None
    return tuple(names), request


def holder_request(public: CollectivePublicKey, *, round: int, c1: Sequence[Sequence[np.ndarray]],
                   canary_seed: bytes, present: Sequence[str] = ()) -> DecryptionRequest:
    """Step 3: the request a holder answers -- the sums of the contributions' ``c1`` (parsed by
    :func:`.threshold_upload.read_c1`), then the canary of ``canary_seed``, for the ``present``
    set (t-of-N; empty N-of-N). Raises ProtocolError."""
    sums = sum_c1(public, c1)
    canary = seeded_canary(seed=canary_seed, public=public)[0]
    return DecryptionRequest(federation_id=public.federation_id, round=round, present=tuple(present),
                             c1=tuple(np.ascontiguousarray(p, dtype="<u8").tobytes() for p in (*sums, canary)))
