"""SEAL's CKKS polynomials as numpy arrays, and back: reading keys, ciphertexts and plaintexts,
writing SEAL's own serialisation (compression NONE), SEAL's NTT both ways, and elementwise
arithmetic mod each RNS prime. Hazmat; only :mod:`.threshold_ckks` imports it.

Layout. SEAL keeps CKKS keys and ciphertexts in NTT form as uint64 words ``[poly][prime][coeff]``;
``sealapi`` offers element access only (about 0.12 us a word), so reads take the words out of
SEAL's own serialisation when it stores them verbatim (:mod:`.seal_words`) and fall back to
``__getitem__``. Writes build SEAL's serialisation: a 16-byte SEAL header (magic 0xA15E, header
size, SEAL version copied from SEAL's own output, compression 0 = NONE, size), the object's
members (parms_id, NTT flag, sizes, scale, correction factor for a ciphertext; parms_id, word
count and scale for a plaintext), then the ``DynArray`` of words with its own header and count.
SEAL validates all of it on load (sizes, parms_id, every word below its prime); the tests
round-trip SEAL's own objects through it.

Arithmetic. ``mulmod`` computes (a*b) mod q with a ``longdouble`` quotient estimate: its 64-bit
mantissa puts the estimate within one of the true quotient for q < 2^62, and the remainder is
then exact in wrapping uint64 arithmetic (checked at import; tested against Python integers).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tenseal.sealapi as seal

from .ckks_context import _load, dump
from .seal_words import object_words

if np.finfo(np.longdouble).nmant < 63:  # pragma: no cover - x86-64 and aarch64 Linux have it
    raise ImportError("threshold CKKS needs an 80/128-bit numpy longdouble for exact 60-bit modular products")


_MAGIC = 0xA15E


_U64 = np.uint64


@dataclass(frozen=True)


class Ring:
    """N and the RNS primes at SEAL's key level (data primes, then the special prime)."""

    degree: int
    primes: tuple[int, ...]
    key_parms_id: tuple[int, ...]
    data_parms_id: tuple[int, ...]
    version: bytes  # SEAL serialisation version (major, minor) written into headers

    @classmethod
    def of(cls, context: seal.SEALContext) -> Ring:
        """The ring of a SEAL CKKS context (keys at the key level, ciphertexts at the first data level)."""
        key = context.key_context_data().parms()
        probe = seal.Plaintext()
        with_version = _seal_bytes(probe)
        return cls(degree=key.poly_modulus_degree(), primes=tuple(m.value() for m in key.coeff_modulus()),
                   key_parms_id=tuple(context.key_parms_id()), data_parms_id=tuple(context.first_parms_id()),
                   version=with_version[3:5])

    @property
    def data_count(self) -> int:
        """Primes a fresh ciphertext lives under (all but SEAL's special prime)."""
        return len(self.primes) - 1

    def q(self, count: int) -> np.ndarray:
        """The first ``count`` primes as a (count, 1) column for broadcasting."""
        return np.array(self.primes[:count], dtype=_U64).reshape(-1, 1)


def _seal_bytes(obj: Any) -> bytes:
    return dump(obj)


# -- arithmetic mod q_j, elementwise on (limbs, N) uint64 arrays ---------------------------------


def mulmod(a: np.ndarray, b: np.ndarray, q: np.ndarray) -> np.ndarray:
    """(a * b) mod q for uint64 arrays with entries below q < 2^62 (exact)."""
    quo = (a.astype(np.longdouble) * b.astype(np.longdouble) / q.astype(np.longdouble)).astype(_U64)
    r = (a * b - quo * q).astype(np.int64)  # exact mod 2^64; the true remainder is within one q
    qi = q.astype(np.int64)
    r = np.where(r < 0, r + qi, r)
    r = np.where(r >= qi, r - qi, r)
    return r.astype(_U64)


def addmod(a: np.ndarray, b: np.ndarray, q: np.ndarray) -> np.ndarray:
    """(a + b) mod q for entries below q < 2^63: ``min(s, s - q)`` with s = a + b, as the
    unsigned ``s - q`` wraps above ``s`` exactly when s < q."""
    s = a + b
    return np.minimum(s, s - q, out=s)


def negmod(a: np.ndarray, q: np.ndarray) -> np.ndarray:
    """(-a) mod q."""
    return np.where(a == 0, a, q - a)


def submod(a: np.ndarray, b: np.ndarray, q: np.ndarray) -> np.ndarray:
    """(a - b) mod q for entries below q < 2^63: ``min(d, d + q)`` with d = a - b (which wraps,
    and d + q with it back below q, exactly when a < b)."""
    d = a - b
    return np.minimum(d, d + q, out=d)


