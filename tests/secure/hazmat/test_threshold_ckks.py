"""Threshold CKKS primitives against SEAL itself: known answers, noise sizes, negative cases."""

from __future__ import annotations

import numpy as np
import pytest
import tenseal.sealapi as seal
from clinograph.secure.hazmat import threshold_ckks as T
from clinograph.secure.hazmat.ckks_context import CkksParams, _load, build_context

SCALE = 2.0 ** 96
BITS = 68  # the preset's smudging: uniform on [-2^68, 2^68)


@pytest.fixture(scope="module")
def env():
    ctx, _ = build_context(CkksParams(8192, (60, 60, 60), 96))
    return ctx, T.Ring.of(ctx), seal.CKKSEncoder(ctx)


def _parties(env, n):
    ctx, ring, _ = env
    sks = [seal.KeyGenerator(ctx).secret_key() for _ in range(n)]
    return sks, [T.read_secret_key(k, ring) for k in sks]


def _collective_pk(env, sks, S, seed=b"\x07" * 32):
    ctx, ring, _ = env
    a = T.common_poly(seed, ring)
    p0s = [T.ckg_share(s=s, e=T.key_error(k, ctx, s, ring), a=a, ring=ring) for k, s in zip(sks, S, strict=True)]
    p0 = T.sum_polys(p0s, ring.q(len(ring.primes)))
    return T.load_public_key(T.public_key_bytes(p0=p0, a=a, ring=ring), ctx), a, p0s


def _smudge(env):
    return T.uniform_smudging(bits=BITS, ring=env[1], context=env[0], limbs=2)


def _encrypt(env, pk, x):
    ctx, _, enc = env
    pt, ct = seal.Plaintext(), seal.Ciphertext()
    enc.encode(list(map(float, x)), SCALE, pt)
    seal.Encryptor(ctx, pk).encrypt(pt, ct)
    return ct


def _open(env, ct, shares):
    ctx, ring, enc = env
    c = T.read_ciphertext(ct)
    m = T.combine_decryption(c0=c[0], shares=shares, ring=ring)
    pt = T.load_plaintext(T.plaintext_bytes(m, ring=ring, parms_id=list(ct.parms_id()), scale=ct.scale), ctx)
    return m, np.asarray(enc.decode_double(pt))


def _noise_coeffs(env, m, xs):
    """Coefficients of (combined plaintext - the sum of SEAL's encodings of each x in xs), centred
    mod q_0: the decryption noise alone (the encoder's own float rounding at scale 2^80 is
    message-dependent, not key-dependent, and is not part of it)."""
    ctx, ring, enc = env
    q = ring.q(ring.data_count)
    ref = np.zeros((ring.data_count, ring.degree), np.uint64)
    for x in xs:
        pt = seal.Plaintext()
        enc.encode(list(map(float, x)), SCALE, pt)
        ref = T.addmod(ref, T.read_plaintext(pt, ring.data_count, ring.degree), q)
    diff = T.submod(m, ref, q)
    return _signed(env, diff)


def _signed(env, ntt_poly):
    """An NTT-form data-level polynomial's coefficients as float64 signed integers (CRT)."""
    ctx, ring, _ = env
    coeffs = T.to_coefficients(ntt_poly, ring=ring, context=ctx, parms_id=ring.data_parms_id)
    return T.centered(coeffs, ring.primes).astype(np.float64)


def test_mulmod_matches_python_integers(env):
    _, ring, _ = env
    rng = np.random.default_rng(0)
    q = ring.q(3)
    a = rng.integers(0, 2 ** 62, size=(3, 500), dtype=np.uint64) % q
    b = rng.integers(0, 2 ** 62, size=(3, 500), dtype=np.uint64) % q
    a[:, 0], b[:, 0] = q[:, 0] - 1, q[:, 0] - 1  # the largest product
    got = T.mulmod(a, b, q)
    want = [[int(a[j, i]) * int(b[j, i]) % ring.primes[j] for i in range(500)] for j in range(3)]
    assert got.tolist() == want


