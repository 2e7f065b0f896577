"""The ``ckks_threshold`` mode's compact upload: decryption exact to the stated precision, bad parts refused."""

from __future__ import annotations

import os

import numpy as np
import pytest
from clinograph.secure.ckks import threshold_upload as U
from clinograph.secure.ckks.threshold import (
    CollectivePublicKey,
    Combiner,
    ThresholdParty,
    ThresholdPreset,
)
from clinograph.secure.hazmat import ckks_compact as C

from clinograph.core.errors import ProtocolError

PRESET = ThresholdPreset.THRESHOLD_128


@pytest.fixture(scope="module")
def fed():
    parties = {n: ThresholdParty(preset=PRESET, federation_id="f", name=n) for n in ("a", "b", "c")}
    seed = os.urandom(32)
    public = CollectivePublicKey(preset=PRESET, federation_id="f", seed=seed,
                                 shares={n: p.keygen_share(seed=seed) for n, p in parties.items()})
    return parties, public


def test_compact_upload_decrypts_to_the_sum_with_the_stated_error(fed):
    """43 bytes a slot; the aggregate's slot error has standard deviation
    2^-22 * sqrt(holders/3 + contributors/12): the smudging plus c0's rounding (8 bits dropped)."""
    parties, public = fed
    rng = np.random.default_rng(5)
    values = [rng.normal(0, 1, 4096) for _ in range(4)]
    ups = [U.encode(public, v) for v in values]
    assert [len(ups[0][0][0]), len(ups[0][1][0])] == [8192 * 52 // 8, 2 * 8192 * 60 // 8]  # 43 bytes a slot
    c1 = U.sum_c1(public, [U.read_c1(public, c1s, f"h{i}") for i, (_, c1s) in enumerate(ups)])
    agg = U.aggregate(public, c0=[U.read_c0(public, c0s, f"h{i}") for i, (c0s, _) in enumerate(ups)], c1_sums=c1)
    comb = Combiner(public=public, round=0, aggregate=agg, contributions=4, canary_seed=os.urandom(32))
    err = comb.combine({n: p.decryption_share(comb.request) for n, p in parties.items()}, length=4096) - sum(values)
    want = 2.0 ** -22 * np.sqrt(3 / 3 + 4 / 12)
    assert 0.9 * want < err.std() < 1.1 * want and np.max(np.abs(err)) < 6 * want


def test_bad_parts_are_refused(fed):
    _, public = fed
    c0s, c1s = U.encode(public, np.zeros(10))
    q0 = public._c.ring.primes[0]
    words = C.unpack_words(c1s[0], 60, 2 * 8192)
    words[5] = q0  # a residue not below its prime
    with pytest.raises(ProtocolError, match="c1 part 0 of x has a residue outside"):
        U.read_c1(public, [C.pack_words(words, 60)], "x")
    with pytest.raises(ProtocolError, match="c1 part 0 of x: .*expected 122880"):
        U.read_c1(public, [c1s[0][:-1]], "x")
    with pytest.raises(ProtocolError, match="c0 part of x"):
        U.read_c0(public, [c0s[0] + b"\0"], "x")
    with pytest.raises(ProtocolError, match="different numbers of ciphertexts"):
        U.sum_c1(public, [U.read_c1(public, c1s, "x"), U.read_c1(public, c1s + c1s, "y")])
