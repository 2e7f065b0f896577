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
* **Encryption under one's own key share** (the ``ckks_threshold`` mode; the additive-share
  input encryption of MTBH sec. IV with a common ``c1``, as in the RLWE secure aggregation of
  Stevens et al., USENIX Security 2022): party i encrypts ``m_i`` as ``c0_i = -a*s_i + e_i +
  Delta*m_i`` for a common random ``a`` fresh to the round, and sends only ``c0_i``; then
  ``(sum_{i in P} c0_i, a)`` is a ciphertext of ``sum m_i`` under ``s_P = sum_{i in P} s_i``,
  which collective decryption opens with ``c1 = a`` (:func:`own_key_c0`). Each ``c0_i`` is an
  RLWE sample of ``s_i`` (the same problem as SEAL's own symmetric encryption), never reused: a
  hospital encrypts under a given ``a`` once.
* **t-of-N** (MTBH sec. V, after Boneh et al. CRYPTO 2018): each party Shamir-shares its
  ``s_i`` coefficientwise over every RNS prime ``q_j``; party k's threshold share is
  ``S_k = sum_i f_i(k)``, a Shamir share of ``s``; any set T of t parties decrypts with
  ``lambda_k * S_k`` (Lagrange at 0 mod q_j) in place of ``s_i``.

Why this route: OpenFHE implements multiparty CKKS, but no OpenFHE wheel imports under the
project's CPython 3.11 (issue 36 measured it: the 1.6.1 wheel installs, its extension is built
for 3.10) and Debian has no package, so it cannot be set up on a fresh machine as the README
promises. TenSEAL, already a dependency, ships ``tenseal.sealapi`` (SEAL's KeyGenerator,
Encryptor, Evaluator, CKKSEncoder, serialisation); the protocols are small and published, so
they are written here over SEAL's own polynomials, and SEAL keeps doing all the CKKS work it
already does. Known-answer tests pin the result to SEAL's single-key Decryptor.

Representation. SEAL keeps CKKS keys and ciphertexts in NTT (evaluation) form, RNS limbs
``[poly][prime][coefficient]`` of uint64. The NTT is a ring isomorphism, so ring products are
elementwise there and every step above is elementwise arithmetic mod q_j; no NTT is
implemented here. A uniform ``a`` in NTT form is a uniform ``a`` (bijection). Errors come from
SEAL itself: ``e_i`` is the error of SEAL's own public key for ``s_i`` (``pk_i.c0 + pk_i.c1*s_i``,
SEAL's error distribution, its centred binomial). Smudging noise is sampled exactly, uniform on
``[-2^bits, 2^bits)`` per coefficient from the ChaCha20 keystream (:func:`uniform_smudging`), and
taken to NTT form by SEAL's own forward NTT (``Evaluator.transform_to_ntt`` on a not-NTT
ciphertext; :func:`to_ntt`, and :func:`to_coefficients` the other way). The canary's small
``e1`` and the mode's encryption errors are SEAL's centred binomial drawn as exact integers
(:func:`rlwe_errors`, |e| <= 21). The common ``a`` comes from the
AES-256-CTR keystream of :mod:`.masking_prg` by rejection sampling (exactly uniform mod q_j).

Reading and writing: polynomials come straight out of SEAL objects and go back as SEAL's
serialisation with compression ``NONE``, which SEAL validates on load (:mod:`.seal_polys`).

Nothing here checks who sent what, or that a decryption share was made honestly;
:mod:`clinograph.secure.ckks.threshold` does.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import numpy as np
import tenseal.sealapi as seal

from .discrete_noise import CsprngUniform
from .masking_prg import expand_mask
from .seal_polys import (
    _U64,
    Ring,
    _parms_id_at,
    addmod,
    centered,
    centered_approx,
    ciphertext_bytes,
    load_plaintext,
    load_public_key,
    mulmod,
    plaintext_bytes,
    read_ciphertext,
    read_plaintext,
    read_secret_key,
    submod,
    to_coefficients,
    to_coefficients_many,
    to_ntt,
    to_ntt_many,
)

__all__ = [  # the SEAL-polynomial helpers are re-exported: the safe API imports this module only
    "Ring", "addmod", "canary_c1", "canary_residual", "centered", "centered_approx", "ciphertext_bytes", "ckg_share",
    "combine_decryption", "common_poly", "own_key_c0", "rlwe_errors", "uniform_polys", "decryption_share", "key_error",
    "lagrange_at_zero", "load_plaintext", "load_public_key", "mulmod", "plaintext_bytes", "public_key_bytes",
    "read_ciphertext", "read_plaintext", "read_secret_key", "scale_poly", "seeded_canary_c1", "shamir_split", "submod", "sum_polys",
    "ternary_poly", "to_coefficients", "to_coefficients_many", "to_ntt", "to_ntt_many", "uniform_smudging", "uniform_smudging_many",
]


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


