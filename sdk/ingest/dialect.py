"""CSV dialects: the field delimiter and the decimal separator, declared or detected.

Spreadsheets export CSV in their locale: German, French or Dutch Excel writes semicolons
between fields and decimal commas (``72,5``). :func:`detect_delimiter` picks the candidate
(``,`` ``;`` tab ``|``) that splits the first lines into the same number (> 1) of fields;
:func:`detect_decimal` reads decimal commas when the delimiter is not a comma and the numbers
of the file are written only with commas. A declared delimiter or decimal separator is used
as given; when the file looks like another dialect, :func:`dialect_hint` says which, without
quoting a cell.
"""

from __future__ import annotations

import csv
import io
import re

import numpy as np
import pandas as pd

from .rows import rows_text

DELIMITERS = (",", ";", "\t", "|")
DECIMALS = (".", ",")
_NAMES = {",": "comma", ";": "semicolon", "\t": "tab", "|": "pipe"}
_COMMA_NUMBER = re.compile(r"^\s*[-+]?(?:\d{1,3}(?:\.\d{3})+|\d+),\d+(?:[eE][-+]?\d+)?\s*$")
_DOT_NUMBER = re.compile(r"^\s*[-+]?\d*\.\d+(?:[eE][-+]?\d+)?\s*$")
#: '1.150': a decimal point, or a decimal-comma locale's thousands separator (1150)
_DOT_GROUPED = re.compile(r"^\s*[-+]?[1-9]\d{0,2}(?:\.\d{3})+\s*$")
#: '1,175': a decimal comma, or a thousands comma (1175)
_COMMA_GROUPED = re.compile(r"^\s*[-+]?[1-9]\d{0,2}(?:,\d{3})+\s*$")
#: thousands separators that cannot be the decimal one, by the file's decimal separator: both in the
#: usual order ('1,234.5' in a decimal-point file; '1.234,5' is :data:`_COMMA_NUMBER`), or two groups
#: or more ('1,234,567', '1.234.567': a number has one decimal separator). '1,175' and '1.150' stay
#: ambiguous (refused by ingestion, with the fix)
_THOUSANDS = {".": re.compile(r"^\s*[-+]?[1-9]\d{0,2}(?:(?:,\d{3})+\.\d+|(?:,\d{3}){2,})\s*$"),
              ",": re.compile(r"^\s*[-+]?[1-9]\d{0,2}(?:\.\d{3}){2,}\s*$")}
_SAMPLE_LINES = 20


def name(delimiter: str) -> str:
    """``';'`` -> ``"semicolon"`` (for messages)."""
    return _NAMES.get(delimiter, repr(delimiter))


def _field_counts(lines: list[str], delimiter: str) -> list[int]:
    try:
        return [len(r) for r in csv.reader(io.StringIO("\n".join(lines)), delimiter=delimiter) if r]
    except csv.Error:
        return []


def _consistent(lines: list[str]) -> list[str]:
    """Delimiters that split every sampled line into the same number (> 1) of fields."""
    out = []
    for d in DELIMITERS:
        counts = _field_counts(lines, d)
        if counts and counts[0] > 1 and len(set(counts)) == 1:
            out.append(d)
    return out


def sample(text: str) -> list[str]:
    """The first non-blank lines of a CSV text (header first)."""
    return [ln for ln in text.splitlines()[: _SAMPLE_LINES * 3] if ln.strip()][:_SAMPLE_LINES]


def detect_delimiter(text: str) -> str:
    """The delimiter that splits the first lines consistently; else the header rule.

    The header rule (no consistent candidate, e.g. ragged rows): a comma if the header holds
    one, else the one other candidate it holds, else a comma.
    """
    lines = sample(text)
    if not lines:
        return ","
    good = _consistent(lines)
    if len(good) == 1:
        return good[0]
    if good:  # several split consistently: the one giving the most fields
        return max(good, key=lambda d: (_field_counts(lines[:1], d)[0], d == ","))
    header = lines[0]
    if "," in header:
        return ","
    found = [d for d in DELIMITERS[1:] if d in header]
    return found[0] if len(found) == 1 else ","


def dialect_hint(text: str, used: str) -> str:
    """A sentence naming the dialect the file looks like, if not the one ``used``; else ``""``."""
    lines = sample(text)
    good = [d for d in _consistent(lines) if d != used]
    if not good or used in _consistent(lines):
        return ""
    d = good[0]
    locale = " (as German or French Excel writes it)" if d == ";" else ""
    return (f" The file looks {name(d)}-separated{locale}, not {name(used)}-separated: declare "
            f"delimiter = {d!r} in the site schema (read_table(..., delimiter={d!r}); check --delimiter), or leave "
            "the delimiter unset to detect it.")


