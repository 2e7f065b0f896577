"""Multiparty (threshold) CKKS over Microsoft SEAL's own keys and ciphertexts. Hazmat.

Implements the RLWE multiparty protocols of Mouchet, Troncoso-Pastoriza, Bossuat and Hubaux,
"Multiparty Homomorphic Encryption from Ring-Learning-with-Errors", PETS 2021 (MTBH below),
on polynomials that SEAL (``tenseal.sealapi``) made and will read back:

* **Collective key generation** (MTBH sec. IV-A, "EncKeyGen"): a common random polynomial
  ``a`` is expanded from a public 32-byte seed; party i publishes ``p0_i = -a*s_i + e_i`` and
  the collective public key is ``(sum_i p0_i, a)``, a SEAL ``PublicKey`` for ``s = sum_i s_i``.
* **Collective decryption** (MTBH sec. IV-B, "KeySwitch" to the zero key, i.e. Asharov et al.
  EUROCRYPT 2012 threshold decryption): for a ciphertext ``(c0, c1)`` party i publishes
  ``d_i = c1*s_i + e_smudge_i``; ``c0 + sum_i d_i = Delta*m + e + sum_i e_smudge_i`` is a SEAL
  ``Plaintext`` that SEAL's ``CKKSEncoder`` decodes.
* **t-of-N** (MTBH sec. V, after Boneh et al. CRYPTO 2018): each party Shamir-shares its
  ``s_i`` coefficientwise over every RNS prime ``q_j``; party k's threshold share is
  ``S_k = sum_i f_i(k)``, a Shamir share of ``s``; any set T of t parties decrypts with
  ``lambda_k * S_k`` (Lagrange at 0 mod q_j) in place of ``s_i``.

Representation. SEAL keeps CKKS keys and ciphertexts in NTT (evaluation) form, RNS limbs
``[poly][prime][coefficient]`` of uint64. The NTT is a ring isomorphism, so ring products are
elementwise there and every step above is elementwise arithmetic mod q_j; no NTT is
implemented here. A uniform ``a`` in NTT form is a uniform ``a`` (bijection). Errors come from
SEAL itself: ``e_i`` is the error of SEAL's own public key for ``s_i`` (``pk_i.c0 + pk_i.c1*s_i``,
SEAL's clipped discrete Gaussian, sigma 3.2). Smudging noise is sampled exactly, uniform on
``[-2^bits, 2^bits)`` per coefficient from the ChaCha20 keystream (:func:`uniform_smudging`), and
taken to NTT form by SEAL's own forward NTT (``Evaluator.transform_to_ntt`` on a not-NTT
ciphertext; :func:`to_ntt`, and :func:`to_coefficients` the other way). The canary's small
Gaussian ``e1`` is made by SEAL's ``CKKSEncoder`` (i.i.d. complex Gaussian slots map to i.i.d.
real Gaussian coefficients: the canonical embedding is a scaled isometry, so coefficient variance
is ``2*scale^2*v/N`` for slot variance v per real component). The common ``a`` comes from the
AES-256-CTR keystream of :mod:`.masking_prg` by rejection sampling (exactly uniform mod q_j).

Reading and writing. Polynomials are read straight out of SEAL objects (element access, the
in-memory layout SEAL serialises) and written back as SEAL's serialisation with compression
``NONE`` (``compr_mode_type::none``): the SEAL header, the object's members, then the
``DynArray`` (its own header, a uint64 count, the words), which SEAL validates on load
(``load`` checks sizes, parms_id and that every word is below its prime).

Nothing here checks who sent what, or that a decryption share was made honestly;
:mod:`clinograph.secure.ckks.threshold` does. Modular products use 80-bit ``longdouble``
quotient estimates (64-bit mantissa: exact for primes below 2^62, checked at import).
"""

from __future__ import annotations

import math
import secrets
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tenseal.sealapi as seal

from .ckks_context import _load
from .discrete_noise import CsprngUniform
from .masking_prg import expand_mask

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
    from .ckks_context import dump
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
    """(a + b) mod q for entries below q < 2^63."""
    s = a + b
    return np.where(s >= q, s - q, s)


def negmod(a: np.ndarray, q: np.ndarray) -> np.ndarray:
    """(-a) mod q."""
    return np.where(a == 0, a, q - a)


def submod(a: np.ndarray, b: np.ndarray, q: np.ndarray) -> np.ndarray:
    """(a - b) mod q."""
    return addmod(a, negmod(b, q), q)


