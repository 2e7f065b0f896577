"""The ``ckks_threshold`` mode's sum: each hospital encrypts under its own key share with the
round's common polynomials, and the key holders open only the sum of one commitment set.

Encryption (MTBH sec. IV with a common ``c1``; Stevens et al., USENIX Security 2022, for the
aggregation form): for a commitment set with digest D (:func:`.threshold_messages.commitments_digest`,
over every member's signed commitment and so over its fresh nonce), ciphertext k of every member
uses the common polynomial ``a_k`` expanded from SHA-256(label, federation, collective key, round,
D, k) (:func:`round_polys`). Hospital i sends only ``c0_{i,k} = -a_k*s_i + e_{i,k} + Delta*m_{i,k}``
(:meth:`.threshold.ThresholdParty.encrypt_under_share`). The server adds the members' ``c0``:
``(sum_i c0_{i,k}, a_k)`` is a ciphertext of ``sum_i m_{i,k}`` under ``s_P = sum_{i in P} s_i``.

Decryption (MTBH collective decryption with ``c1 = a_k``, t-of-N): key holder j in the present set
T answers ``d_{j,k} = a_k * lambda_j^T * sum_{i in P} f_i(j) + z_{j,k} + E_{j,k}`` -- its Shamir
shares of the members' key shares, a sharing of zero among T (:func:`.threshold.zero_shares`) and
smudging uniform on [-2^68, 2^68) -- plus the same on the canary ``c = a*u + e1`` from a public
seed (:func:`.threshold.seeded_canary`); :class:`SumCombiner` checks the canary shares' sum
against the members' public key-generation shares ``p0_P`` and adds the rest to the ``c0`` sum:
``Delta*sum m + sum_i e_i + (c0 rounding) + sum_j E_j``.

Why this is safe (SECURITY.md, "Threshold CKKS"): each ``c0_i`` is an RLWE sample of ``s_i``
with a fresh uniform ``a`` (a ciphertext of SEAL's own symmetric scheme); a hospital encrypts once
per commitment set, and every set holds its own fresh nonce, so no ``(a, s_i)`` pair repeats. The
holders' shares reveal ``a_k*s_P`` only up to the smudging, which hides ``sum_i e_i`` (|e_i| <=
21, n <= 32: below the preset's B = 2^13) at statistical distance <= N*B/2^69 per coefficient
vector. A ciphertext made for one set opens under no other: another set has other ``a_k``, and
the holders' shares for it multiply other polynomials. So the server cannot have two sets decrypted
that differ by one hospital (every honest member encrypts for one set a round), nor one set
decrypted twice (a holder answers one set a round, each present set once).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np

from clinograph.core.errors import ConfigError, IntegrityError, ProtocolError
from clinograph.core.labels import HASH_THRESHOLD_CKKS_ROUND_A

from ..hazmat import threshold_ckks as T
from ..hazmat.ckks_context import pack_fields
from .threshold import (
    _CANARY_LIMIT_BITS,
    CollectivePublicKey,
    ThresholdParty,
    _present_set,
    seeded_canary,
)
from .threshold_messages import DecryptionShare, ThresholdDecrypt


def round_polys(*, public: CollectivePublicKey, round: int, commitments_sha256: str, count: int) -> list[np.ndarray]:
    """The common polynomials ``a_0 .. a_{count-1}`` of one commitment set (data level, NTT form),
    each uniform mod q_j from SHA-256(label, federation, collective key, round, set digest, k)."""
    ring = public._c.ring
    out = []
    for k in range(count):
        key = hashlib.sha256(pack_fields([HASH_THRESHOLD_CKKS_ROUND_A, public.federation_id.encode(),
                                          public.digest.encode(), round.to_bytes(8, "big"),
                                          commitments_sha256.encode(), k.to_bytes(4, "big")])).digest()
        out.append(T.common_poly(key, ring)[:ring.data_count])
    return out


def sum_share(party: ThresholdParty, *, public: CollectivePublicKey, request: ThresholdDecrypt,
              members: Sequence[str], a: Sequence[np.ndarray]) -> DecryptionShare:
    """Key holder ``party``'s share of the members' sum for ``request``: ``a_k * sum_secret + z_k +
    E_k`` for every common polynomial of ``a``, then the same on the request's canary."""
    if request.federation_id != party.federation_id or len(a) != request.ciphertexts:
        raise ProtocolError(f"The sum request is for federation {request.federation_id!r} with "
                            f"{request.ciphertexts} ciphertexts; {party.name!r} holds a key share of "
                            f"{party.federation_id!r} and {len(a)} common polynomials.")
    canary, _ = seeded_canary(seed=request.canary_seed, public=public)
    return party.sum_decryption_share(round=request.round, digest=request.digest(), members=members,
                                      present=request.present, polys=[*a, canary])


