"""Parsing one column's cells into canonical floats (NaN = missing), with every problem reported.

Messages name the column, the feature, data-row numbers and the fix -- never a cell value. The
one exception is the *codes* of a binary or categorical column, which are categories, not
patient values: they are shown only as :func:`clinograph.sdk.ontology.codes.describe_codes`
allows (seen in two or more rows, at most 20 characters, at most 10 of them).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from clinograph.core.errors import SchemaError

from ..ontology.codes import describe_codes, normalise_code, shown_codes
from ..ontology.dictionary import TRANSFORM_DOMAIN, Feature, FeatureKind, transform_domain
from ..ontology.units import conversion
from .dialect import decimal_comma_cells
from .rows import rows_text

_UNIT_IN_CELL = re.compile(r"^\s*[-+]?\d+(?:[.,]\d+)?\s*[A-Za-z/%°µμ][\w/%°µμ.]*\s*$")
#: what a binary *feature* column is read as without a declared coding. Y/N is not among them: a
#: single letter is not self-explaining (N: no, nein, normal, negative), so it must be declared
#: (docs/quickstart.md, "Codings").
BINARY_DEFAULT = {"1": 1.0, "true": 1.0, "yes": 1.0, "0": 0.0, "false": 0.0, "no": 0.0}
DEFAULT_CODES_TEXT = "0/1, true/false, yes/no"
#: what a *label* column is read as without ``label_codes``: the feature default and Y/N (the
#: label is the outcome: Y = it happened)
LABEL_DEFAULT = {**BINARY_DEFAULT, "y": 1.0, "n": 0.0}
LABEL_CODES_TEXT = "0/1, true/false, yes/no, Y/N"
MAX_MAGNITUDE = 1e15  # for a feature the dictionary gives no physical limit


_GROUPED = re.compile(r"^\s*[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?\s*$")  # 1,234 / 12,345,678.5
_SPACE_GROUPED = re.compile(r"^\s*[-+]?\d{1,3}(?:[ \u00a0\u202f]\d{3})+(?:[.,]\d+)?\s*$")  # French: 1 234,5
_CENSORED = re.compile(r"^\s*(?:(?:[<>≤≥]=?|=<|=>)\s*[-+]?\d+(?:[.,]\d+)?\s*\S*|\d+(?:[.,]\d+)?\s*\+)\s*$")  # '90+' too
_DATE = re.compile(r"^\s*(?:\d{4}-\d{1,2}-\d{1,2}|\d{1,2}[./]\d{1,2}[./]\d{2,4})(?:[ T]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?"
                   r"(?:Z|[+-]\d{2}:?\d{2})?)?\s*$")
#: spellings of "no value" that pandas does not read as missing (compared case-insensitively)
MISSING_MARKERS = frozenset({"-", "--", "---", ".", "..", "?", "??", "n.a.", "n.a", "na.", "n/d", "n.d.", "nd",
                             "missing", "unknown", "unk", "not done", "none", "nil", "#value!", "#div/0!", "#ref!",
                             "#num!", "#name?"})
TEXT_KINDS = {
    "censored": "values beyond a detection limit (written like '<5' or '>200', or a top-coded age like '>89' or "
                "'90+'), which are not numbers. Decide what "
                "they mean for the model (the limit itself, or missing), write that number, or leave them empty.",
    "marker": "missing-value markers (like '-', '.', '?', 'n.a.' or a spreadsheet error such as '#VALUE!') that are "
              "not read as missing. Leave those cells empty (or write NA), or declare the export's markers in the site "
              "schema: [policy] missing_values = [\"-\", \"?\"].",
    "formula": "spreadsheet formulas (a cell starting with '=', like Excel's =\"90\") instead of values. Export "
               "the values, not the formulas.",
    "date": "dates or times where a number is expected. A date is not a feature value: list the column under "
            "ignore, or derive a number from it (an age, hours since admission) before ingestion.",
    "text": "text where a number is expected. Clean these cells or leave them empty for missing.",
}


def classify_text(text: pd.Series, bad: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """The non-empty (kind, mask) classes of the ``bad`` cells of ``text`` (kinds of :data:`TEXT_KINDS`)."""
    t = text.astype(str)
    censored = bad & t.str.match(_CENSORED).to_numpy(dtype=bool)
    marker = bad & ~censored & t.str.strip().str.casefold().isin(MISSING_MARKERS).to_numpy(dtype=bool)
    date = bad & ~censored & ~marker & t.str.match(_DATE).to_numpy(dtype=bool)
    formula = bad & ~censored & ~marker & ~date & t.str.strip().str.startswith("=").to_numpy(dtype=bool)
    rest = bad & ~censored & ~marker & ~date & ~formula
    return [(k, m) for k, m in (("censored", censored), ("marker", marker), ("formula", formula), ("date", date),
                                ("text", rest)) if m.any()]


def date_cells(raw: pd.Series) -> np.ndarray:
    """True where a cell is a date or datetime (ISO ``2024-03-01 10:00``, ``01.03.2024``, a Timestamp)."""
    return as_text(raw).str.match(_DATE).to_numpy(dtype=bool)


def _missing(x: object) -> bool:
    try:
        return bool(pd.isna(x))
    except (TypeError, ValueError):  # array-like cell
        return False


def as_text(raw: pd.Series) -> pd.Series:
    """Cells as text ("" for missing), whatever the column's dtype."""
    try:
        miss = raw.isna().to_numpy(dtype=bool)  # vectorised: one pd.isna a cell took most of ingest's time
    except (TypeError, ValueError):  # pragma: no cover - exotic extension dtypes
        miss = np.array([_missing(x) for x in raw], dtype=bool)
    if pd.api.types.is_numeric_dtype(raw.dtype) and not isinstance(raw.dtype, pd.CategoricalDtype):
        text = raw.astype(str).to_numpy(dtype=object)  # same as str() of each number
    else:
        text = np.array([str(x) for x in raw], dtype=object)
    text[miss] = ""
    return pd.Series(text, index=raw.index, dtype=object)


