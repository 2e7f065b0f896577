"""Canary machinery: plant unique markers in patient records, then prove none leaked.

Usage in an integration test::

    from canary import plant, plant_into_frame, scan

    canary = plant()                                   # fresh, unguessable markers
    table = plant_into_frame(table, canary, id_column="patient_id", value_columns=["sodium"])
    ... run the federation, capturing logs and every message ...
    findings = scan(canary, blobs={"logs": log_bytes, **messages}, directories=[run_dir])
    assert not findings, describe(findings)

A marker is found if it appears, in any blob or in any file under the directories, as:

* text: UTF-8 (and UTF-16-LE) of the marker string, or the decimal ``repr`` of a marker
  float as float64 and as float32 (``repr(float(np.float32(x)))`` and numpy's shortest
  float32 repr);
* raw numbers: the float32 and float64 little-endian bytes of a marker float;
* base64 (standard and URL-safe alphabets, any alignment) of any of the byte forms above --
  how bytes travel in the wire messages' JSON.

False positives: a float32 marker is 4 bytes (30 stable bits in base64), so a blob of N
random bytes matches by chance with probability about 3N / 2**30 per marker (N = 10 MB:
~3 %); float64 and string markers are 8 or more bytes and practically never match by chance.
Markers are drawn from ``secrets`` so no code under test can predict them.
"""

from __future__ import annotations

import base64
import secrets
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Canary:
    """The planted markers: strings (e.g. patient ids) and floats (e.g. lab values)."""

    strings: tuple[str, ...]
    floats: tuple[float, ...]


@dataclass(frozen=True)
class Finding:
    """Where a marker was found."""

    where: str
    offset: int
    marker: str
    encoding: str


def plant(*, n_strings: int = 4, n_floats: int = 4, low: float = 1000.0, high: float = 9000.0) -> Canary:
    """Fresh markers: strings ``CANARY-<20 hex>``; floats in [low, high) (pick a range the
    column's validation accepts, e.g. 60-120 for a heart rate) with 6 random decimals, exact
    in float32 (their float64 value is the float32 value, as in a float32 table)."""
    strings = tuple(f"CANARY-{secrets.token_hex(10)}" for _ in range(n_strings))
    floats: list[float] = []
    span = int((high - low) * 10**6)
    while len(floats) < n_floats:
        x32 = float(np.float32(low + secrets.randbelow(span) / 10**6))
        if len(str(np.float32(x32))) >= 7 and x32 not in floats and low <= x32 < high:
            floats.append(x32)
    return Canary(strings=strings, floats=tuple(floats))


def _b64_stable(pattern: bytes) -> list[bytes]:
    """Base64 substrings that must appear wherever ``pattern`` is encoded, at each alignment."""
    out = []
    for k in range(3):
        encoded = base64.b64encode(b"\x00" * k + pattern + b"\x00\x00")
        first = -(-8 * k // 6)  # first char whose bits all come from the pattern
        last = (8 * (k + len(pattern))) // 6  # one past the last such char
        if last - first >= 4:
            out.append(encoded[first:last])
    return out


def patterns(canary: Canary) -> dict[bytes, tuple[str, str]]:
    """Every byte pattern to look for -> (marker, encoding)."""
    forms: dict[bytes, tuple[str, str]] = {}
    for s in canary.strings:
        forms[s.encode()] = (s, "utf-8")
        forms[s.encode("utf-16-le")] = (s, "utf-16-le")
    for x in canary.floats:
        name = repr(x)
        forms[struct.pack("<d", x)] = (name, "float64-le")
        forms[struct.pack("<f", x)] = (name, "float32-le")
        for text in {repr(x), repr(float(np.float32(x))), str(np.float32(x)), np.format_float_positional(np.float32(x))}:
            forms[text.encode()] = (name, f"decimal {text}")
    for raw, (marker, enc) in list(forms.items()):
        for stable in _b64_stable(raw):
            forms[stable] = (marker, f"base64({enc})")
            forms[stable.translate(bytes.maketrans(b"+/", b"-_"))] = (marker, f"base64url({enc})")
    return forms


def _search(blob: bytes, where: str, forms: Mapping[bytes, tuple[str, str]]) -> list[Finding]:
    found = []
    for pattern, (marker, enc) in forms.items():
        at = blob.find(pattern)
        if at >= 0:
            found.append(Finding(where=where, offset=at, marker=marker, encoding=enc))
    return found


def scan(canary: Canary, *, blobs: Mapping[str, bytes] | Iterable[bytes] = (),
         directories: Iterable[Path] = ()) -> list[Finding]:
    """All places any marker appears, in any encoding above. Empty list = no leak found."""
    forms = patterns(canary)
    items = blobs.items() if isinstance(blobs, Mapping) else ((f"blob[{i}]", b) for i, b in enumerate(blobs))
    findings = []
    for where, blob in items:
        findings += _search(bytes(blob), where, forms)
    for root in directories:
        for path in sorted(Path(root).rglob("*")):
            if path.is_file():
                findings += _search(path.read_bytes(), str(path), forms)
    return findings


def describe(findings: list[Finding]) -> str:
    """Human text for an assertion message."""
    return "\n".join(f"{f.marker} as {f.encoding} in {f.where} at byte {f.offset}" for f in findings)


def plant_into_frame(frame: Any, canary: Canary, *, id_column: str, value_columns: list[str]) -> Any:
    """A copy of a pandas DataFrame with the first rows' ids set to the string markers and the
    first rows' values in ``value_columns`` set to the float markers (cycled)."""
    out = frame.copy()
    for i, marker in enumerate(canary.strings[: len(out)]):
        out.iloc[i, out.columns.get_loc(id_column)] = marker
    for i, x in enumerate(canary.floats[: len(out)]):
        col = value_columns[i % len(value_columns)]
        out.iloc[i, out.columns.get_loc(col)] = x
    return out
