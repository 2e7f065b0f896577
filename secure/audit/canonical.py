"""Canonical JSON and the PHI guard for audit payloads.

Every audit line is the canonical JSON of its fields: keys sorted, no whitespace, ASCII only,
no NaN/Infinity. The verifier re-serialises what it parsed and demands the same bytes, so a
change to any byte of a line -- even one that keeps the JSON meaning -- is detected, and the
hashes cover exactly the bytes on disk.

:func:`to_plain` is the PHI guard at the door of the log: payloads must be plain JSON data
(``None``, ``bool``, ``int``, finite ``float``, ``str``, lists and string-keyed mappings).
Arrays, tensors, DataFrames, bytes and arbitrary objects are refused with the path that held
them, so a bulk of patient-derived numbers cannot slip into the log by accident; publish such
data as an artefact with :meth:`AuditTrail.publish` instead, on purpose.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping
from typing import Any

from clinograph.core.errors import IntegrityError

MAX_PAYLOAD_BYTES = 1024 * 1024
MAX_DEPTH = 32


def canonical_json(obj: Any) -> bytes:
    """The one byte form of ``obj``: sorted keys, no spaces, ASCII, no NaN (ValueError)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


def _finite_float(text: str) -> float:
    """A JSON number as a float, refused when it overflows (``1e999`` reads as inf, which no
    canonical line holds: canonical JSON has no non-finite numbers)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("a number out of float range")
    return value


def parse_canonical(line: bytes, *, what: str) -> dict[str, Any]:
    """Parse ``line`` and raise :class:`IntegrityError` unless it is canonical JSON of an object."""
    try:
        obj = json.loads(line.decode("ascii"), object_pairs_hook=_reject_duplicates,
                         parse_constant=_reject_constant, parse_float=_finite_float)
    except (UnicodeDecodeError, ValueError) as exc:
        raise IntegrityError(f"{what} is not valid canonical JSON ({type(exc).__name__}: "
                             f"{str(exc)[:120]}).") from None
    except RecursionError:  # the C decoder's own bound, reached long before any stack is at risk
        raise IntegrityError(f"{what} nests JSON arrays or objects too deeply to parse; entries Clinograph "
                             f"writes nest at most {MAX_DEPTH} levels. The line was not written by Clinograph "
                             "(the log was altered): restore the audit directory from its source.") from None
    if not isinstance(obj, dict):
        raise IntegrityError(f"{what} is JSON but not an object.")
    if canonical_json(obj) != line:
        raise IntegrityError(f"{what} is not in canonical form (bytes were changed, reordered or "
                             "re-spaced after it was written).")
    return obj


def b64_strict(text: Any, *, size: int, what: str) -> bytes:
    """Decode standard base64 that must re-encode to the same text and be ``size`` bytes."""
    if not isinstance(text, str):
        raise IntegrityError(f"{what} must be a base64 string.")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise IntegrityError(f"{what} is not valid base64.") from None
    if len(raw) != size or base64.b64encode(raw).decode("ascii") != text:
        raise IntegrityError(f"{what} is not the canonical base64 of {size} bytes.")
    return raw


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    name = type(value).__name__
    return f"{name} with shape {tuple(shape)}" if shape is not None else name


def to_plain(value: Any, *, path: str = "payload", depth: int = 0) -> Any:
    """Copy ``value`` into plain JSON data, refusing anything that is not (the PHI guard).

    Raises:
        TypeError: naming the path and type of the first refused value and the fix.
        ValueError: for non-finite floats, non-string keys or nesting deeper than 32.
    """
    if depth > MAX_DEPTH:
        raise ValueError(f"{path}: nesting deeper than {MAX_DEPTH} levels.")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):  # includes numpy.float64, a float subclass
        if not math.isfinite(value):
            raise ValueError(f"{path}: non-finite float {value!r} cannot be audited; record None (null) for a "
                             "value that is not defined.")
        return float(value)
    if isinstance(value, Mapping) and not hasattr(value, "shape"):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{path}: key {key!r} is a {type(key).__name__}; audit keys must be str.")
            out[key] = to_plain(item, path=f"{path}.{key}", depth=depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [to_plain(item, path=f"{path}[{i}]", depth=depth + 1) for i, item in enumerate(value)]
    raise TypeError(
        f"{path}: a {_describe(value)} cannot go into the audit log (only plain JSON data: "
        "str, int, float, bool, None, lists and str-keyed dicts). Arrays, tensors, DataFrames "
        "and bytes are refused so patient-derived data cannot leak into the log; publish "
        "data on purpose with AuditTrail.publish(name, data, kind=...)."
    )


def plain_payload(payload: Any) -> dict[str, Any]:
    """:func:`to_plain` for a whole payload: a mapping, at most 1 MiB as canonical JSON."""
    if not isinstance(payload, Mapping) or hasattr(payload, "shape"):
        raise TypeError(f"An audit payload must be a mapping, got {_describe(payload)}.")
    plain = to_plain(payload)
    size = len(canonical_json(plain))
    if size > MAX_PAYLOAD_BYTES:
        raise ValueError(f"Audit payload of {size} bytes exceeds {MAX_PAYLOAD_BYTES} bytes; "
                         "publish bulky data as an artefact and record its hash.")
    return plain
