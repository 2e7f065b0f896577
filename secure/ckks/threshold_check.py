"""A hospital's checks, in the ``ckks_threshold`` mode, before it encrypts for a commitment set and
before it helps open a sum.

Threshold decryption alone opens whatever it is asked to: a malicious server could ask the key
holders to open one hospital's ciphertext, or two sums that differ by one hospital. Here the
server names nothing to decrypt. Every hospital

1. at stage ``reveal``, checks the relayed commitment set (:func:`checked_commitments`): each
   commitment validly signed by an enrolled hospital, for this federation, round, model version,
   dictionary, collective key and starting global model (the plan's ``global_state_digest``: a
   hospital the server sent another model is in no set with this one), one per hospital, each a
   participant of the plan and a key holder, its own among them unchanged, and at least ``floor`` of them -- the larger of
   ``plan.min_clients`` and the floor the holder fixed at key generation (never below 2), so a plan
   that lowers ``min_clients`` to 1 opens nothing. Only then does it encrypt, once a round, with
   the set's common polynomials (:func:`.threshold_sum.round_polys`);
2. at stage ``decrypt``, answers only a request for the sum of *that* set (its digest), for a
   sorted present set of holders that are members (:func:`check_request`).

Because the common polynomials come from the set's digest, a ciphertext made for one set decrypts
under no other: a server that showed two sets to different hospitals gets, for each, the sum of the
hospitals that encrypted for it, and every honest hospital encrypts for one set a round. Any
failure here is an :class:`~clinograph.core.errors.IntegrityError` naming the server: nothing is
encrypted or decrypted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from clinograph.core.errors import ClinographError, IntegrityError
from clinograph.core.identity import PublicIdentity

from ..messages import RoundPlan
from ..wire import open_envelope, parse_envelope
from .threshold import CollectivePublicKey
from .threshold_messages import (
    ThresholdCommit,
    ThresholdCommitments,
    ThresholdDecrypt,
    commitments_digest,
)


def _refuse(holder: str, why: str, *, action: str = "decrypt") -> IntegrityError:
    done = "encrypted" if action == "encrypt its update" else "decrypted"
    return IntegrityError(f"Hospital {holder!r} refuses to {action}: {why} Nothing was {done}; the server "
                          "sent this request (report the server).")


@dataclass(frozen=True)
class Commitments:
    """The commitment set a hospital encrypted for: its digest and its members' nonces."""

    digest: str
    nonces: Mapping[str, bytes]


def checked_commitments(msg: ThresholdCommitments, *, plan: RoundPlan, peers: Mapping[str, PublicIdentity],
                        public: CollectivePublicKey, holder: str, floor: int) -> Commitments:
    """Step 1 of the module docstring. Raises IntegrityError (nothing encrypted)."""
    def refuse(why: str) -> IntegrityError:
        return _refuse(holder, why, action="encrypt its update")

    out: dict[str, ThresholdCommit] = {}
    for i, raw in enumerate(msg.commits):
        try:
            env = parse_envelope(raw, max_bytes=64 * 1024)
        except ClinographError:
            raise refuse(f"commitment {i} is not a signed envelope.") from None
        key = peers.get(env.sender)
        if key is None:
            raise refuse(f"commitment {i} names {env.sender[:64]!r}, who is not enrolled.")
        try:
            c = open_envelope(env, sender=key, model=ThresholdCommit)
        except IntegrityError:
            raise refuse(f"commitment {i} is not validly signed by the hospital it names.") from None
        except (ClinographError, ValidationError):
            raise refuse(f"commitment {i} (of {env.sender[:64]!r}) is not a threshold CKKS commitment of this "
                         "release (a field missing or unknown: a hospital on another Clinograph release).") from None
        if (c.client != env.sender or c.federation_id != plan.federation_id or c.round != plan.round
                or c.spec_digest != plan.spec.digest() or c.dictionary_hash != plan.dictionary_hash
                or c.public_key_digest != public.digest or env.sender not in plan.participants
                or env.sender not in public.holders):
            raise refuse(f"the commitment signed by {env.sender!r} is not its commitment for round {plan.round} of "
                         f"{plan.federation_id!r} under this collective key (or it holds no key share).")
        if c.global_state_digest != plan.global_state_digest:
            raise refuse(f"the commitment signed by {env.sender!r} starts from another global model (digest "
                         f"{c.global_state_digest[:12]}…) than this hospital's plan ({plan.global_state_digest[:12]}…): "
                         "the server sent hospitals different models for one round.")
        if c.plan_digest != plan.digest():
            raise refuse(f"the commitment signed by {env.sender!r} answers another plan (digest {c.plan_digest[:12]}…) "
                         f"than this hospital's ({plan.digest()[:12]}…): the server sent hospitals different plans for "
                         "one round (participants, min_clients, weights or options).")
        if env.sender in out:
            raise refuse(f"{env.sender!r} is counted twice.")
        out[env.sender] = c
    need = max(plan.min_clients, floor)
    if len(out) < need:
        raise refuse(f"the set has {len(out)} signed contributor(s); the mode's minimum is {need} (a smaller sum "
                     "could expose one hospital's update).")
    return Commitments(digest=commitments_digest(msg.commits), nonces={n: c.nonce for n, c in out.items()})


def check_request(msg: ThresholdDecrypt, *, commitments: Commitments | None, holder: str, ciphertexts: int) -> None:
    """Step 2 of the module docstring. Raises IntegrityError (nothing decrypted)."""
    if commitments is None:
        raise _refuse(holder, "it encrypted for no commitment set this round, so there is no sum it helps open.")
    if msg.commitments_sha256 != commitments.digest:
        raise _refuse(holder, "the request names another commitment set than the one it encrypted for.")
    if msg.ciphertexts != ciphertexts:
        raise _refuse(holder, f"the request asks for {msg.ciphertexts} ciphertexts; the plan has {ciphertexts}.")
    if msg.present != tuple(sorted(set(msg.present))) or not set(msg.present) <= set(commitments.nonces):
        raise _refuse(holder, "the present set is not sorted and distinct, or names a holder outside the set (a "
                              "reordered set would be answered again, with fresh smudging under the same Lagrange "
                              "coefficient).")