def detect_decimal(df: pd.DataFrame) -> str:
    """``","`` if the table's numbers are written only with decimal commas, else ``"."``.

    A number like ``1,175`` (three digits after one comma) is 1175 with a thousands comma as
    often as 1.175: alone it does not make a file decimal-comma (a ``;`` file of whole numbers
    with ``1,175`` kcal read 1.175). Its cells are then refused as ambiguous by ingestion, unless
    a decimal comma elsewhere (``72,5``) or the site schema's ``decimal`` settles the file."""
    commas = dots = 0
    for i in range(df.shape[1]):  # by position: labels may repeat (reported later by ingest)
        cells = df.iloc[:, i].dropna().astype(str)
        commas += int((cells.str.match(_COMMA_NUMBER) & ~cells.str.match(_COMMA_GROUPED)).sum())
        commas += int(cells.str.match(_THOUSANDS[","]).sum())  # '1.234.567': points group, so commas are decimal
        dots += int((cells.str.match(_DOT_NUMBER) & ~cells.str.match(_DOT_GROUPED)).sum())  # '1.150': either
        dots += int(cells.str.match(_THOUSANDS["."]).sum())  # '1,234.5', '1,234,567'
    return "," if commas and not dots else "."


def apply_decimal_comma(df: pd.DataFrame) -> pd.DataFrame:
    """Numbers written with a decimal comma (``72,5``, ``1.234,5``) rewritten with a point.

    Only cells that are wholly such a number change; codes and text stay as they are. Cells
    like ``1.150`` -- 1150 with the locale's thousands point, or 1.15 with a decimal point --
    are left as they are and their data-row indices (0-based) recorded by column name in
    ``attrs["point_grouped"]``, for ingestion to refuse them. Several point groups (``1.234.567``)
    cannot hold a decimal point: :func:`apply_thousands` reads them.
    """
    out = apply_thousands(df, ",")
    grouped: dict[str, tuple[int, ...]] = {}
    for i in range(out.shape[1]):
        cells = out.iloc[:, i]
        hit = cells.notna().to_numpy() & cells.astype(str).str.match(_DOT_GROUPED).to_numpy(dtype=bool)
        if hit.any():
            key = str(out.columns[i])
            grouped[key] = tuple(sorted({*grouped.get(key, ()), *np.flatnonzero(hit).tolist()}))
    out.attrs["point_grouped"] = grouped
    for i in range(out.shape[1]):  # by position: labels may repeat (reported later by ingest)
        cells = out.iloc[:, i]
        text = cells.astype(str)
        hit = cells.notna().to_numpy() & text.str.match(_COMMA_NUMBER).to_numpy()
        if hit.any():
            fixed = text.str.strip().str.replace(".", "", regex=False).str.replace(",", ".", regex=False)
            out.iloc[:, i] = cells.astype(object).where(~hit, fixed)
    return out


def apply_thousands(df: pd.DataFrame, decimal: str) -> pd.DataFrame:
    """Numbers whose thousands separators cannot be the decimal one (:data:`_THOUSANDS`: ``1,234.5``
    and ``1,234,567`` when ``decimal`` is ``"."``; ``1.234.567`` when it is ``","``) without them.

    Only cells that are wholly such a number change; a copy is returned.
    """
    out = df.copy()
    pattern, separator = _THOUSANDS[decimal], "," if decimal == "." else "."
    for i in range(out.shape[1]):  # by position: labels may repeat (reported later by ingest)
        cells = out.iloc[:, i]
        text = cells.astype(str)
        hit = cells.notna().to_numpy() & text.str.match(pattern).to_numpy(dtype=bool)
        if hit.any():
            out.iloc[:, i] = cells.astype(object).where(~hit, text.str.strip().str.replace(separator, "", regex=False))
    return out


def point_grouped_cells(df: pd.DataFrame, col: str) -> np.ndarray:
    """True at the cells of ``col`` that a decimal-comma table holds like '1.150' (1150 or 1.15),
    as :func:`apply_decimal_comma` recorded them (``df.attrs["point_grouped"]``)."""
    out = np.zeros(len(df), dtype=bool)
    rows = [r for r in df.attrs.get("point_grouped", {}).get(str(col), ()) if r < len(df)]
    out[rows] = True
    return out


def point_grouped_problem(where: str, mask: np.ndarray) -> str:
    """The problem of the cells ``mask`` of a column of a decimal-comma table (``attrs["point_grouped"]``)."""
    return (f"{where}: {rows_text(mask)}: numbers with a point that reads both as a thousands separator (in a "
            "decimal-comma file '1.234' is 1234) and as a decimal point (1.234), so they are not read. Export the "
            "numbers without thousands separators, or write them with a decimal comma ('1234' or '1,234').")


def decimal_comma_cells(text: pd.Series) -> np.ndarray:
    """True where a cell is a number written with a decimal comma."""
    return text.astype(str).str.match(_COMMA_NUMBER).to_numpy(dtype=bool)
