"""The uint64 words of a SEAL object, read from SEAL's own serialisation. Hazmat; only
:mod:`.seal_polys` imports it.

``sealapi`` gives element access only (one Python call a word, ~0.12 us: 4 ms for one
ciphertext of N = 8192 at two primes). SEAL's ``save`` is one C++ call, and the words sit at
the end of what it writes: a 16-byte SEAL header, then the object's members, whose last member
is a ``DynArray`` (its own 16-byte header, a uint64 count, the words). The members are
compressed with the compression SEAL was built with (zstd in TenSEAL's wheels); zstd stores
data it cannot shrink -- uniform residues mod 60-bit primes -- as *raw* blocks, verbatim.
So :func:`object_words` reads the words straight out of SEAL's bytes when the members are
stored uncompressed (mode NONE) or in zstd raw / RLE blocks, and returns ``None`` otherwise
(any zstd block that is really compressed, zlib, an unknown header): the caller then falls
back to element access. It checks the SEAL magic, the frame structure, the word count and the
total length, so a misread is an error or a fallback, never wrong words.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from .ckks_context import dump

_SEAL_MAGIC = 0xA15E
_ZSTD_MAGIC = 0xFD2FB528
_NONE, _ZSTD = 0, 2


def _zstd_stored(frame: bytes) -> bytes | None:
    """The content of a zstd frame made of raw and RLE blocks only; None for anything else."""
    if len(frame) < 6 or struct.unpack_from("<I", frame)[0] != _ZSTD_MAGIC:
        return None
    fhd = frame[4]
    fcs_flag, single, checksum, dict_flag = fhd >> 6, (fhd >> 5) & 1, (fhd >> 2) & 1, fhd & 3
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag] + ((1 if single else 0), 2, 4, 8)[fcs_flag]
    out = []
    while True:
        if pos + 3 > len(frame):
            return None
        head = int.from_bytes(frame[pos:pos + 3], "little")
        last, kind, size = head & 1, (head >> 1) & 3, head >> 3
        pos += 3
        if kind == 0:  # raw: stored verbatim
            if pos + size > len(frame):
                return None
            out.append(frame[pos:pos + size])
            pos += size
        elif kind == 1:  # RLE: one byte, size times
            if pos + 1 > len(frame):
                return None
            out.append(frame[pos:pos + 1] * size)
            pos += 1
        else:  # compressed (or reserved): not read here
            return None
        if last:
            break
    return b"".join(out) if pos + 4 * checksum == len(frame) else None


def object_words(obj: Any, count: int) -> np.ndarray | None:
    """The last ``count`` uint64 words SEAL saves for ``obj`` (its data), or None if SEAL's bytes
    are compressed in a way this reader does not undo (then use element access)."""
    raw = dump(obj)
    if len(raw) < 16:
        return None
    magic, header_size, _major, _minor, compr, _reserved, size = struct.unpack_from("<HBBBBHQ", raw)
    if magic != _SEAL_MAGIC or header_size != 16 or size != len(raw):
        return None
    members = raw[16:] if compr == _NONE else _zstd_stored(raw[16:]) if compr == _ZSTD else None
    if members is None or len(members) < 8 * count + 8:
        return None
    if struct.unpack_from("<Q", members, len(members) - 8 * count - 8)[0] != count:
        return None
    return np.frombuffer(members, dtype="<u8", count=count, offset=len(members) - 8 * count).astype(np.uint64)
