"""The masked mode in the audit report's words: what the server learns and the round's parameters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def describe(options: Mapping[str, Any], kinds: Mapping[str, Sequence[Mapping[str, Any]]]) -> tuple[
        str, list[tuple[str, object]]]:
    """(paragraph, rows) from the latest signed plan's ``options``."""
    rows: list[tuple[str, object]] = [
        ("pairwise-mask neighbours k", options.get("masked.neighbours", "?")),
        ("reconstruction threshold t (Shamir)", options.get("masked.threshold", "?")),
        ("clip (per-value bound of an update)", options.get("masked.clip", "?")),
        ("word bits", options.get("masked.word_bits", 32 if options else "?")),
        ("maximum weight", options.get("masked.max_weight", "?")),
        ("out-of-range values", options.get("masked.out_of_range", "?")),
        ("minimum hospitals a round", options.get("min_clients", "?"))]
    return ("Masked secure aggregation: each hospital adds pairwise masks with k neighbours that cancel in the sum; "
            "the masks of a hospital that drops are recovered from t of its neighbours' Shamir shares. The server "
            "sees only the sum."), rows