def present_mask(raw: pd.Series) -> np.ndarray:
    """True where a cell holds something (not NaN/None, not empty or whitespace)."""
    return (as_text(raw).str.strip() != "").to_numpy(dtype=bool)


def _code_counts(raw: pd.Series, mask: np.ndarray) -> dict[str, int]:
    counts = as_text(raw[mask]).str.strip().value_counts()
    return {str(k): int(v) for k, v in counts.items()}


def _codes_seen(raw: pd.Series, bad: np.ndarray) -> str:
    return describe_codes(_code_counts(raw, bad))


def binary_coding_fix(key: str, feat: Feature, codes: list[str]) -> str:
    """The fix for an undeclared binary coding, in the column's own codes and the feature's meaning.

    It never proposes which code is 1: ``{ "F" = 0, "M" = 1 }`` pasted under a ``sex_female``
    column would invert it. The template holds ``?`` where the user decides (so it is not valid
    TOML until they do), except for Y/N, where the code's own meaning is stated as a condition.
    ``codes``: the column's codes an error may show (:func:`~clinograph.sdk.ontology.codes.shown_codes`).
    """
    meaning = f"{feat.id!r} ({feat.name})"
    head = f"Declare which code means {meaning} is true (1) and which false (0) in the site schema"
    if {normalise_code(c) for c in codes} == {"y", "n"}:
        y, n = sorted(codes, key=lambda c: normalise_code(c) != "y")[:2]
        return (f"Y/N is not read without a coding (a single letter is not self-explaining: N may be no, nein, "
                f"normal or negative). If {y!r} means {meaning} is true, declare [columns.{key!r}] coding = "
                f"{{ \"{y}\" = 1, \"{n}\" = 0 }}; if it means the opposite, swap 1 and 0.")
    if 1 <= len(codes) <= 4:
        template = ", ".join(f"\"{c}\" = ?" for c in codes)
        return (f"{head}: [columns.{key!r}] coding = {{ {template} }}, each ? replaced by 1 if that code means "
                f"{meaning}, else 0. Clinograph does not guess: the wrong choice inverts the feature.")
    return (f"{head}: [columns.{key!r}] coding = {{ \"<code meaning {feat.id}>\" = 1, \"<code meaning not "
            f"{feat.id}>\" = 0 }}, with the column's own codes.")