# -- reading SEAL objects, writing SEAL's serialisation (compression NONE) -------------------------


def _words(obj: Any, n: int) -> np.ndarray:
    """The first ``n`` data words of a SEAL object: from SEAL's own bytes when they are stored
    (:mod:`.seal_words`), else by element access."""
    total = obj.size() * obj.coeff_modulus_size() * obj.poly_modulus_degree() if isinstance(
        obj, seal.Ciphertext) else obj.coeff_count()
    words = object_words(obj, total)
    if words is not None:
        return words[:n]
    return np.fromiter(map(obj.__getitem__, range(n)), dtype=_U64, count=n)


def read_ciphertext(ct: seal.Ciphertext, *, polys: int | None = None) -> np.ndarray:
    """A ciphertext's words as (size, limbs, N) uint64 (NTT form for CKKS); only the first
    ``polys`` polynomials if given."""
    shape = (ct.size() if polys is None else polys, ct.coeff_modulus_size(), ct.poly_modulus_degree())
    return _words(ct, shape[0] * shape[1] * shape[2]).reshape(shape)


def read_secret_key(sk: seal.SecretKey, ring: Ring) -> np.ndarray:
    """A secret key's words as (key-level limbs, N) uint64, NTT form (element access: a secret is
    never written out, not even to the scratch file SEAL's serialisation goes through)."""
    pt = sk.data()
    n = pt.coeff_count()
    return np.fromiter(map(pt.__getitem__, range(n)), dtype=_U64, count=n).reshape(len(ring.primes), ring.degree)


def read_plaintext(pt: seal.Plaintext, limbs: int, degree: int) -> np.ndarray:
    """A (NTT-form CKKS) plaintext's words as (limbs, N)."""
    return _words(pt, pt.coeff_count()).reshape(limbs, degree)


def _header(version: bytes, size: int) -> bytes:
    return struct.pack("<HB2sBHQ", _MAGIC, 16, version, 0, 0, size)  # compr_mode 0 = NONE


def _dynarray(words: np.ndarray, version: bytes) -> bytes:
    body = struct.pack("<Q", words.size) + np.ascontiguousarray(words, dtype="<u8").tobytes()
    return _header(version, 16 + len(body)) + body


def _parms_id(pid: Sequence[int]) -> bytes:
    return struct.pack("<4Q", *pid)


def ciphertext_bytes(polys: np.ndarray, *, ring: Ring, parms_id: Sequence[int], scale: float) -> bytes:
    """SEAL's NONE serialisation of a Ciphertext / PublicKey (PublicKey saves its Ciphertext)."""
    size, limbs, degree = polys.shape
    members = (_parms_id(parms_id) + b"\x01" + struct.pack("<QQQdQ", size, degree, limbs, scale, 1)
               + _dynarray(polys, ring.version))
    return _header(ring.version, 16 + len(members)) + members


def plaintext_bytes(poly: np.ndarray, *, ring: Ring, parms_id: Sequence[int], scale: float) -> bytes:
    """SEAL's NONE serialisation of an NTT-form CKKS Plaintext."""
    members = _parms_id(parms_id) + struct.pack("<Qd", poly.size, scale) + _dynarray(poly, ring.version)
    return _header(ring.version, 16 + len(members)) + members


def load_public_key(data: bytes, context: seal.SEALContext) -> seal.PublicKey:
    """Load a public key SEAL will use (SEAL validates it)."""
    pk = seal.PublicKey()
    _load(pk, data, context)
    return pk


def load_plaintext(data: bytes, context: seal.SEALContext) -> seal.Plaintext:
    """Load a plaintext (SEAL validates it)."""
    pt = seal.Plaintext()
    _load(pt, data, context)
    return pt


def _pair(poly: np.ndarray, ring: Ring) -> np.ndarray:
    """``poly`` and its negation: the 2-component ciphertext SEAL's NTT needs. Not ``poly`` twice:
    zstd would find the repeat and compress it, and the fast read (:mod:`.seal_words`) only reads
    stored blocks."""
    return np.stack([poly, negmod(poly, ring.q(poly.shape[0]))])


def to_ntt(coeffs: np.ndarray, *, ring: Ring, context: seal.SEALContext, parms_id: Sequence[int]) -> np.ndarray:
    """A coefficient-form (limbs, N) polynomial in NTT form, by SEAL's forward NTT
    (``Evaluator.transform_to_ntt`` on a 2-component, not-NTT ciphertext holding it)."""
    return to_ntt_many([coeffs], ring=ring, context=context, parms_id=parms_id)[0]


#: polynomials a SEAL ciphertext holds at most (SEAL_CIPHERTEXT_SIZE_MAX)
_MAX_POLYS = 16


