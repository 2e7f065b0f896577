"""What a hospital uploads in the ``ckks_threshold`` mode, and the sum the server makes of it.

A hospital encrypts its slot vector under its own key share with the commitment set's common
polynomials (:mod:`.threshold_sum`) and sends only each ciphertext's ``c0``, rounded
(:mod:`clinograph.secure.hazmat.ckks_compact`): the high 52 bits of its CRT value's Garner digit,
6.5 bytes a coefficient, 13 bytes a CKKS slot (N/2 slots a ciphertext), against 64 for SEAL's own
serialisation of a ciphertext and ~16 for TenSEAL's single-key ``ckks`` (ADD_ONLY_128: a seeded
symmetric encryption, c0 at one 60-bit prime). ``c1`` does not travel: it is the public ``a_k``.

Why rounding is sound: the rounding error is a function of ``c0`` alone, which the hospital made
and the simulator of SECURITY.md's argument makes too, so it is post-processing; the key holders'
shares never touch ``c0``. It costs precision only: at ``DROP = 8`` the error is half the standard
deviation of one holder's smudging, so the sum's slot error grows by about 1.12 (tested).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clinograph.core.errors import ProtocolError

from ..hazmat import ckks_compact as C
from ..hazmat import threshold_ckks as T
from .threshold import CollectivePublicKey, ThresholdParty

#: low bits of c0's Garner digit left out of the upload (error q0*2^DROP/sqrt(12) per coefficient)
DROP = 8
#: bits a rounded c0 coefficient travels in (the preset's primes are 60-bit)
C0_BITS = 60 - DROP


def _check_ring(public: CollectivePublicKey) -> None:
    ring = public._c.ring
    if ring.data_count != 2 or max(ring.primes[:2]).bit_length() > 60:
        raise ProtocolError(f"The compact upload is for two data primes of at most 60 bits; "
                            f"{public.preset.value} has {ring.data_count}.")


def encode(party: ThresholdParty, public: CollectivePublicKey, values: np.ndarray,
           a: Sequence[np.ndarray]) -> tuple[bytes, ...]:
    """Encrypt ``values`` under ``party``'s key share with the common polynomials ``a`` (one a
    ciphertext); returns the rounded c0 parts."""
    _check_ring(public)
    c = public._c
    return tuple(C.pack_words(C.round_c0(x, c.ring.primes, drop=DROP), C0_BITS)
                 for x in party.encrypt_under_share(values, a))


def read_c0(public: CollectivePublicKey, parts: Sequence[bytes], who: str) -> list[np.ndarray]:
    """One contribution's rounded c0 parts as N digits each. Raises ProtocolError (wrong size)."""
    try:
        return [C.unpack_words(raw, C0_BITS, public._c.ring.degree) for raw in parts]
    except ValueError as exc:
        raise ProtocolError(f"A c0 part of {who}: {exc}.") from None


def aggregate(public: CollectivePublicKey, c0: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
    """The server's sums (NTT form, data level, one a ciphertext, for
    :class:`~.threshold_sum.SumCombiner`): every contribution's rounded c0 (:func:`read_c0`)
    lifted and added. Raises ProtocolError (ciphertext counts differ, or none)."""
    _check_ring(public)
    if not c0 or len({len(parts) for parts in c0}) != 1:
        raise ProtocolError("The contributions have different numbers of ciphertexts (or there are none).")
    ring, context = public._c.ring, public._c.context
    lifted = [C.lift_c0_sum([parts[k] for parts in c0], ring.primes, drop=DROP) for k in range(len(c0[0]))]
    # Every lifted sum has the same first limb, n*floor(q0/2) in each coefficient: NTT it once (that
    # constant times the all-ones polynomial). The others go through SEAL's NTT with their second limb
    # copied into the first, so that no two polynomials in one SEAL ciphertext repeat (a repeat would make
    # SEAL's bytes compress and the fast read fall back: 2.3 ms a polynomial instead of 0.3), and the
    # first limb is then put back.
    q0 = ring.q(1)
    ones = np.ones((2, ring.degree), dtype=np.uint64)
    ntt = T.to_ntt_many([np.stack([lift[1] % q0[0], lift[1]]) for lift in lifted] + [ones], ring=ring,
                        context=context, parms_id=ring.data_parms_id)
    limb0 = T.mulmod(ntt[-1][:1], np.broadcast_to(lifted[0][:1, :1] % q0, (1, ring.degree)), q0)[0]
    for poly in ntt[:-1]:
        poly[0] = limb0
    return ntt[:-1]