def test_emitted_bytes_round_trip_through_seal(env):
    ctx, ring, _ = env
    kg = seal.KeyGenerator(ctx)
    pk = seal.PublicKey()
    kg.create_public_key(pk)
    words = T.read_ciphertext(pk.data())
    again = T.load_public_key(T.public_key_bytes(p0=words[0], a=words[1], ring=ring), ctx)
    assert np.array_equal(T.read_ciphertext(again.data()), words)
    bad = words.copy()
    bad[0, 0, 0] = ring.primes[0]  # not below its prime: SEAL refuses the bytes
    with pytest.raises(ValueError, match="SEAL refused"):
        T.load_public_key(T.public_key_bytes(p0=bad[0], a=bad[1], ring=ring), ctx)


def test_common_poly_is_seeded_and_below_every_prime(env):
    _, ring, _ = env
    a = T.common_poly(b"\x01" * 32, ring)
    assert np.array_equal(a, T.common_poly(b"\x01" * 32, ring))
    assert not np.array_equal(a, T.common_poly(b"\x02" * 32, ring))
    assert np.all(a < ring.q(len(ring.primes)))
    # uniform: the mean of 8192 draws is q/2 within 5 standard deviations
    assert abs(a[0].astype(np.float64).mean() / ring.primes[0] - 0.5) < 5 * (1 / np.sqrt(12 * ring.degree))


def test_single_party_equals_seal_decryptor(env):
    """Known answer: with one party and no smudging, c0 + c1*s is SEAL's Decryptor's plaintext, word for word."""
    ctx, ring, enc = env
    sks, S = _parties(env, 1)
    pk = seal.PublicKey()
    seal.KeyGenerator(ctx, sks[0]).create_public_key(pk)
    x = np.linspace(-3, 3, 4096)
    ct = _encrypt(env, pk, x)
    d = T.decryption_share(c1=T.read_ciphertext(ct)[1], s=S[0], noise=np.zeros((2, ring.degree), np.uint64), ring=ring)
    m, y = _open(env, ct, [d])
    ref = seal.Plaintext()
    seal.Decryptor(ctx, sks[0]).decrypt(ct, ref)
    assert np.array_equal(m, T.read_plaintext(ref, ring.data_count, ring.degree))
    assert np.array_equal(y, np.asarray(enc.decode_double(ref)))


def test_single_party_collective_key_equals_seal_decryptor(env):
    """The collective-key path with N = 1 builds a public key SEAL's Decryptor (with s_1) opens."""
    ctx, ring, enc = env
    sks, S = _parties(env, 1)
    pk, _, _ = _collective_pk(env, sks, S)
    x = np.linspace(-1, 1, 4096)
    ct = _encrypt(env, pk, x)
    ref = seal.Plaintext()
    seal.Decryptor(ctx, sks[0]).decrypt(ct, ref)
    assert np.abs(np.asarray(enc.decode_double(ref)) - x).max() < 1e-9


def test_seal_encryptor_under_collective_key_decrypts_collectively(env):
    _, ring, enc = env
    sks, S = _parties(env, 4)
    pk, _, _ = _collective_pk(env, sks, S)
    rng = np.random.default_rng(1)
    xs = [rng.normal(scale=100, size=4096) for _ in range(4)]
    cts = [_encrypt(env, pk, x) for x in xs]
    ev = seal.Evaluator(env[0])
    agg = cts[0]
    for ct in cts[1:]:
        ev.add_inplace(agg, ct)
    c1 = T.read_ciphertext(agg)[1]
    shares = [T.decryption_share(c1=c1, s=s, noise=_smudge(env),
                                 ring=ring) for s in S]
    m, y = _open(env, agg, shares)
    assert np.abs(y - sum(xs)).max() < 1e-5  # 4 smudging terms: slot std 2^67.2 * 2^6.5 / 2^96 ~ 2^-22
    assert np.abs(y - sum(xs)).max() > 0  # the smudging is there


