"""Array <-> bytes for the wire: little-endian, dtype and length checked on decode.

Only numpy is used here so that the server stays a lean install (no torch).
"""

from __future__ import annotations

import numpy as np

from .errors import ProtocolError

_ALLOWED = {"<f4": np.dtype("<f4"), "<f8": np.dtype("<f8"), "<u4": np.dtype("<u4"), "<u8": np.dtype("<u8")}


def encode_array(values: np.ndarray, dtype: str = "<f4") -> bytes:
    """Flatten ``values`` to little-endian bytes of ``dtype``."""
    if dtype not in _ALLOWED:
        raise ValueError(f"dtype {dtype!r} not allowed; use one of {sorted(_ALLOWED)}")
    return np.ascontiguousarray(values, dtype=_ALLOWED[dtype]).reshape(-1).tobytes()


def decode_array(data: bytes, *, dtype: str, length: int, what: str) -> np.ndarray:
    """Decode ``length`` scalars of ``dtype`` from ``data``; a wrong size is a ProtocolError."""
    dt = _ALLOWED.get(dtype)
    if dt is None:
        raise ProtocolError(f"{what}: dtype {dtype!r} is not allowed (expected one of {sorted(_ALLOWED)}).")
    if len(data) != length * dt.itemsize:
        raise ProtocolError(
            f"{what}: expected {length} values of {dtype} ({length * dt.itemsize} bytes), got {len(data)} bytes."
        )
    out = np.frombuffer(data, dtype=dt).copy()
    if out.dtype.kind == "f" and not np.all(np.isfinite(out)):
        raise ProtocolError(f"{what}: contains NaN or infinity.")
    return out
