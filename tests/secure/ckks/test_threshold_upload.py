"""The ``ckks_threshold`` mode's compact upload: own-key c0 only, decryption exact to the stated
precision, bad parts refused."""

from __future__ import annotations

import os

import numpy as np
import pytest
from clinograph.secure.ckks import threshold_upload as U
from clinograph.secure.ckks.threshold import CollectivePublicKey, ThresholdParty, ThresholdPreset
from clinograph.secure.ckks.threshold_reshare import in_process_reshare
from clinograph.secure.ckks.threshold_sum import SumCombiner, round_polys, sum_share

from clinograph.core.errors import ProtocolError

PRESET = ThresholdPreset.THRESHOLD_128
NAMES = ("a", "b", "c", "d")


@pytest.fixture(scope="module")
def fed():
    parties = {n: ThresholdParty(preset=PRESET, federation_id="f", name=n) for n in NAMES}
    seed = os.urandom(32)
    public = CollectivePublicKey(preset=PRESET, federation_id="f", seed=seed,
                                 shares={n: p.keygen_share(seed=seed) for n, p in parties.items()})
    in_process_reshare(parties, public, threshold=3)
    return parties, public


def test_compact_upload_decrypts_to_the_sum_with_the_stated_error(fed):
    """13 bytes a slot (c0 only); the sum's slot error has standard deviation
    2^-22 * sqrt(holders/3 + contributors/12): the smudging of the 3 holders asked plus c0's
    rounding (8 bits dropped) for each of the 4 contributors."""
    parties, public = fed
    rng = np.random.default_rng(5)
    values = [rng.normal(0, 1, 4096) for _ in NAMES]
    a = round_polys(public=public, round=0, commitments_sha256="ab" * 32, count=1)
    ups = [U.encode(parties[n], public, v, a) for n, v in zip(NAMES, values, strict=True)]
    assert len(ups[0]) == 1 and len(ups[0][0]) == 8192 * 52 // 8  # 13 bytes a slot
    comb = SumCombiner(public=public, round=0, commitments_sha256="ab" * 32, members=NAMES,
                       c0=U.aggregate(public, [U.read_c0(public, u, n) for n, u in zip(NAMES, ups, strict=True)]),
                       canary_seed=os.urandom(32), present=("a", "b", "c"))
    shares = {n: sum_share(parties[n], public=public, request=comb.request, members=NAMES, a=a) for n in comb.present}
    err = comb.combine(shares, length=4096) - sum(values)
    want = 2.0 ** -22 * np.sqrt(3 / 3 + 4 / 12)
    assert 0.9 * want < err.std() < 1.1 * want and np.max(np.abs(err)) < 6 * want


def test_bad_parts_are_refused(fed):
    parties, public = fed
    a = round_polys(public=public, round=0, commitments_sha256="cd" * 32, count=2)
    with pytest.raises(ProtocolError, match="1 common polynomials for 2 ciphertexts"):
        U.encode(parties["a"], public, np.zeros(5000), a[:1])
    c0s = U.encode(parties["a"], public, np.zeros(5000), a)
    with pytest.raises(ProtocolError, match="c0 part of x"):
        U.read_c0(public, [c0s[0] + b"\0"], "x")
    with pytest.raises(ProtocolError, match="different numbers of ciphertexts"):
        U.aggregate(public, [U.read_c0(public, c0s, "x"), U.read_c0(public, c0s[:1], "y")])
