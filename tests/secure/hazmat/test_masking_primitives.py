"""Known answers and properties of the masking primitives (PRG, Shamir, fixed point, X25519)."""

from __future__ import annotations

import numpy as np
import pytest
from clinograph.secure.hazmat import fixedpoint
from clinograph.secure.hazmat.masking_prg import MASK_PRG, add_mask, expand_mask
from clinograph.secure.hazmat.shamir import combine_shares, split_secret
from clinograph.secure.hazmat.x25519 import agree, encode_context, generate_keypair
from hypothesis import given, settings
from hypothesis import strategies as st

from clinograph.core.labels import KDF_PAIRWISE_MASK, KDF_SELF_MASK

# AES-256 of the all-zero block under the all-zero key (the first counter block of the mask
# PRG, masking protocol masked/2): dc95c078 a2408989 ad48a214 92842087, read as little-endian
# uint32 words. The same value as an AES-256 ECB known answer, so the counter starts at 0.
AES256_ZERO_KEY_BLOCK0_WORDS = [0x78C095DC, 0x898940A2, 0x14A248AD, 0x87208492]


def test_mask_prg_known_answer_aes256_ctr():
    assert [int(w) for w in expand_mask(bytes(32), 4)] == AES256_ZERO_KEY_BLOCK0_WORDS
    assert MASK_PRG == "aes256-ctr"


def test_mask_prg_is_aes256_ctr_with_a_big_endian_counter_from_zero():
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    seed = bytes(range(32))
    blocks = b"".join(i.to_bytes(16, "big") for i in range(5))
    ecb = Cipher(algorithms.AES(seed), modes.ECB()).encryptor().update(blocks)  # noqa: S305 (reference only)
    assert expand_mask(seed, 20).tobytes() == ecb


def test_mask_prg_pinned_vector_for_a_nonzero_seed():
    # Pinned (regression): changing the PRG is a masking protocol version bump (MASK_PRG).
    assert [int(w) for w in expand_mask(bytes(range(32)), 4)] == [0xB60090F2, 0xD09F492A, 0x6A9AF3A9, 0x80772EDD]


def test_mask_prg_is_a_prefix_stream_and_seed_dependent():
    a = expand_mask(b"\x01" * 32, 1000)
    assert np.array_equal(expand_mask(b"\x01" * 32, 10), a[:10])
    assert not np.array_equal(expand_mask(b"\x02" * 32, 1000), a)
    assert 0.45 < a.mean() / 2**32 < 0.55  # roughly uniform over Z_2^32


@pytest.mark.parametrize("seed", [b"", b"\x00" * 16, b"\x00" * 31, b"\x00" * 33])
def test_mask_prg_needs_a_full_32_byte_seed(seed):
    with pytest.raises(ValueError, match="32 bytes"):
        expand_mask(seed, 4)


def test_add_mask_then_subtract_is_identity_mod_2_32():
    x = np.arange(100, dtype=np.uint32)
    y = x.copy()
    add_mask(y, b"\x05" * 32, sign=1)
    assert not np.array_equal(x, y)
    add_mask(y, b"\x05" * 32, sign=-1)
    assert np.array_equal(x, y)


@settings(max_examples=30, deadline=None)
@given(secret=st.binary(min_size=32, max_size=32), m=st.integers(2, 9), data=st.data())
def test_shamir_any_t_shares_rebuild_the_secret(secret, m, data):
    t = data.draw(st.integers(1, m))
    shares = split_secret(secret, threshold=t, n_shares=m)
    subset = data.draw(st.permutations(shares))[: data.draw(st.integers(t, m))]
    assert combine_shares(subset) == secret
    if t > 1:
        assert combine_shares(subset[: t - 1]) != secret  # fewer than t: a wrong secret, not the real one


def test_shamir_rejects_bad_input():
    with pytest.raises(ValueError, match="32 bytes"):
        split_secret(b"x" * 16, threshold=2, n_shares=3)
    with pytest.raises(ValueError, match="threshold"):
        split_secret(b"x" * 32, threshold=4, n_shares=3)
    shares = split_secret(b"x" * 32, threshold=2, n_shares=3)
    with pytest.raises(ValueError, match="distinct"):
        combine_shares([shares[0], shares[0]])


def test_x25519_agreement_is_symmetric_and_label_and_context_separated():
    a_sk, a_pk = generate_keypair()
    b_sk, b_pk = generate_keypair()
    ctx = encode_context(["fed", 1, "a", "b"])
    s_ab = agree(a_sk, b_pk, label=KDF_PAIRWISE_MASK, context=ctx)
    assert s_ab == agree(b_sk, a_pk, label=KDF_PAIRWISE_MASK, context=ctx) and len(s_ab) == 32
    assert s_ab != agree(a_sk, b_pk, label=KDF_SELF_MASK, context=ctx)
    assert s_ab != agree(a_sk, b_pk, label=KDF_PAIRWISE_MASK, context=encode_context(["fed", 2, "a", "b"]))


