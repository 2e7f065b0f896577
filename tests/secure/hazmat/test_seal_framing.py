"""secure/hazmat/ckks_context.py: bytes whose SEAL header or zstd frame does not add up are refused
before SEAL reads them. SEAL 4's zstd reader *aborts the process* (std::terminate, an uncaught
std::ios_base::failure) on some such inputs: a hospital's ciphertext with bytes inserted or removed
inside its zstd frame, size field rewritten or not, killed the server (fuzzed: 1 in ~40 of such
mutants of an add_only_128 ciphertext; 0 of 3 500 that pass this check, three presets)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from clinograph.secure.ckks import CkksPreset
from clinograph.secure.hazmat import ckks_context
from clinograph.secure.hazmat.ckks_context import CkksEvaluator, CkksSecretContext


@pytest.fixture(scope="module")
def pair():
    params = CkksPreset.ADD_ONLY_128.params
    ctx = CkksSecretContext.generate(params)
    return CkksEvaluator(params, ctx.parms_bytes), ctx.encrypt(np.ones(4))[0]


def _resized(b: bytearray) -> bytes:
    b[8:16] = struct.pack("<Q", len(b))
    return bytes(b)


def _cases(ct: bytes) -> dict[str, bytes]:
    mid = len(ct) // 2
    return {
        "17 bytes removed inside the frame, size rewritten": _resized(bytearray(ct[:mid] + ct[mid + 17:])),
        "44 bytes inserted inside the frame, size kept": ct[:mid] + bytes(44) + ct[mid:],
        "44 bytes inserted inside the frame, size rewritten": _resized(bytearray(ct[:mid] + bytes(44) + ct[mid:])),
        "bytes after the frame": _resized(bytearray(ct + bytes(8))),
        "compression mode 1 (zlib)": ct[:5] + b"\x01" + ct[6:],
        "not SEAL": b"\x00" * 64,
    }


@pytest.mark.parametrize("case", list(_cases(b"\x00" * 200)))
def test_a_ciphertext_whose_framing_does_not_add_up_never_reaches_seal(pair, case, monkeypatch):
    ev, ct = pair
    data = _cases(ct)[case]

    def seal_must_not_read(*a, **k):
        raise AssertionError("SEAL was handed bytes whose framing does not add up")

    monkeypatch.setattr(ckks_context, "_seal_load", seal_must_not_read)
    with pytest.raises(ValueError, match="SEAL header|zstd frame|compression mode|SEAL's serialisation"):
        ev.load_ciphertext(data)


def test_a_well_formed_ciphertext_still_loads(pair):
    ev, ct = pair
    assert ev.load_ciphertext(ct).size() == 2
