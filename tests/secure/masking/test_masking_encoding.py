"""The masked vector's encoding shortcuts give the bytes of the plain definitions: one buffer
copied once (to_words), values cast straight into the ring (eq. (1) / params.py eq. (2)), and a
keystream generated into a reused buffer (add_mask_parts)."""

from __future__ import annotations

import numpy as np
import pytest
from clinograph.secure.hazmat.masking_prg import add_mask_parts, expand_mask
from clinograph.secure.masking import MaskingParams
from clinograph.secure.masking.stages import Layout, encode_update, from_words, to_words
from masking_helpers import make_plan, make_updates


def _plain_words(parts):
    return b"".join(p.astype(p.dtype.newbyteorder("<")).tobytes() for p in parts)


@pytest.mark.parametrize("bits", [32, 16])
def test_one_buffer_words_equal_the_per_part_definition(bits):
    plan = make_plan(5, threshold=3, word_bits=bits)
    params, layout = MaskingParams.from_plan(plan), Layout.of(plan)
    upd = make_updates(plan, seed=3, scale=0.3)["hosp01"]
    parts = encode_update(upd, layout=layout, params=params)
    add_mask_parts(parts, bytes(range(32)), sign=1)
    words = to_words(parts)
    assert words == _plain_words(parts)
    assert to_words([p.copy() for p in parts]) == words  # separate arrays take the join path
    swapped = parts[::-1]  # views of the one buffer, not back to back in this order: the join path too
    assert swapped[0].base is swapped[1].base and to_words(swapped) == _plain_words(swapped) != words
    back = from_words(words, layout=layout, params=params, sender="hosp01")
    assert all(np.array_equal(a, b) for a, b in zip(back, parts, strict=True))
    # eq. (1)/(2): q = rint(x * scale), two's complement, for every trained module
    values = parts[0].copy()
    add_mask_parts([values, parts[1].copy()], bytes(range(32)), sign=-1)
    signed = values.view(np.int16 if bits == 16 else np.int32)
    for name, off, size in zip(layout.names, layout.offsets, layout.sizes, strict=True):
        want = np.rint(np.asarray(upd.modules[name], np.float64).reshape(-1) * params.scale) \
            if name in upd.modules else np.zeros(size)
        assert np.array_equal(signed[off:off + size], want.astype(signed.dtype))


def test_reused_keystream_buffer_matches_one_expansion_for_any_chunk():
    seed = b"\x07" * 32
    want = expand_mask(seed, 3001)
    for chunk in (4, 12, 1 << 20):
        acc = np.zeros(3001, np.uint32)
        add_mask_parts([acc], seed, sign=1, chunk_bytes=chunk)
        assert np.array_equal(acc, want)