def undecided_codes_fix(key: str, meaning: str, codes: list[str]) -> str | None:
    """The fix for a 0/1 column (label, event) holding other codes, over *all* the column's shown
    ``codes`` with ``?`` where the user decides -- None unless 2 to 4 of them. Codes 1/2 are R's
    survival convention (1 censored or alive, 2 the event): there '1' is not a positive, so the
    template asks about it too instead of showing only the codes that were refused."""
    if not 2 <= len(codes) <= 4:
        return None
    template = ", ".join(f"\"{c}\" = ?" for c in sorted(codes))
    r = (" (R's survival data use 1 = censored or alive and 2 = the event, so there \"1\" = 0)"
         if {normalise_code(c) for c in codes} == {"1", "2"} else "")
    return (f"Declare what each code means in the site schema: {key} = {{ {template} }}, each ? replaced by 1 if "
            f"that code means {meaning}, else 0{r}. Clinograph does not guess: the wrong choice inverts the outcome.")


def _numeric(col: str, raw: pd.Series, present: np.ndarray, feat: Feature, unit: str | None,
             problems: list[str], key: str, at: np.ndarray | None) -> np.ndarray:
    where = f"Column {col!r} ({feat.id})"
    text = as_text(raw).str.strip()
    if pd.api.types.is_float_dtype(raw.dtype) or pd.api.types.is_integer_dtype(raw.dtype):
        # numbers as they are: pandas' text parser is not correctly rounded (1 ulp off on 17-digit reprs)
        num = np.where(present, raw.to_numpy(dtype=float, na_value=np.nan), np.nan)
    else:
        num = pd.to_numeric(text.where(present, ""), errors="coerce").to_numpy(dtype=float)
    bad = present & np.isnan(num)
    if bad.any():
        unit_like = bad & text.str.match(_UNIT_IN_CELL).to_numpy() & ~text.str.match(_DATE).to_numpy(dtype=bool)
        if unit_like.any():
            problems.append(f"{where}: {rows_text(unit_like, at)}: number with a unit string in the cell. Put the unit "
                            f"in the site schema ([columns].{key!r}.unit) and keep only numbers in the column.")
        grouped = bad & ~unit_like & text.str.match(_GROUPED).to_numpy(dtype=bool)
        if grouped.any():
            problems.append(f"{where}: {rows_text(grouped, at)}: numbers with a comma that reads both as a thousands "
                            "separator ('1,234' = 1234) and as a decimal comma (1.234), so they are not read. Export "
                            "the numbers without thousands separators; if the commas are decimal commas, declare "
                            "decimal = \",\" in the site schema (read_table(..., decimal=\",\"); check --decimal ,).")
        spaced = bad & ~unit_like & ~grouped & text.str.match(_SPACE_GROUPED).to_numpy(dtype=bool)
        if spaced.any():
            problems.append(f"{where}: {rows_text(spaced, at)}: numbers with spaces between digit groups (a thousands "
                            "separator, as French Excel writes '1 234'). Export the numbers without thousands "
                            "separators.")
        grouped |= spaced
        comma = bad & ~unit_like & ~grouped & decimal_comma_cells(text)
        if comma.any():
            problems.append(f"{where}: {rows_text(comma, at)}: numbers written with a decimal comma. Declare decimal = "
                            "\",\" in the site schema (read_table(..., decimal=\",\"); check --decimal ,) for "
                            "German/French Excel exports, or export it with decimal points.")
        rest = bad & ~unit_like & ~grouped & ~comma
        for kind, mask in classify_text(text, rest):
            problems.append(f"{where}: {rows_text(mask, at)}: {TEXT_KINDS[kind]}")
    inf = present & np.isinf(num)
    if inf.any():
        problems.append(f"{where}: {rows_text(inf, at)}: infinite value. Replace with a value or leave empty.")
    scale, offset = 1.0, 0.0
    if unit is not None:
        try:
            scale, offset = conversion(feature=feat.id, analyte=feat.analyte, source=unit, target=feat.unit,
                                       molar_mass=feat.molar_mass, valence=feat.valence)
        except SchemaError as exc:
            problems.extend(f"Column {col!r}: {p}" for p in exc.problems)
    with np.errstate(over="ignore", invalid="ignore"):
        vals = num * scale + offset
    finite_in = present & np.isfinite(num)
    overflow = finite_in & ~np.isfinite(vals)
    if overflow.any():
        problems.append(f"{where}: {rows_text(overflow, at)}: the value overflows when converted to {feat.unit}. "
                        "Check the unit in the site schema or correct the values.")
    ok = finite_in & np.isfinite(vals)
    huge = ok & (((vals > MAX_MAGNITUDE) & (feat.physical_max is None))
                 | ((vals < -MAX_MAGNITUDE) & (feat.physical_min is None)))
    if huge.any():
        problems.append(f"{where}: {rows_text(huge, at)}: magnitude above {MAX_MAGNITUDE:g} after conversion to "
                        f"{feat.unit}, and the dictionary sets no physical limit on that side for {feat.id!r}. "
                        "Correct the values, or set physical_min/physical_max for the feature in the dictionary.")
        ok &= ~huge
    lo = feat.physical_min if feat.physical_min is not None else -np.inf
    hi = feat.physical_max if feat.physical_max is not None else np.inf
    impossible = ok & ((vals < lo) | (vals > hi))
    if impossible.any():
        problems.append(f"{where}: {rows_text(impossible, at)}: physically impossible value after conversion to "
                        f"{feat.unit} (allowed {lo:g} to {hi:g}). Check the unit in the site schema or correct "
                        "the values.")
    ok &= ~impossible
    outside = ok & ~transform_domain(feat.transform, vals)
    if outside.any():
        problems.append(f"{where}: {rows_text(outside, at)}: outside the domain of transform = "
                        f"{feat.transform.value!r} declared for {feat.id!r} in the dictionary (needs values "
                        f"{TRANSFORM_DOMAIN[feat.transform]} in {feat.unit}). Correct the values or leave them empty "
                        "for missing; for labs with zeros use transform = \"log1p\".")
        ok &= ~outside
    std = feat.standardise_array(np.where(ok, vals, np.nan))
    unstandardisable = ok & ~np.isfinite(std)
    if unstandardisable.any():
        problems.append(f"{where}: {rows_text(unstandardisable, at)}: the value cannot be standardised with the "
                        f"reference range of {feat.id!r} (the result is not finite). Correct the values.")
        ok &= ~unstandardisable
    out = np.full(len(raw), np.nan)
    out[ok] = vals[ok]
    return out


