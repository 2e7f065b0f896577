"""A key holder's check, before it decrypts, that the server asks it to open the *aggregate*.

Threshold decryption alone opens whatever ``c1`` it is given: a malicious server could ask
every key holder to decrypt one hospital's ciphertext and read that update. So a holder answers
a :class:`~.threshold_messages.ThresholdDecrypt` only when it proves itself: every
contributor's signed :class:`~.threshold_messages.ThresholdUpdate` envelope rides with it, and
the holder

1. verifies each envelope's signature against the contributor's enrolled key, and that it is
   that hospital's update for this federation, round, model version, dictionary and collective
   key, one per hospital, from a participant of the plan;
2. counts at least ``floor`` distinct contributors: the larger of ``plan.min_clients`` and the
   floor the holder fixed at key generation (never below 2), so a plan that lowers
   ``min_clients`` to 1 opens nothing;
3. adds their ciphertexts with SEAL and checks that the request's ``c1`` halves are exactly the
   sum's plus one extra, and that the extra is the canary it recomputes from the request's public
   ``canary_seed`` (:func:`.threshold.seeded_canary`) -- not some ciphertext's ``c1``, which would
   let the server open, say, one hospital's update of an earlier round.

Any failure is an :class:`~clinograph.core.errors.IntegrityError` naming the server: nothing is
decrypted. A decryption share reveals ``c1*s_i`` only for the ``c1`` it answers, and the
aggregate's ``c1`` is not any sub-sum's, so the shares open that sum and nothing else. Cost:
each holder downloads every contributor's ciphertexts (n times one upload) and adds them
(SECURITY.md, benchmarks/threshold_ckks.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import ValidationError

from clinograph.core.errors import ClinographError, IntegrityError
from clinograph.core.identity import PublicIdentity

from ..hazmat import threshold_ckks as T
from ..messages import RoundPlan
from ..wire import open_envelope, parse_envelope
from .threshold import CollectivePublicKey, seeded_canary
from .threshold_messages import MAX_UPDATE_ENVELOPE, ThresholdDecrypt, ThresholdUpdate


def _refuse(holder: str, why: str) -> IntegrityError:
    return IntegrityError(f"Hospital {holder!r} refuses to decrypt: {why} Nothing was decrypted; the server "
                          "sent this request (report the server).")


def signed_contributions(msg: ThresholdDecrypt, *, plan: RoundPlan, peers: Mapping[str, PublicIdentity],
                         public: CollectivePublicKey, holder: str, floor: int) -> dict[str, ThresholdUpdate]:
    """Steps 1-2 of the module docstring: the contributors' checked updates, by hospital."""
    out: dict[str, ThresholdUpdate] = {}
    for i, raw in enumerate(msg.updates):
        try:
            env = parse_envelope(raw, max_bytes=MAX_UPDATE_ENVELOPE)
        except ClinographError:
            raise _refuse(holder, f"contribution {i} is not a signed envelope.") from None
        key = peers.get(env.sender)
        if key is None:
            raise _refuse(holder, f"contribution {i} names {env.sender[:64]!r}, who is not enrolled.")
        try:
            upd = open_envelope(env, sender=key, model=ThresholdUpdate)
        except IntegrityError:
            raise _refuse(holder, f"contribution {i} is not validly signed by the hospital it names.") from None
        except (ClinographError, ValidationError):
            raise _refuse(holder, f"contribution {i} is not a threshold CKKS update.") from None
        if (upd.client != env.sender or upd.federation_id != plan.federation_id or upd.round != plan.round
                or upd.spec_digest != plan.spec.digest() or upd.dictionary_hash != plan.dictionary_hash
                or upd.public_key_digest != public.digest or env.sender not in plan.participants):
            raise _refuse(holder, f"the contribution signed by {env.sender!r} is not its update for round "
                                  f"{plan.round} of {plan.federation_id!r} under this collective key.")
        if env.sender in out:
            raise _refuse(holder, f"{env.sender!r} is counted twice.")
        out[env.sender] = upd
    need = max(plan.min_clients, floor)
    if len(out) < need:
        raise _refuse(holder, f"the sum has {len(out)} signed contributor(s); the mode's minimum is "
                              f"{need} (a smaller sum could expose one hospital's update).")
    return out


def check_aggregate(msg: ThresholdDecrypt, *, plan: RoundPlan, peers: Mapping[str, PublicIdentity],
                    public: CollectivePublicKey, holder: str, floor: int) -> tuple[str, ...]:
    """Check ``msg`` (all three steps); return the contributors. Raises IntegrityError."""
    updates = signed_contributions(msg, plan=plan, peers=peers, public=public, holder=holder, floor=floor)
    try:
        total = public.add([u.ciphertexts for _, u in sorted(updates.items())])
    except (ClinographError, ValueError):
        raise _refuse(holder, "the contributions do not add up (different ciphertext counts or parameters).") from None
    expected = [T.read_ciphertext(ct)[1] for ct in total]
    want = [p.astype("<u8").tobytes() for p in expected]
    canary = seeded_canary(seed=msg.canary_seed, public=public)[0].astype("<u8").tobytes()
    got = list(msg.c1)
    if len(got) != len(want) + 1 or not any(got[k] == canary and got[:k] + got[k + 1:] == want
                                             for k in range(len(got))):
        raise _refuse(holder, f"the c1 halves it is asked to decrypt are not the sum of the {len(updates)} signed "
                              "contributions plus the canary of its seed.")
    return tuple(sorted(updates))