def test_fewer_than_all_shares_decrypt_nothing(env):
    _, ring, enc = env
    sks, S = _parties(env, 3)
    pk, _, _ = _collective_pk(env, sks, S)
    x = np.random.default_rng(2).normal(size=4096)
    ct = _encrypt(env, pk, x)
    c1 = T.read_ciphertext(ct)[1]
    noise = np.zeros((2, ring.degree), np.uint64)
    m, y = _open(env, ct, [T.decryption_share(c1=c1, s=s, noise=noise, ring=ring) for s in S[:2]])
    # c0 + c1*(s1 + s2) = Delta*m - c1*s3 + e: uniform mod q, so the decoded values are unrelated to x
    assert abs(np.corrcoef(y, x)[0, 1]) < 5 / np.sqrt(4096)
    assert np.median(np.abs(y)) > 1e6
    coeffs = T.to_coefficients(m, ring=ring, context=env[0], parms_id=ring.data_parms_id)[0]
    assert abs(coeffs.astype(np.float64).mean() / ring.primes[0] - 0.5) < 5 / np.sqrt(12 * ring.degree)


def test_threshold_shamir_t_of_n(env):
    """t-of-N (MTBH sec. V): any t Shamir shares of s decrypt, t - 1 do not."""
    _, ring, enc = env
    sks, S = _parties(env, 4)
    pk, _, _ = _collective_pk(env, sks, S)
    dealt = [T.shamir_split(s[:2], threshold=3, n_shares=4, ring=ring) for s in S]
    q = ring.q(2)
    held = {k + 1: T.sum_polys([d[k] for d in dealt], q) for k in range(4)}
    x = np.random.default_rng(3).normal(size=4096)
    ct = _encrypt(env, pk, x)
    c1 = T.read_ciphertext(ct)[1]

    def open_with(xs):
        lam = T.lagrange_at_zero(xs, ring=ring, limbs=2)
        return _open(env, ct, [T.decryption_share(
            c1=c1, s=T.scale_poly(held[k], lam[k], ring),
            noise=_smudge(env), ring=ring) for k in xs])[1]

    assert np.abs(open_with([1, 2, 4]) - x).max() < 1e-5
    assert np.abs(open_with([2, 3, 4]) - x).max() < 1e-5
    assert abs(np.corrcoef(open_with([1, 3]), x)[0, 1]) < 5 / np.sqrt(4096)


def test_smudging_noise_has_the_stated_distribution(env):
    v = _signed(env, _smudge(env)) / 2.0 ** BITS  # exact integers / 2^68, CRT over both primes
    assert v.min() >= -1 and v.max() < 1
    assert abs(v.mean()) < 5 / np.sqrt(3 * env[1].degree) and abs(v.std() - 1 / np.sqrt(3)) < 0.02
    assert abs(np.corrcoef(v[:-1], v[1:])[0, 1]) < 5 / np.sqrt(env[1].degree)  # independent coefficients
    assert np.histogram(v, bins=8, range=(-1, 1))[0].min() > 0.8 * env[1].degree / 8  # flat
    fixed = T.uniform_smudging(bits=BITS, ring=env[1], context=env[0], limbs=2, _key=b"k" * 32)
    assert np.array_equal(fixed, T.uniform_smudging(bits=BITS, ring=env[1], context=env[0], limbs=2, _key=b"k" * 32))
    assert not np.array_equal(_smudge(env), _smudge(env))


def test_ntt_round_trip_through_seal(env):
    ctx, ring, _ = env
    x = _smudge(env)
    back = T.to_ntt(T.to_coefficients(x, ring=ring, context=ctx, parms_id=ring.data_parms_id), ring=ring,
                    context=ctx, parms_id=ring.data_parms_id)
    assert np.array_equal(back, x)