def _coded(col: str, raw: pd.Series, present: np.ndarray, feat: Feature, coding: dict[str, float] | None,
           problems: list[str], key: str, at: np.ndarray | None) -> np.ndarray:
    where = f"Column {col!r} ({feat.id})"
    norm = as_text(raw).map(normalise_code)
    if coding is not None:
        table = coding
    elif feat.kind == FeatureKind.BINARY:
        table = BINARY_DEFAULT
    else:
        table = {normalise_code(lvl): float(i) for i, lvl in enumerate(feat.levels)}
    codes = norm.map(table).to_numpy(dtype=float)
    bad = present & np.isnan(codes)
    if bad.any():
        seen = _codes_seen(raw, bad)
        if coding is not None:
            problems.append(f"{where}: {rows_text(bad, at)}: codes not in the coding declared for this column "
                            f"(seen: {seen}). Add them to [columns].{key!r}.coding, or leave the cells empty.")
        elif feat.kind == FeatureKind.BINARY:
            problems.append(f"{where}: {rows_text(bad, at)}: codes that are not a declared binary coding (seen: {seen}); "
                            f"without a coding only {DEFAULT_CODES_TEXT} are read. " + binary_coding_fix(
                                key, feat, shown_codes(_code_counts(raw, present))))
        else:
            problems.append(f"{where}: {rows_text(bad, at)}: codes that are not levels {list(feat.levels)} of the "
                            f"dictionary (seen: {seen}). Declare a level map in the site schema, e.g. "
                            f"[columns.{key!r}] coding = {{ \"1\" = {feat.levels[0]!r} }}.")
    out = np.full(len(raw), np.nan)
    good = present & ~np.isnan(codes)
    out[good] = codes[good]
    return out


