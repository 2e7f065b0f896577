"""The fast read of SEAL's words from its own serialisation, against element access."""

from __future__ import annotations

import numpy as np
import pytest
import tenseal.sealapi as seal
from clinograph.secure.hazmat import seal_words as W
from clinograph.secure.hazmat import threshold_ckks as T
from clinograph.secure.hazmat.ckks_context import CkksParams, _load, build_context, dump


@pytest.fixture(scope="module")
def fresh():
    ctx, _ = build_context(CkksParams(8192, (60, 60, 60), 96))
    pk = seal.PublicKey()
    seal.KeyGenerator(ctx).create_public_key(pk)
    pt, ct = seal.Plaintext(), seal.Ciphertext()
    seal.CKKSEncoder(ctx).encode([0.5] * 100, 2.0 ** 96, pt)
    seal.Encryptor(ctx, pk).encrypt(pt, ct)
    return ctx, T.Ring.of(ctx), pt, ct


def _elementwise(obj, n):
    return np.fromiter(map(obj.__getitem__, range(n)), dtype=np.uint64, count=n)


def test_ciphertext_and_plaintext_words_come_from_the_stored_bytes(fresh):
    _, _, pt, ct = fresh
    n = ct.size() * ct.coeff_modulus_size() * ct.poly_modulus_degree()
    fast = W.object_words(ct, n)
    assert fast is not None  # uniform residues: zstd stored them raw
    assert np.array_equal(fast, _elementwise(ct, n))
    assert np.array_equal(T.read_ciphertext(ct, polys=1).ravel(), _elementwise(ct, n // 2))
    assert np.array_equal(T.read_plaintext(pt, 2, 8192).ravel(), _elementwise(pt, pt.coeff_count()))


def test_compressed_or_damaged_bytes_fall_back_to_element_access(fresh):
    ctx, ring, _, ct = fresh
    c = T.read_ciphertext(ct)
    twice = seal.Ciphertext()  # the same polynomial twice: zstd compresses the repeat
    _load(twice, T.ciphertext_bytes(np.stack([c[0], c[0]]), ring=ring, parms_id=ring.data_parms_id,
                                                 scale=1.0), ctx)
    assert W.object_words(twice, c[0].size * 2) is None
    assert np.array_equal(T.read_ciphertext(twice)[1], c[0])  # the fallback reads it right
    raw = dump(ct)
    frame = raw[16:]
    assert W._zstd_stored(frame) is not None
    assert W._zstd_stored(frame[:-1]) is None  # truncated
    assert W._zstd_stored(b"\x00" + frame[1:]) is None  # not a zstd frame
    assert W.object_words(ct, c.size + 1) is None  # the word count does not match


def test_ntt_of_many_polynomials_equals_one_at_a_time(fresh):
    """17 polynomials: one full SEAL ciphertext of 16 and one of a single polynomial (paired)."""
    ctx, ring, _, _ = fresh
    polys = [T.common_poly(bytes([i]) * 32, ring)[:2] for i in range(17)]
    many = T.to_ntt_many(polys, ring=ring, context=ctx, parms_id=ring.data_parms_id)
    assert len(many) == 17
    for i in (0, 15, 16):
        assert np.array_equal(many[i], T.to_ntt(polys[i], ring=ring, context=ctx, parms_id=ring.data_parms_id))
    assert np.array_equal(T.to_coefficients(many[16], ring=ring, context=ctx, parms_id=ring.data_parms_id), polys[16])