def test_decryption_noise_within_stated_bound(env):
    """B = 2^13 (SECURITY.md): the aggregate of n fresh encryptions under an n-party key, here n = 8."""
    sks, S = _parties(env, 8)
    pk, _, _ = _collective_pk(env, sks, S)
    xs = [np.random.default_rng(10 + i).normal(size=4096) for i in range(8)]
    cts = [_encrypt(env, pk, x) for x in xs]
    for ct in cts[1:]:
        seal.Evaluator(env[0]).add_inplace(cts[0], ct)
    c1 = T.read_ciphertext(cts[0])[1]
    zero = np.zeros((2, env[1].degree), np.uint64)
    m, _ = _open(env, cts[0], [T.decryption_share(c1=c1, s=s, noise=zero, ring=env[1]) for s in S])
    noise = _noise_coeffs(env, m, xs)
    assert np.abs(noise).max() < 2 ** 13
    assert np.abs(noise).std() > 1  # measured, not zero


def test_smudged_outputs_and_shares_do_not_correlate_with_the_secret(env):
    ctx, ring, enc = env
    sks, S = _parties(env, 2)
    pk, _, _ = _collective_pk(env, sks, S)
    x = np.zeros(4096)
    ct = _encrypt(env, pk, x)
    c1 = T.read_ciphertext(ct)[1]
    shares = [T.decryption_share(c1=c1, s=s, noise=_smudge(env),
                                 ring=ring) for s in S]
    m, _ = _open(env, ct, shares)
    s0 = _signed(env, S[0][:2])
    assert set(np.unique(s0)) <= {-1.0, 0.0, 1.0}  # SEAL's ternary key, read correctly
    noise = _noise_coeffs(env, m, [x])
    share0 = _signed(env, shares[0])
    bound = 5 / np.sqrt(ring.degree)
    assert abs(np.corrcoef(noise, s0)[0, 1]) < bound
    assert abs(np.corrcoef(share0, s0)[0, 1]) < bound
    # without smudging the output noise does carry key-dependent terms: the test can tell
    raw = _open(env, ct, [T.decryption_share(c1=c1, s=s, noise=np.zeros_like(c1), ring=ring) for s in S])[0]
    assert np.abs(_noise_coeffs(env, raw, [x])).max() < 2 ** 13 < np.abs(noise).max()


def test_canary_residual_separates_honest_and_wrong_key_shares(env):
    ctx, ring, enc = env
    sks, S = _parties(env, 2)
    _, a, p0s = _collective_pk(env, sks, S)
    c1, u = T.canary_c1(a=a, ring=ring, context=ctx)
    honest = T.decryption_share(c1=c1, s=S[0], noise=_smudge(env),
                                ring=ring)
    wrong = T.decryption_share(c1=c1, s=S[1], noise=_smudge(env),
                               ring=ring)
    assert T.canary_residual(share=honest, u=u, p0=p0s[0], ring=ring, context=ctx) < BITS + 0.1
    assert T.canary_residual(share=wrong, u=u, p0=p0s[0], ring=ring, context=ctx) > 118


# -- encryption under one's own key share (the ckks_threshold mode) --------------------------------

def _own(env, sks, S, xs, a, source=None):
    ctx, ring, enc = env
    plains = []
    for x in xs:
        pt = seal.Plaintext()
        enc.encode(list(map(float, x)), SCALE, pt)
        plains.append(T.read_plaintext(pt, ring.data_count, ring.degree))
    return T.own_key_c0(plaintexts=plains, a=a, s=S, ring=ring, context=ctx, source=source)


