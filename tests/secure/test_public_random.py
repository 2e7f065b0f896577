"""Public randomness: a stream fixed by its definition, uniform enough, never reused across labels."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from clinograph.secure.public_random import public_index, public_uniforms

DOMAIN = b"clinograph/test/public"


def test_stream_is_shake256_of_domain_seed_label():
    raw = hashlib.shake_256(DOMAIN + b"\x00" + b"5:x").digest(24)
    words = [int.from_bytes(raw[i:i + 8], "big") >> 11 for i in range(0, 24, 8)]
    assert public_uniforms(DOMAIN, 5, label="x", n=3).tolist() == [w * 2.0 ** -53 for w in words]


def test_labels_seeds_and_domains_give_different_streams():
    a = public_uniforms(DOMAIN, 1, label="x", n=64)
    for other in (public_uniforms(DOMAIN, 2, label="x", n=64), public_uniforms(DOMAIN, 1, label="y", n=64),
                  public_uniforms(DOMAIN + b"2", 1, label="x", n=64)):
        assert not np.array_equal(a, other)


def test_public_index_is_in_range_and_roughly_uniform():
    draws = np.array([public_index(DOMAIN, s, label="t", k=3) for s in range(3000)])
    assert draws.min() == 0 and draws.max() == 2
    counts = np.bincount(draws, minlength=3)
    assert np.all(np.abs(counts - 1000) < 120), counts  # ~3.8 sd: a broken map (all 0) fails
    assert public_index(DOMAIN, 0, label="t", k=1) == 0


def test_public_index_refuses_an_empty_choice():
    with pytest.raises(ValueError):
        public_index(DOMAIN, 0, label="t", k=0)