def test_context_encoding_is_unambiguous():
    assert encode_context(["ab", "c"]) != encode_context(["a", "bc"])


def test_x25519_refuses_a_low_order_peer_key():
    sk, _ = generate_keypair()
    with pytest.raises(ValueError):
        agree(sk, bytes(32), label=KDF_PAIRWISE_MASK, context=b"")


def test_check_public_refuses_low_order_points_and_accepts_real_keys():
    from clinograph.secure.hazmat.x25519 import check_public

    order8 = bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800")  # RFC 7748 s. 6.1 class
    for bad in (bytes(32), (1).to_bytes(32, "little"), order8):
        with pytest.raises(ValueError):
            check_public(bad)
    with pytest.raises(ValueError):
        check_public(bytes(31))
    for _ in range(5):
        check_public(generate_keypair()[1])  # no error


def test_check_public_refuses_exactly_what_an_agreement_refuses():
    """The table lookup against its definition (an X25519 agreement with a fixed key is all-zero,
    which OpenSSL refuses): every small-order u, its non-canonical forms (u + p < 2^255) and
    top-bit twins, the u around them, and fresh keys; the two must agree on every one."""
    from clinograph.secure.hazmat.x25519 import LOW_ORDER_U, check_public
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

    probe = X25519PrivateKey.generate()

    def by_agreement(raw: bytes) -> bool:
        try:
            probe.exchange(X25519PublicKey.from_public_bytes(raw))
        except ValueError:
            return False
        return True

    def by_table(raw: bytes) -> bool:
        try:
            check_public(raw)
        except ValueError:
            return False
        return True

    p = 2**255 - 19
    us = {d + u for u in LOW_ORDER_U for d in range(-3, 4)} | {p + u for u in range(19)} | set(range(300))
    raws = [(u & (2**256 - 1)).to_bytes(32, "little") for u in us if 0 <= u < 2**255]
    raws += [(u | 1 << 255).to_bytes(32, "little") for u in us if 0 <= u < 2**255]  # X25519 ignores the top bit
    raws += [generate_keypair()[1] for _ in range(20)]
    refused = [r for r in raws if not by_agreement(r)]
    assert len(refused) == 14  # 0, 1, p - 1, two of order 8, p, p + 1; each with and without the top bit
    assert [by_table(r) for r in raws] == [by_agreement(r) for r in raws]


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 10_000), bound=st.floats(1e-3, 1e6))
def test_fixed_point_scale_never_wraps_at_the_extremes(n, bound):
    scale = fixedpoint.scale_for(n_clients=n, bound=bound)
    assert fixedpoint.wrap_free(n_clients=n, bound=bound, scale=scale)
    assert not fixedpoint.wrap_free(n_clients=n, bound=bound, scale=scale * 1.01 + 1 / bound)
    for v in (bound, -bound):
        words, _ = fixedpoint.encode(np.array([v]), scale=scale, bound=bound, clip=False)
        total = np.array([(int(words[0]) * n) % 2**32], dtype=np.uint32)  # n clients all at the extreme
        got = fixedpoint.decode(total, scale=scale)[0]
        assert np.sign(got) == np.sign(v) and abs(got - n * v) <= n * 0.5 / scale + 1e-12 * n * abs(v)


def test_fixed_point_round_trip_error_is_half_a_step():
    scale = fixedpoint.scale_for(n_clients=10, bound=1.0)
    x = np.random.default_rng(0).uniform(-1, 1, 10_000)  # test data, not a secret
    words, n_clip = fixedpoint.encode(x, scale=scale, bound=1.0, clip=False)
    assert words.dtype == np.uint32 and n_clip == 0
    assert np.max(np.abs(fixedpoint.decode(words, scale=scale) - x)) <= 0.5 / scale + 1e-15


def test_fixed_point_out_of_range_is_an_error_or_a_counted_clip():
    scale = fixedpoint.scale_for(n_clients=4, bound=1.0)
    x = np.array([0.5, 1.5, -2.0, 1.0])
    with pytest.raises(ValueError, match=r"2 of 4 value\(s\) are outside \[-1.0, 1.0\]"):
        fixedpoint.encode(x, scale=scale, bound=1.0, clip=False)
    words, n_clip = fixedpoint.encode(x, scale=scale, bound=1.0, clip=True)
    assert n_clip == 2
    np.testing.assert_allclose(fixedpoint.decode(words, scale=scale), [0.5, 1.0, -1.0, 1.0], atol=1e-8)
    with pytest.raises(ValueError, match="NaN"):
        fixedpoint.encode(np.array([np.nan]), scale=scale, bound=1.0, clip=True)