def signed_to_mod(values: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Signed integers (int64) as residues mod each q_j: shape (limbs, N)."""
    v = np.broadcast_to(values.astype(np.int64), (q.shape[0], values.shape[-1]))
    return np.where(v < 0, q - np.abs(v).astype(_U64), v.astype(_U64))


# -- reading SEAL objects, writing SEAL's serialisation (compression NONE) -------------------------

def read_ciphertext(ct: seal.Ciphertext, *, polys: int | None = None) -> np.ndarray:
    """A ciphertext's words as (size, limbs, N) uint64 (NTT form for CKKS); only the first
    ``polys`` polynomials if given. (``sealapi`` has element access only: ~0.12 us a word.)"""
    shape = (ct.size() if polys is None else polys, ct.coeff_modulus_size(), ct.poly_modulus_degree())
    n = shape[0] * shape[1] * shape[2]
    return np.fromiter(map(ct.__getitem__, range(n)), dtype=_U64, count=n).reshape(shape)


def read_secret_key(sk: seal.SecretKey, ring: Ring) -> np.ndarray:
    """A secret key's words as (key-level limbs, N) uint64, NTT form."""
    pt = sk.data()
    n = pt.coeff_count()
    return np.fromiter(map(pt.__getitem__, range(n)), dtype=_U64, count=n).reshape(len(ring.primes), ring.degree)


def read_plaintext(pt: seal.Plaintext, limbs: int, degree: int) -> np.ndarray:
    """A (NTT-form CKKS) plaintext's words as (limbs, N)."""
    n = pt.coeff_count()
    return np.fromiter(map(pt.__getitem__, range(n)), dtype=_U64, count=n).reshape(limbs, degree)


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


# -- the protocol steps ------------------------------------------------------------------------

def common_poly(seed: bytes, ring: Ring) -> np.ndarray:
    """MTBH's common random polynomial ``a`` (NTT form, key level), uniform mod each q_j, from a
    public 32-byte seed (AES-256-CTR keystream, rejection sampling)."""
    out = np.empty((len(ring.primes), ring.degree), dtype=_U64)
    stream = expand_mask(seed, 2 * len(ring.primes) * ring.degree * 2).view("<u8").astype(_U64)
    pos = 0
    for j, q in enumerate(ring.primes):
        mask = _U64((1 << q.bit_length()) - 1)
        got = 0
        while got < ring.degree:
            if pos >= stream.size:  # astronomically rare (acceptance > 1/2 per word): extend the stream
                stream = expand_mask(seed, 2 * (stream.size + 4 * ring.degree)).view("<u8").astype(_U64)
            chunk = stream[pos:pos + ring.degree - got] & mask
            pos += chunk.size
            ok = chunk[chunk < _U64(q)]
            out[j, got:got + ok.size] = ok
            got += ok.size
    return out


def key_error(sk: seal.SecretKey, context: seal.SEALContext, s: np.ndarray, ring: Ring) -> np.ndarray:
    """A fresh SEAL error ``e`` for ``s`` in NTT form at the key level: SEAL's own public key for
    ``s`` is ``(-a'*s + e, a')``, so ``e = pk.c0 + pk.c1 * s``."""
    pk = seal.PublicKey()
    seal.KeyGenerator(context, sk).create_public_key(pk)
    c = read_ciphertext(pk.data())
    q = ring.q(len(ring.primes))
    return addmod(c[0], mulmod(c[1], s, q), q)


def ckg_share(*, s: np.ndarray, e: np.ndarray, a: np.ndarray, ring: Ring) -> np.ndarray:
    """MTBH EncKeyGen share ``p0_i = -a*s_i + e_i`` (key level)."""
    q = ring.q(len(ring.primes))
    return submod(e, mulmod(a, s, q), q)


def sum_polys(polys: Sequence[np.ndarray], q: np.ndarray) -> np.ndarray:
    """Sum mod q_j of same-shaped polynomials."""
    acc = polys[0].copy()
    for p in polys[1:]:
        acc = addmod(acc, p, q)
    return acc


def public_key_bytes(*, p0: np.ndarray, a: np.ndarray, ring: Ring) -> bytes:
    """The collective public key ``(p0, a)`` as SEAL PublicKey bytes."""
    return ciphertext_bytes(np.stack([p0, a]), ring=ring, parms_id=ring.key_parms_id, scale=1.0)


def gaussian_slots(n: int, source: CsprngUniform) -> list[complex]:
    """n complex values with independent N(0, 1) real and imaginary parts (Box-Muller)."""
    u1, u2 = 1.0 - source.uniform(n), source.uniform(n)  # u1 in (0, 1]
    r = np.sqrt(-2.0 * np.log(u1))
    z = r * np.cos(2 * np.pi * u2) + 1j * (r * np.sin(2 * np.pi * u2))
    return z.tolist()  # type: ignore[no-any-return]


def encoder_gaussian(*, sigma: float, encoder: seal.CKKSEncoder, ring: Ring, limbs: int,
                     source: CsprngUniform | None = None) -> np.ndarray:
    """A rounded Gaussian polynomial (i.i.d. coefficients, standard deviation ``sigma``; float64
    Box-Muller and SEAL's float64 inverse FFT, so only for small sigma), NTT form over the first
    ``limbs`` primes, made by SEAL's encoder (see the module docstring). Used for the canary's
    ``e1``, never for smudging."""
    src = source if source is not None else CsprngUniform()
    pt = seal.Plaintext()
    scale = sigma * math.sqrt(ring.degree / 2.0)  # coefficient variance 2*scale^2/N per unit slot variance
    encoder.encode(gaussian_slots(ring.degree // 2, src), list(ring.data_parms_id), scale, pt)
    return read_plaintext(pt, ring.data_count, ring.degree)[:limbs]


def to_ntt(coeffs: np.ndarray, *, ring: Ring, context: seal.SEALContext, parms_id: Sequence[int]) -> np.ndarray:
    """A coefficient-form (limbs, N) polynomial in NTT form, by SEAL's forward NTT
    (``Evaluator.transform_to_ntt`` on a 2-component, not-NTT ciphertext holding it)."""
    body = bytearray(ciphertext_bytes(np.stack([coeffs, coeffs]), ring=ring, parms_id=parms_id, scale=1.0))
    body[16 + 32] = 0  # is_ntt_form = false
    ct = seal.Ciphertext()
    _load(ct, bytes(body), context)
    seal.Evaluator(context).transform_to_ntt_inplace(ct)
    return read_ciphertext(ct, polys=1)[0]


def uniform_smudging(*, bits: int, ring: Ring, context: seal.SEALContext, limbs: int,
                     _key: bytes | None = None) -> np.ndarray:
    """Smudging noise: i.i.d. coefficients exactly uniform on the 2^(bits+1) integers
    [-2^bits, 2^bits), from the ChaCha20 keystream under a fresh OS key (exact integer
    arithmetic, no floating point), returned in NTT form over the first ``limbs`` primes.

    Why uniform: its shift bound is exact and elementary -- SD(U + mu, U) = |mu| / 2^(bits+1)
    per coefficient, so N*B / 2^(bits+1) for a noise polynomial bounded by B -- where a
    floating-point Gaussian at this width would carry the low-bit artefacts of its arithmetic.
    """
    if not 1 <= bits <= 100:
        raise ValueError("bits must be in 1..100")
    src = CsprngUniform(_key=_key)
    n, extra = ring.degree, bits + 1 - 64
    lo = np.frombuffer(src._enc.update(bytes(8 * n)), dtype="<u8").astype(_U64)
    q = ring.q(limbs)
    if extra <= 0:
        lo = lo >> _U64(64 - bits - 1)
        hi = np.zeros(n, dtype=_U64)
    else:
        hi = np.frombuffer(src._enc.update(bytes(8 * n)), dtype="<u8").astype(_U64) >> _U64(64 - extra)
    two64 = np.array([(1 << 64) % p for p in ring.primes[:limbs]], dtype=_U64).reshape(-1, 1)
    offset = np.array([(1 << bits) % p for p in ring.primes[:limbs]], dtype=_U64).reshape(-1, 1)
    v = addmod(mulmod(np.broadcast_to(hi, (limbs, n)) % q, np.broadcast_to(two64, (limbs, n)), q),
               np.broadcast_to(lo, (limbs, n)) % q, q)  # v = hi*2^64 + lo mod q_j, uniform on [0, 2^(bits+1))
    coeffs = submod(v, np.broadcast_to(offset, (limbs, n)), q)  # v - 2^bits
    return to_ntt(coeffs, ring=ring, context=context, parms_id=_parms_id_at(context, limbs))


def _parms_id_at(context: seal.SEALContext, limbs: int) -> tuple[int, ...]:
    data = context.first_context_data()
    while data is not None and len(data.parms().coeff_modulus()) != limbs:
        data = data.next_context_data()
    if data is None:
        raise ValueError(f"no level with {limbs} primes")
    return tuple(data.parms_id())


def decryption_share(*, c1: np.ndarray, s: np.ndarray, noise: np.ndarray, ring: Ring) -> np.ndarray:
    """MTBH collective decryption share ``d_i = c1*s_i + e_smudge`` over c1's limbs."""
    limbs = c1.shape[0]
    q = ring.q(limbs)
    return addmod(mulmod(c1, s[:limbs], q), noise, q)


def combine_decryption(*, c0: np.ndarray, shares: Sequence[np.ndarray], ring: Ring) -> np.ndarray:
    """``c0 + sum_i d_i``: the NTT-form plaintext ``Delta*m + noise``."""
    q = ring.q(c0.shape[0])
    return sum_polys([c0, *shares], q)


# -- t-of-N: Shamir over every RNS prime, coefficientwise ---------------------------------------------

def shamir_split(s: np.ndarray, *, threshold: int, n_shares: int, ring: Ring) -> list[np.ndarray]:
    """Shares f(1..n) of ``s`` (limbs, N), f of degree t-1 with uniform coefficients mod q_j."""
    if not 1 <= threshold <= n_shares:
        raise ValueError(f"need 1 <= threshold <= n_shares, got {threshold}, {n_shares}")
    q = ring.q(s.shape[0])
    coeffs = [s] + [common_poly(secrets.token_bytes(32), ring)[:s.shape[0]] for _ in range(threshold - 1)]
    out = []
    for x in range(1, n_shares + 1):
        xs = np.full_like(q, x)
        y = np.zeros_like(s)
        for c in reversed(coeffs):  # Horner
            y = addmod(mulmod(y, np.broadcast_to(xs, s.shape), q), c, q)
        out.append(y)
    return out


def lagrange_at_zero(xs: Sequence[int], *, ring: Ring, limbs: int) -> dict[int, np.ndarray]:
    """Lagrange coefficients lambda_k = prod_{j != k} x_j / (x_j - x_k) mod each q_j, as (limbs, 1)."""
    if len(set(xs)) != len(xs) or any(x < 1 for x in xs):
        raise ValueError("share indices must be distinct and >= 1")
    out = {}
    for k in xs:
        col = []
        for q in ring.primes[:limbs]:
            num = den = 1
            for j in xs:
                if j != k:
                    num, den = num * j % q, den * (j - k) % q
            col.append(num * pow(den, -1, q) % q)
        out[k] = np.array(col, dtype=_U64).reshape(-1, 1)
    return out


def scale_poly(poly: np.ndarray, factor: np.ndarray, ring: Ring) -> np.ndarray:
    """poly * factor mod q_j (factor a (limbs, 1) column)."""
    q = ring.q(poly.shape[0])
    return mulmod(poly, np.broadcast_to(factor, poly.shape), q)


# -- coefficient domain (through SEAL's own NTT) and the canary check ------------------------------

def to_coefficients(poly: np.ndarray, *, ring: Ring, context: seal.SEALContext, parms_id: Sequence[int]) -> np.ndarray:
    """An NTT-form (limbs, N) polynomial in coefficient form, by SEAL's inverse NTT
    (``Evaluator.transform_from_ntt`` on a 2-component ciphertext holding it)."""
    ct = seal.Ciphertext()
    _load(ct, ciphertext_bytes(np.stack([poly, poly]), ring=ring, parms_id=parms_id, scale=1.0), context)
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


def canary_c1(*, a: np.ndarray, ring: Ring, context: seal.SEALContext, encoder: seal.CKKSEncoder) -> tuple[np.ndarray, np.ndarray]:
    """A canary ``c1 = a*u + e1`` at the data level with ``u`` ternary (a fresh SEAL secret key)
    and ``e1`` a rounded Gaussian (sigma 3.2): an RLWE sample, so a party cannot tell it from a
    real ciphertext's ``c1``. Returns (c1, u); ``u`` stays with whoever checks the shares."""
    limbs = ring.data_count
    u = read_secret_key(seal.KeyGenerator(context).secret_key(), ring)[:limbs]
    e1 = encoder_gaussian(sigma=3.2, encoder=encoder, ring=ring, limbs=limbs)
    q = ring.q(limbs)
    return addmod(mulmod(a[:limbs], u, q), e1, q), u


def canary_residual(*, share: np.ndarray, u: np.ndarray, p0: np.ndarray, ring: Ring,
                    context: seal.SEALContext) -> float:
    """log2 of the largest |coefficient| of ``d_i + u*p0_i`` (CRT over the share's limbs). For an
    honest share ``d_i = c1*s_i + e`` on a canary this is ``e1*s_i + e + u*e_i``: the smudging
    bound plus a few bits at most; a share under any other key is uniform mod Q (about log2 Q - 1)."""
    limbs = share.shape[0]
    q = ring.q(limbs)
    r = addmod(share, mulmod(u, p0[:limbs], q), q)
    coeffs = to_coefficients(r, ring=ring, context=context, parms_id=ring.data_parms_id)
    return float(np.log2(np.max(np.abs(centered_approx(coeffs, ring))) + 1.0))


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
