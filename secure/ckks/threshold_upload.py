"""What a hospital uploads in the ``ckks_threshold`` mode, and the sums made of it.

A hospital encrypts its slot vector under the collective public key with SEAL's ``Encryptor``
and sends each ciphertext in two parts (:mod:`clinograph.secure.hazmat.ckks_compact`):

* ``c1`` whole, NTT form, each residue in 60 bits (15 bytes a coefficient) -- inside a
  separately signed :class:`~.threshold_messages.ThresholdUpdate`, because that is all a key
  holder needs to compute the sum it will decrypt (:func:`sum_c1`), so it is all it downloads;
* ``c0`` rounded: the high 52 bits of its CRT value's Garner digit (6.5 bytes a coefficient),
  used only by the server, which adds them (:func:`aggregate`) and combines the shares.

Upload: 43 bytes a slot (21.5 a coefficient, N/2 slots a ciphertext), against 64 for SEAL's
own serialisation of the same ciphertext and ~16 for TenSEAL's single-key ``ckks``
(ADD_ONLY_128: a seeded symmetric encryption sends only c0, at one 60-bit prime). Why not less
(SECURITY.md, "Threshold CKKS"): c1 cannot be seeded (its randomness is secret) nor rounded
(a key holder multiplies it by its secret share, so its rounding error would be secret-
dependent noise the smudging must hide); c0's rounding error is independent of every key, and
at 8 dropped bits it adds half a smudging's standard deviation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tenseal.sealapi as sealapi

from clinograph.core.errors import ProtocolError

from ..hazmat import ckks_compact as C
from ..hazmat import threshold_ckks as T
from .threshold import CollectivePublicKey

#: low bits of c0's Garner digit left out of the upload (error q0*2^DROP/sqrt(12) per coefficient)
DROP = 8
#: bits a c1 residue travels in (the preset's primes are 60-bit)
C1_BITS = 60
#: bits a rounded c0 coefficient travels in
C0_BITS = 60 - DROP


def _check_ring(public: CollectivePublicKey) -> None:
    ring = public._c.ring
    if ring.data_count != 2 or max(ring.primes[:2]).bit_length() > C1_BITS:
        raise ProtocolError(f"The compact upload is for two data primes of at most {C1_BITS} bits; "
                            f"{public.preset.value} has {ring.data_count}.")


def encode(public: CollectivePublicKey, values: np.ndarray) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """Encrypt ``values`` under ``public``; returns (c0 parts, c1 parts), one of each a ciphertext."""
    _check_ring(public)
    c = public._c
    c0s, c1s = [], []
    for ct in public.encrypt_ciphertexts(values):
        polys = T.read_ciphertext(ct)
        c0 = T.to_coefficients(polys[0], ring=c.ring, context=c.context, parms_id=c.ring.data_parms_id)
        c0s.append(C.pack_words(C.round_c0(c0, c.ring.primes, drop=DROP), C0_BITS))
        c1s.append(C.pack_words(polys[1], C1_BITS))
    return tuple(c0s), tuple(c1s)


def read_c1(public: CollectivePublicKey, parts: Sequence[bytes], who: str) -> list[np.ndarray]:
    """One contribution's c1 parts as (2, N) NTT-form residues. Raises ProtocolError (wrong size,
    a residue not below its prime)."""
    _check_ring(public)
    ring, out = public._c.ring, []
    for k, raw in enumerate(parts):
        try:
            words = C.unpack_words(raw, C1_BITS, 2 * ring.degree).reshape(2, ring.degree)
        except ValueError as exc:
            raise ProtocolError(f"c1 part {k} of {who}: {exc}.") from None
        if np.any(words >= ring.q(2)):
            raise ProtocolError(f"c1 part {k} of {who} has a residue outside [0, q_j).")
        out.append(words)
    return out


def read_c0(public: CollectivePublicKey, parts: Sequence[bytes], who: str) -> list[np.ndarray]:
    """One contribution's rounded c0 parts as N digits each. Raises ProtocolError (wrong size)."""
    try:
        return [C.unpack_words(raw, C0_BITS, public._c.ring.degree) for raw in parts]
    except ValueError as exc:
        raise ProtocolError(f"A c0 part of {who}: {exc}.") from None


def sum_c1(public: CollectivePublicKey, contributions: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
    """The contributions' c1 added ciphertext by ciphertext (each (2, N), NTT form). Raises
    ProtocolError (different ciphertext counts, or none)."""
    if not contributions or len({len(c) for c in contributions}) != 1:
        raise ProtocolError("The contributions have different numbers of ciphertexts (or there are none).")
    return [T.sum_polys(list(polys), public._c.ring.q(2)) for polys in zip(*contributions, strict=True)]


def aggregate(public: CollectivePublicKey, *, c0: Sequence[Sequence[np.ndarray]],
              c1_sums: Sequence[np.ndarray]) -> list[sealapi.Ciphertext]:
    """The server's sum as SEAL ciphertexts (for :class:`~.threshold.Combiner`): every
    contribution's rounded c0 (:func:`read_c0`) lifted and added, with ``c1_sums`` from
    :func:`sum_c1`. Raises ProtocolError (ciphertext counts differ)."""
    c = public._c
    if not c0 or any(len(parts) != len(c1_sums) for parts in c0):
        raise ProtocolError("The c0 parts do not match the c1 sums (ciphertext counts).")
    scale = 2.0 ** public.preset.params.scale_bits
    ring = c.ring
    lifted = [C.lift_c0_sum([parts[k] for parts in c0], ring.primes, drop=DROP) for k in range(len(c1_sums))]
    # Every lifted c0 has the same first limb, n*floor(q0/2) in each coefficient: NTT it once (as
    # that constant times the all-ones polynomial), and NTT only the second limbs, with the first
    # limbs filled by the c1 sums (SEAL's NTT works limb by limb) so that no two polynomials in one
    # SEAL ciphertext repeat -- a repeat would make zstd compress it and the fast read fall back.
    ones = np.ones((2, ring.degree), dtype=np.uint64)
    ntt = T.to_ntt_many([np.stack([c1[0], lift[1]]) for c1, lift in zip(c1_sums, lifted, strict=True)] + [ones],
                        ring=ring, context=c.context, parms_id=ring.data_parms_id)
    q0 = ring.q(1)
    limb0 = T.mulmod(ntt[-1][:1], np.broadcast_to(lifted[0][:1, :1] % q0, (1, ring.degree)), q0)[0]
    return [public.load(T.ciphertext_bytes(np.stack([np.stack([limb0, n[1]]), c1]), ring=ring,
                                           parms_id=ring.data_parms_id, scale=scale))
            for n, c1 in zip(ntt[:-1], c1_sums, strict=True)]