def test_own_key_encryption_is_a_seal_symmetric_ciphertext(env):
    """Known answer: (c0, a) with c0 = Delta*m - a*s + e is opened by SEAL's own Decryptor under s."""
    ctx, ring, enc = env
    sks, S = _parties(env, 1)
    a = T.common_poly(b"\x05" * 32, ring)[:2]
    x = np.linspace(-2, 2, 4096)
    c0 = T.to_ntt(_own(env, sks, S[0], [x], [a])[0], ring=ring, context=ctx, parms_id=ring.data_parms_id)
    raw = T.ciphertext_bytes(np.stack([c0, a]), ring=ring, parms_id=ring.data_parms_id, scale=SCALE)
    loaded = seal.Ciphertext()
    _load(loaded, raw, ctx)
    out = seal.Plaintext()
    seal.Decryptor(ctx, sks[0]).decrypt(loaded, out)
    assert np.max(np.abs(np.asarray(enc.decode_double(out)) - x)) < 1e-9
    other = T.common_poly(b"\x06" * 32, ring)[:2]  # under another a: noise, not x
    raw = T.ciphertext_bytes(np.stack([c0, other]), ring=ring, parms_id=ring.data_parms_id, scale=SCALE)
    _load(loaded, raw, ctx)
    seal.Decryptor(ctx, sks[0]).decrypt(loaded, out)
    assert np.max(np.abs(np.asarray(enc.decode_double(out)) - x)) > 1e3


def test_own_key_sum_opens_under_the_sum_of_the_key_shares(env):
    """Three parties, one common a: (sum c0_i, a) decrypts under s_1 + s_2 + s_3 with SEAL's noise
    only (|sum e_i| <= 3 * 19); without one party's share it is uniform."""
    ctx, ring, enc = env
    sks, S = _parties(env, 3)
    a = T.common_poly(b"\x08" * 32, ring)[:2]
    rng = np.random.default_rng(2)
    xs = [rng.normal(0, 1, 4096) for _ in range(3)]
    q = ring.q(2)
    c0 = [T.to_ntt(_own(env, sks, s, [x], [a])[0], ring=ring, context=ctx, parms_id=ring.data_parms_id)
          for s, x in zip(S, xs, strict=True)]
    shares = [T.decryption_share(c1=a, s=s, noise=np.zeros((2, ring.degree), np.uint64), ring=ring) for s in S]
    m = T.combine_decryption(c0=T.sum_polys(c0, q), shares=shares, ring=ring)
    noise = _noise_coeffs(env, m, xs)
    assert 0 < np.max(np.abs(noise)) <= 3 * 19
    partial = T.combine_decryption(c0=T.sum_polys(c0, q), shares=shares[:2], ring=ring)
    assert np.log2(np.max(np.abs(_signed(env, partial)))) > 100  # uniform mod q0*q1 (~2^120)


def test_rlwe_errors_have_seals_distribution(env):
    """SEAL's centred binomial of 2 x 21 bits: |e| <= 21, variance 10.5, the same integer in every
    limb; residues below each prime."""
    _, ring, _ = env
    e = T.rlwe_errors(8, ring=ring, limbs=2)
    assert e.shape == (8, 2, ring.degree) and np.all(e < ring.q(2).reshape(1, 2, 1))
    q = ring.q(2).astype(np.int64).reshape(1, 2, 1)
    both = e.astype(np.int64)
    both = np.where(both > q // 2, both - q, both)
    signed = both[:, 0, :].astype(np.float64).ravel()
    assert np.array_equal(both[:, 0, :], both[:, 1, :])  # the same integer error in each limb
    assert np.max(np.abs(signed)) <= 21 and abs(signed.mean()) < 0.1 and 10.1 < signed.var() < 10.9


def test_uniform_polys_are_seeded_distinct_and_below_every_prime(env):
    _, ring, _ = env
    u = T.uniform_polys(b"\x03" * 32, ring=ring, limbs=2, count=5)
    assert u.shape == (5, 2, ring.degree) and np.all(u < ring.q(2))
    assert np.array_equal(u, T.uniform_polys(b"\x03" * 32, ring=ring, limbs=2, count=5))
    assert not np.array_equal(u[0], u[1])
    assert abs(u[:, 0].astype(np.float64).mean() / ring.primes[0] - 0.5) < 5 / np.sqrt(12 * 5 * ring.degree)