def test_shamir_known_answer_and_field():
    from clinograph.secure.hazmat.shamir import PRIME, SHARE_BYTES

    assert PRIME == 2**256 + 297 and all(pow(a, PRIME - 1, PRIME) == 1 for a in (2, 3, 5, 7))  # Fermat witnesses
    s = int.from_bytes(b"\xff" * 32, "big")  # the largest secret is a field element
    shares = [(x, ((s + 5 * x + 7 * x * x) % PRIME).to_bytes(SHARE_BYTES, "big")) for x in (1, 2, 3)]
    assert combine_shares(shares) == b"\xff" * 32  # f(x) = s + 5x + 7x^2, eq. (1)
    with pytest.raises(ValueError, match="field element"):
        combine_shares([(1, (PRIME + 1).to_bytes(SHARE_BYTES, "big")), shares[1]])
    bad = [shares[0], (2, bytes(SHARE_BYTES)), shares[2]]
    try:  # a wrong share: a wrong secret or, if it leaves 2^256, a ValueError -- never the secret
        assert combine_shares(bad) != b"\xff" * 32
    except ValueError:
        pass


def test_chunked_masks_equal_one_keystream_for_mixed_parts():
    from clinograph.secure.hazmat.masking_prg import add_mask_parts

    seed = bytes(range(32))
    values, slots = np.zeros(1001, np.uint16), np.zeros(9, np.uint32)
    add_mask_parts([values, slots], seed, sign=1, chunk_bytes=64)
    stream = expand_mask(seed, 600).view(np.uint8)
    assert np.array_equal(values, stream[:2002].view("<u2"))
    assert np.array_equal(slots, stream[2002:2038].view("<u4"))
    add_mask_parts([values, slots], seed, sign=-1)  # another chunk size undoes it exactly
    assert not values.any() and not slots.any()
    with pytest.raises(ValueError, match="uint16 or uint32"):
        add_mask_parts([np.zeros(4, np.int64)], seed, sign=1)


@pytest.mark.parametrize("chunk", [64, 1 << 16])
def test_several_seeds_in_one_pass_equal_one_call_per_seed(chunk):
    """add_masks: chunks that span parts (every part 4-byte aligned) and chunks kept inside a
    part (an odd uint16 part) add each seed's one keystream, consecutive over the parts."""
    from clinograph.secure.hazmat.masking_prg import add_masks

    seeds = [(bytes([i]) * 32, sign) for i, sign in ((1, 1), (2, -1), (3, 1))]
    # three or more parts in a chunk: the keystreams are summed first, per run of one word width
    # (the two uint16 parts of the fourth layout are one run); the reverse call starts with a minus
    for layout in ([(np.uint32, 700), (np.uint32, 300), (np.uint16, 42), (np.uint32, 9)], [(np.uint32, 1)],
                   [(np.uint16, 1001), (np.uint32, 9)], [(np.uint16, 1000), (np.uint16, 500), (np.uint32, 9)],
                   [(np.uint32, 250)] * 4 + [(np.uint32, 8)]):
        got = [np.arange(n, dtype=dt) for dt, n in layout]
        want = [a.copy() for a in got]
        add_masks(got, seeds, chunk_bytes=chunk)
        for seed, sign in seeds:  # the keystream runs on over the parts' bytes, in order
            stream, pos = expand_mask(seed, sum(a.nbytes for a in want) // 4 + 1).view(np.uint8), 0
            for a in want:
                mask = stream[pos:pos + a.nbytes].view("<u2" if a.dtype == np.uint16 else "<u4")
                (np.add if sign > 0 else np.subtract)(a, mask, out=a)
                pos += a.nbytes
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
        add_masks(got, [(s, -sign) for s, sign in seeds])
        assert all(np.array_equal(g, np.arange(n, dtype=dt)) for g, (dt, n) in zip(got, layout, strict=True))
    with pytest.raises(ValueError, match="seed must be 32 bytes"):
        add_masks(got, [(bytes(32), 1), (b"short", 1)])
    assert all(np.array_equal(g, np.arange(n, dtype=dt)) for g, (dt, n) in zip(got, layout, strict=True))  # untouched


def test_shamir_coefficients_are_randbelow_rejection_sampling_on_one_urandom_draw(monkeypatch):
    """A split's random coefficients: 257-bit candidates (33 bytes, top 257 bits), each kept iff
    below PRIME and drawn again otherwise (secrets.randbelow's method), read from one os.urandom
    call for all of them and from a further call only when too many were refused."""
    from clinograph.secure.hazmat import shamir
    from clinograph.secure.hazmat.shamir import PRIME, SHARE_BYTES

    def cand(v: int) -> bytes:  # the 33 bytes whose top 257 bits read as v
        return (v << 7).to_bytes(SHARE_BYTES, "big")

    pools = [cand(2**257 - 1) + cand(PRIME) + cand(PRIME - 1) + cand(5), cand(PRIME + 1) + cand(PRIME), cand(0) + cand(7)]
    asked = []

    def urandom(n):
        asked.append(n)
        return pools.pop(0)

    monkeypatch.setattr(shamir.os, "urandom", urandom)
    assert shamir._field_elements(2) == [PRIME - 1, 5]  # 2^257 - 1 and PRIME refused
    assert asked == [4 * SHARE_BYTES]
    assert shamir._field_elements(1) == [0] and asked[1:] == [2 * SHARE_BYTES, 2 * SHARE_BYTES]  # both refused: redrawn