def to_ntt_many(polys: Sequence[np.ndarray], *, ring: Ring, context: seal.SEALContext,
                parms_id: Sequence[int]) -> list[np.ndarray]:
    """:func:`to_ntt` of several polynomials, up to 16 in one SEAL ciphertext (one load, one NTT
    call and one read of SEAL's bytes for each 16)."""
    out: list[np.ndarray] = []
    ev = seal.Evaluator(context)
    for start in range(0, len(polys), _MAX_POLYS):
        chunk = list(polys[start:start + _MAX_POLYS])
        stack = _pair(chunk[0], ring) if len(chunk) == 1 else np.stack(chunk)
        body = bytearray(ciphertext_bytes(stack, ring=ring, parms_id=parms_id, scale=1.0))
        body[16 + 32] = 0  # is_ntt_form = false
        ct = seal.Ciphertext()
        _load(ct, bytes(body), context)
        ev.transform_to_ntt_inplace(ct)
        out.extend(read_ciphertext(ct, polys=len(chunk)))
    return out


def to_coefficients_many(polys: Sequence[np.ndarray], *, ring: Ring, context: seal.SEALContext,
                         parms_id: Sequence[int]) -> list[np.ndarray]:
    """:func:`to_coefficients` of several NTT-form polynomials, up to 16 in one SEAL ciphertext
    (polynomials that repeat in one chunk make SEAL's bytes compress: correct, but read slowly)."""
    out: list[np.ndarray] = []
    ev = seal.Evaluator(context)
    for start in range(0, len(polys), _MAX_POLYS):
        chunk = list(polys[start:start + _MAX_POLYS])
        stack = _pair(chunk[0], ring) if len(chunk) == 1 else np.stack(chunk)
        ct = seal.Ciphertext()
        _load(ct, ciphertext_bytes(stack, ring=ring, parms_id=parms_id, scale=1.0), context)
        ev.transform_from_ntt_inplace(ct)
        out.extend(read_ciphertext(ct, polys=len(chunk)))
    return out


def _parms_id_at(context: seal.SEALContext, limbs: int) -> tuple[int, ...]:
    data = context.first_context_data()
    while data is not None and len(data.parms().coeff_modulus()) != limbs:
        data = data.next_context_data()
    if data is None:
        raise ValueError(f"no level with {limbs} primes")
    return tuple(data.parms_id())


def to_coefficients(poly: np.ndarray, *, ring: Ring, context: seal.SEALContext, parms_id: Sequence[int]) -> np.ndarray:
    """An NTT-form (limbs, N) polynomial in coefficient form, by SEAL's inverse NTT
    (``Evaluator.transform_from_ntt`` on a 2-component ciphertext holding it)."""
    ct = seal.Ciphertext()
    _load(ct, ciphertext_bytes(_pair(poly, ring), ring=ring, parms_id=parms_id, scale=1.0), context)
    seal.Evaluator(context).transform_from_ntt_inplace(ct)
    return read_ciphertext(ct, polys=1)[0]


def centered(coeffs: np.ndarray, primes: Sequence[int]) -> np.ndarray:
    """Coefficient-form residues (limbs, N) as the signed integers in (-Q/2, Q/2] they represent,
    Q the product of the limbs' primes (CRT, exact Python integers; an object array)."""
    limbs = coeffs.shape[0]
    qs = list(primes[:limbs])
    big_q = math.prod(qs)
    x = np.zeros(coeffs.shape[1], dtype=object)
    for j, q in enumerate(qs):
        m = big_q // q
        x = x + coeffs[j].astype(object) * (m * pow(m, -1, q))
    x = x % big_q
    return np.where(x > big_q // 2, x - big_q, x)


def centered_approx(coeffs: np.ndarray, ring: Ring) -> np.ndarray:
    """Like :func:`centered` for two limbs, vectorised, as float64 (magnitudes to ~2^-52 relative):
    Garner's CRT x = r0 + q0 * ((r1 - r0) * q0^-1 mod q1), centred."""
    if coeffs.shape[0] != 2:
        return centered(coeffs, ring.primes).astype(np.float64)
    q0, q1 = ring.primes[0], ring.primes[1]
    q1c = np.array([[q1]], dtype=_U64)
    inv = np.full((1, coeffs.shape[1]), pow(q0, -1, q1), dtype=_U64)
    r1 = coeffs[1:2] % q1c
    r0 = coeffs[0:1] % q1c
    t = mulmod(submod(r1, r0, q1c), inv, q1c)[0]
    tc = np.where(t > _U64(q1 // 2), t.astype(np.float64) - float(q1), t.astype(np.float64))
    return coeffs[0].astype(np.float64) + float(q0) * tc