def uniform_polys(key: bytes, *, ring: Ring, limbs: int, count: int) -> np.ndarray:
    """``count`` polynomials (count, limbs, N), each coefficient uniform mod q_j, from one
    AES-256-CTR keystream under ``key`` (a 32-byte key used for nothing else): per limb j, words
    cut to q_j's bit length and kept below q_j (rejection sampling, exact). One stream for many
    polynomials: what the pairwise zero-sharing masks of a whole request take."""
    n = count * ring.degree
    out = np.empty((limbs, n), dtype=_U64)
    stream = expand_mask(key, 2 * limbs * (n + n // 2 + 64)).view("<u8").astype(_U64)
    pos = 0
    for j, q in enumerate(ring.primes[:limbs]):
        mask, got = _U64((1 << q.bit_length()) - 1), 0
        while got < n:
            if pos >= stream.size:  # acceptance > 1/2 a word: astronomically rare; extend the stream
                stream = expand_mask(key, 2 * (stream.size + n)).view("<u8").astype(_U64)
            chunk = stream[pos:pos + n - got] & mask
            pos += chunk.size
            below = chunk < _U64(q)
            ok = chunk if below.all() else chunk[below]  # SEAL's 60-bit primes: almost every word is below
            out[j, got:got + ok.size] = ok
            got += ok.size
    return np.ascontiguousarray(out.reshape(limbs, count, ring.degree).transpose(1, 0, 2))


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


def uniform_smudging(*, bits: int, ring: Ring, context: seal.SEALContext, limbs: int,
                     _key: bytes | None = None) -> np.ndarray:
    """Smudging noise: i.i.d. coefficients exactly uniform on the 2^(bits+1) integers
    [-2^bits, 2^bits), from the ChaCha20 keystream under a fresh OS key (exact integer
    arithmetic, no floating point), returned in NTT form over the first ``limbs`` primes.

    Why uniform: its shift bound is exact and elementary -- SD(U + mu, U) = |mu| / 2^(bits+1)
    per coefficient, so N*B / 2^(bits+1) for a noise polynomial bounded by B -- where a
    floating-point Gaussian at this width would carry the low-bit artefacts of its arithmetic.
    """
    return uniform_smudging_many(count=1, bits=bits, ring=ring, context=context, limbs=limbs, _key=_key)[0]


def uniform_smudging_many(*, count: int, bits: int, ring: Ring, context: seal.SEALContext, limbs: int,
                          _key: bytes | None = None) -> list[np.ndarray]:
    """``count`` independent :func:`uniform_smudging` polynomials (one keystream, taken to NTT
    form 16 at a time)."""
    if not 1 <= bits <= 100:
        raise ValueError("bits must be in 1..100")
    src = CsprngUniform(_key=_key)
    n, extra = ring.degree, bits + 1 - 64
    q = ring.q(limbs)
    two64 = np.array([(1 << 64) % p for p in ring.primes[:limbs]], dtype=_U64).reshape(-1, 1)
    offset = np.array([(1 << bits) % p for p in ring.primes[:limbs]], dtype=_U64).reshape(-1, 1)
    polys = []
    for _ in range(count):
        lo = np.frombuffer(src.raw(8 * n), dtype="<u8").astype(_U64)
        if extra <= 0:
            lo = lo >> _U64(64 - bits - 1)
            hi = np.zeros(n, dtype=_U64)
        else:
            hi = np.frombuffer(src.raw(8 * n), dtype="<u8").astype(_U64) >> _U64(64 - extra)
        v = addmod(mulmod(np.broadcast_to(hi, (limbs, n)) % q, np.broadcast_to(two64, (limbs, n)), q),
                   np.broadcast_to(lo, (limbs, n)) % q, q)  # v = hi*2^64 + lo mod q_j, uniform on [0, 2^(bits+1))
        polys.append(submod(v, np.broadcast_to(offset, (limbs, n)), q))  # v - 2^bits
    return to_ntt_many(polys, ring=ring, context=context, parms_id=_parms_id_at(context, limbs))


def decryption_share(*, c1: np.ndarray, s: np.ndarray, noise: np.ndarray, ring: Ring) -> np.ndarray:
    """MTBH collective decryption share ``d_i = c1*s_i + e_smudge`` over c1's limbs."""
    limbs = c1.shape[0]
    q = ring.q(limbs)
    return addmod(mulmod(c1, s[:limbs], q), noise, q)


#: SEAL's default error (``SEAL_USE_GAUSSIAN_NOISE`` off, as in TenSEAL's build): the centred
#: binomial of 2 x 21 bits, variance 21/2 = 10.5 (sigma 3.24), |e| <= 21
CBD_BITS = 21


def rlwe_errors(count: int, *, ring: Ring, limbs: int, source: CsprngUniform | None = None) -> np.ndarray:
    """``count`` RLWE error polynomials (count, limbs, N), coefficient form: each coefficient
    popcount(21 bits) - popcount(21 bits) of the ChaCha20 stream of ``source`` (a fresh OS key by
    default) -- exact integers, SEAL's own error distribution (its centred binomial: variance
    10.5, |e| <= 21; measured against SEAL's key errors in the tests)."""
    src = source if source is not None else CsprngUniform()
    n = count * ring.degree
    words = np.frombuffer(src.raw(8 * n), dtype="<u8")
    mask = np.uint64((1 << CBD_BITS) - 1)
    e = (np.bitwise_count(words & mask).astype(np.int64)
         - np.bitwise_count((words >> np.uint64(CBD_BITS)) & mask).astype(np.int64)).reshape(count, 1, ring.degree)
    q = ring.q(limbs).astype(np.int64).reshape(1, limbs, 1)
    return (e % q).astype(_U64)  # numpy's % of a negative int64 by a positive one is non-negative


def own_key_c0(*, plaintexts: Sequence[np.ndarray], a: Sequence[np.ndarray], s: np.ndarray, ring: Ring,
               context: seal.SEALContext, source: CsprngUniform | None = None) -> list[np.ndarray]:
    """``c0_k = Delta*m_k - a_k*s + e_k`` in *coefficient* form (what is rounded and sent) for NTT-
    form plaintexts ``Delta*m_k`` (SEAL's ``CKKSEncoder``) and common polynomials ``a_k``:
    ``Delta*m_k - a_k*s`` in NTT form, SEAL's inverse NTT, plus a fresh RLWE error
    (:func:`rlwe_errors`). ``(c0_k, a_k)`` is SEAL's symmetric encryption with ``a_k`` in place of
    its random ``c1``: SEAL's ``Decryptor`` under ``s`` opens it (tested)."""
    limbs = plaintexts[0].shape[0]
    q = ring.q(limbs)
    ntt = [submod(pt, mulmod(ak[:limbs], s[:limbs], q), q) for pt, ak in zip(plaintexts, a, strict=True)]
    coeffs = to_coefficients_many(ntt, ring=ring, context=context, parms_id=_parms_id_at(context, limbs))
    errors = rlwe_errors(len(coeffs), ring=ring, limbs=limbs, source=source)
    return [addmod(c, e, q) for c, e in zip(coeffs, errors, strict=True)]


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

def canary_c1(*, a: np.ndarray, ring: Ring, context: seal.SEALContext) -> tuple[np.ndarray, np.ndarray]:
    """A canary ``c1 = a*u + e1`` at the data level with ``u`` ternary (a fresh SEAL secret key)
    and ``e1`` SEAL's error (:func:`rlwe_errors`: |e1| <= 21): an RLWE sample, so a party cannot
    tell it from a real ciphertext's ``c1``. Returns (c1, u); ``u`` stays with whoever checks the
    shares."""
    limbs = ring.data_count
    u = read_secret_key(seal.KeyGenerator(context).secret_key(), ring)[:limbs]
    e1 = _error_ntt(ring=ring, context=context, source=None)
    q = ring.q(limbs)
    return addmod(mulmod(a[:limbs], u, q), e1, q), u


def seeded_canary_c1(*, u_key: bytes, e_key: bytes, a: np.ndarray, ring: Ring,
                     context: seal.SEALContext) -> tuple[np.ndarray, np.ndarray]:
    """:func:`canary_c1` made reproducibly from two 32-byte keys: ``u`` ternary, each coefficient
    uniform on {-1, 0, 1} (AES-256-CTR bytes below 255, mod 3), ``e1`` SEAL's error
    (:func:`rlwe_errors`, |e1| <= 21) from the ChaCha20 stream under ``e_key``. Anyone holding the keys recomputes the canary, so a
    key holder can check that the extra ``c1`` it is asked to decrypt is this canary and not some
    ciphertext's ``c1`` (the ``ckks_threshold`` mode). Returns (c1, u)."""
    limbs = ring.data_count
    q = ring.q(limbs)
    u = ternary_poly(u_key, ring=ring, context=context)
    e1 = _error_ntt(ring=ring, context=context, source=CsprngUniform(_key=e_key))
    return addmod(mulmod(a[:limbs], u, q), e1, q), u


def _error_ntt(*, ring: Ring, context: seal.SEALContext, source: CsprngUniform | None) -> np.ndarray:
    """One :func:`rlwe_errors` polynomial in NTT form at the data level (bounded: |e| <= 21)."""
    e = rlwe_errors(1, ring=ring, limbs=ring.data_count, source=source)[0]
    return to_ntt(e, ring=ring, context=context, parms_id=ring.data_parms_id)


def ternary_poly(key: bytes, *, ring: Ring, context: seal.SEALContext) -> np.ndarray:
    """A ternary polynomial from a 32-byte key, each coefficient uniform on {-1, 0, 1} (AES-256-CTR
    bytes below 255, mod 3), in NTT form at the data level."""
    n = ring.degree
    raw = np.frombuffer(expand_mask(key, 2 * n), dtype=np.uint8)
    ok = raw[raw < 255]
    while ok.size < n:  # P(fewer than N of 2N bytes below 255) is negligible; extend anyway
        raw = np.frombuffer(expand_mask(key, 2 * raw.size), dtype=np.uint8)
        ok = raw[raw < 255]
    tern = (ok[:n] % 3).astype(np.int64) - 1
    q = ring.q(ring.data_count)
    coeffs = np.where(tern < 0, q - _U64(1), tern.astype(_U64)).astype(_U64)
    return to_ntt(coeffs, ring=ring, context=context, parms_id=ring.data_parms_id)


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