def parse_cells(col: str, raw: pd.Series, feat: Feature, unit: str | None, problems: list[str], *,
                coding: dict[str, float] | None = None, key: str | None = None,
                rows: np.ndarray | None = None) -> np.ndarray:
    """Parse one column into canonical-unit floats (NaN = missing); append problems.

    Binary cells become 0/1, categorical cells the level index. ``coding`` is the column's
    declared coding (normalised code -> value); ``key`` the column's name in the site schema;
    ``rows`` the table's 0-based row of each cell when ``raw`` is some of its rows (messages name
    table rows), None when ``raw`` is a whole column.
    """
    raw = raw.reset_index(drop=True)
    present = present_mask(raw)
    key = col if key is None else key
    before = len(problems)
    if feat.kind == FeatureKind.NUMERIC:
        out = _numeric(col, raw, present, feat, unit, problems, key, rows)
    else:
        out = _coded(col, raw, present, feat, coding, problems, key, rows)
    if present.sum() == 0 or (np.isnan(out).all() and len(problems) == before):  # else its cells' problems say why
        problems.append(f"Column {col!r} ({feat.id}) has no usable value at all. Remove it from [columns] or list it "
                        "under ignore.")
    return out


def parse_labels(raw: pd.Series, col: str, problems: list[str], *,
                 codes: dict[str, int] | None = None) -> np.ndarray:
    """Labels as 1/0, NaN for missing, -1 for a bad (reported) cell.

    ``codes``: the site schema's ``label_codes`` (local code -> 1/0, e.g. ``{"dead": 1, "alive": 0}``),
    read instead of the default :data:`LABEL_CODES_TEXT`.
    """
    raw = raw.reset_index(drop=True)
    text = as_text(raw).str.strip()
    present = present_mask(raw) & (text.str.lower() != "nan").to_numpy()
    table = LABEL_DEFAULT if codes is None else {normalise_code(k): float(v) for k, v in codes.items()}
    values = as_text(raw).map(normalise_code).map(table).to_numpy(dtype=float)
    bad = present & np.isnan(values)
    if bad.any():
        seen = _codes_seen(raw, bad)
        if codes is None:
            fix = undecided_codes_fix("label_codes", "the outcome happened", shown_codes(_code_counts(raw, present)))
            problems.append(f"Label column {col!r}: {rows_text(bad)}: not binary (expected {LABEL_CODES_TEXT}; seen: "
                            f"{seen}). " + (fix or "Declare the label's coding in the site schema, e.g. label_codes "
                                            "= { \"dead\" = 1, \"alive\" = 0 }, or fix the cells."))
        else:
            problems.append(f"Label column {col!r}: {rows_text(bad)}: codes not in the site schema's label_codes "
                            f"(seen: {seen}). Add them to label_codes, or fix the cells.")
    out = np.full(len(raw), np.nan)
    out[present & ~bad] = values[present & ~bad]
    out[bad] = -1.0  # reported above; not also counted as missing
    return out