class SumCombiner:
    """The server's side: the members' ``c0`` sums, the request it sends, and the combination."""

    def __init__(self, *, public: CollectivePublicKey, round: int, commitments_sha256: str,
                 members: Sequence[str], c0: Sequence[np.ndarray], canary_seed: bytes, present: Sequence[str]):
        if not 1 <= len(members) <= public.preset.max_parties or not set(members) <= set(public.holders):
            raise ConfigError(f"A threshold CKKS sum has 1..{public.preset.max_parties} contributors, each a key holder "
                              f"(the smudging of {public.preset.value} is argued for that many); got {len(members)}.")
        if public.threshold is None:
            raise ProtocolError("The ckks_threshold mode decrypts sums with re-shared keys; this collective key was "
                                "not re-shared at set-up.")
        self.public, self.round, self.members, self._c0 = public, round, tuple(sorted(members)), list(c0)
        ring = public._c.ring
        self._p0 = T.sum_polys([public.p0[m][:ring.data_count] for m in self.members], ring.q(ring.data_count))
        _, self._u = seeded_canary(seed=canary_seed, public=public)
        self.request = ThresholdDecrypt(federation_id=public.federation_id, round=round,
                                        commitments_sha256=commitments_sha256, ciphertexts=len(self._c0),
                                        canary_seed=canary_seed, present=_present_set(public, present))

    @property
    def present(self) -> tuple[str, ...]:
        """The key holders asked."""
        return self.request.present

    def retarget(self, present: Sequence[str]) -> ThresholdDecrypt:
        """Ask another present set for the same sum (a holder asked did not answer)."""
        self.request = self.request.model_copy(update={"present": _present_set(self.public, present)})
        return self.request

    def combine(self, shares: Mapping[str, DecryptionShare], *, length: int) -> np.ndarray:
        """The decoded sum (``length`` values).

        Raises:
            ProtocolError: a holder asked did not answer, or a share answers another request.
            IntegrityError: the canary shares' sum fails its check (the present set is named: the
                shares are masked), or the decoded slots are not real-valued.
        """
        c, present, want = self.public._c, self.present, self.request.digest()
        missing = [h for h in present if h not in shares]
        if missing:
            raise ProtocolError(f"Decryption shares missing from {', '.join(missing)}: every holder asked "
                                f"({', '.join(present)}) must answer ({self.public.rule}).")
        ring, limbs = c.ring, c.ring.data_count
        q = ring.q(limbs)
        answers = []
        for name in present:
            msg = shares[name]
            if msg.party != name or msg.request_sha256 != want or len(msg.shares) != len(self._c0) + 1:
                raise ProtocolError(f"Decryption share filed under {name!r} answers another request or party.")
            answers.append([c.poly(raw, limbs, f"decryption share {i} of {name!r}") for i, raw in enumerate(msg.shares)])
        total = [T.sum_polys(list(column), q) for column in zip(*answers, strict=True)]
        if T.canary_residual(share=total[-1], u=self._u, p0=self._p0, ring=ring,
                             context=c.context) > _CANARY_LIMIT_BITS + 5:  # n <= 32 = 2^5 holders
            raise IntegrityError(f"A decryption share of one of {', '.join(present)} is not made with its key shares "
                                 "(the canary check of their sum failed; the shares are masked, so the holder is not "
                                 "named). Ask another present set to find it.")
        scale, out = 2.0 ** self.public.preset.params.scale_bits, []
        for c0, d in zip(self._c0, total[:-1], strict=True):
            m = T.addmod(c0, d, q)
            pt = T.load_plaintext(T.plaintext_bytes(m, ring=ring, parms_id=ring.data_parms_id, scale=scale), c.context)
            z = np.asarray(c.encoder.decode_complex(pt))
            if np.max(np.abs(z.imag)) > 1e-3:
                raise IntegrityError("The combined sum is not real-valued: a decryption share was corrupted.")
            out.append(z.real)
        return np.concatenate(out)[:length] if out else np.zeros(0)


__all__ = ["SumCombiner", "round_polys", "sum_share"]
