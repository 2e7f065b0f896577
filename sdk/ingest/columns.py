"""Checks on a table's column labels and their resolution onto the feature dictionary.

A label is a header cell, which may be shown -- unless the "header" is really the first data
row (a CSV exported without a header). Then no label is shown at all: the table is reported as
having no header row.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

import pandas as pd

from clinograph.core.errors import SchemaError

from ..ontology.dictionary import Feature, FeatureDictionary, FeatureKind
from ..ontology.schema import ColumnMap, SiteSchema
from ..ontology.units import conversion, is_known_unit


def looks_like_data(label: object) -> bool:
    """A column label that is a number or empty: a data cell rather than a name."""
    text = str(label).strip()
    if not text:
        return True
    try:
        float(text.replace(",", "."))
    except ValueError:
        return False
    return True


def check_labels(df: pd.DataFrame, *, site: str, required: dict[str, str | None], known: set[str],
                 ignore_blank: bool = False) -> None:
    """Refuse MultiIndex, non-text and repeated column labels (all problems at once).
    ``ignore_blank``: the site schema ignores columns without a name (``ignore = [""]``), so empty
    header cells -- one or several, e.g. trailing delimiters -- are no problem here."""
    cols = df.columns
    title = f"Table for site {site!r} has unusable column labels"
    if isinstance(cols, pd.MultiIndex):
        raise SchemaError(f"The DataFrame has hierarchical (MultiIndex) column labels with {cols.nlevels} levels. "
                          "Flatten them to one text label per column, e.g. "
                          "df.columns = ['_'.join(map(str, c)) for c in df.columns].", title=title)
    problems = []
    positions = [i for i, c in enumerate(cols) if not isinstance(c, str)]
    if positions and len(positions) == len(cols):
        problems.append(f"All {len(cols)} column labels are not text (e.g. integers 0..{len(cols) - 1}): the table "
                        "was read without a header row. Read it with its header (pd.read_csv(..., header=0)) or "
                        "name the columns.")
    elif positions:
        shown = ", ".join(str(i + 1) for i in positions[:10])
        problems.append(f"Columns at positions {shown} have labels that are not text "
                        f"({', '.join(sorted({type(cols[i]).__name__ for i in positions}))}). Rename them.")
    counts = pd.Series([str(c) for c in cols]).value_counts()
    repeated = [str(c) for c, n in counts.items() if n > 1]
    blank = [i for i, c in enumerate(cols) if isinstance(c, str) and not c.strip()]
    if len(blank) > 1 and len(blank) < len(cols):  # several unnamed columns, not a header-less file
        if not ignore_blank:
            problems.append(empty_name_message(blank))
        repeated = [c for c in repeated if c.strip()]
    if repeated:
        if any(looks_like_data(c) for c in repeated) or header_is_data(cols, required=required, known=known):
            problems.append(f"{len(repeated)} column label(s) appear more than once and some look like data "
                            "values: the file seems to have no header row. Add a header row naming each column.")
        else:
            problems.append(f"Column labels {sorted(repeated)} appear more than once. Give every column a "
                            "distinct name.")
    if problems:
        raise SchemaError(problems, title=title)


def empty_name_message(positions: list[int]) -> str:
    """The problem for columns whose header cell is empty (0-based ``positions``)."""
    shown = ", ".join(str(i + 1) for i in positions[:10]) + (", ..." if len(positions) > 10 else "")
    return (f"{len(positions)} column(s) have no name: the header cell at position(s) {shown} is empty (often an "
            "index column a spreadsheet or pandas wrote, or a trailing delimiter). Name them and map them under "
            "[columns], delete them from the export, or leave them out with ignore = [\"\"] in the site schema "
            "(counted like every ignored column).")


def header_is_data(columns: Iterable[str], *, required: dict[str, str | None], known: set[str]) -> bool:
    """True if the header row looks like a data row: a required column is missing and some label is a
    number/empty, or no label at all is a known name."""
    cols = [str(c) for c in columns]
    missing = any(col is not None and col not in cols for col in required.values())
    return missing and (any(looks_like_data(c) for c in cols) or not (set(cols) & known))


def no_header_message(columns: list[str], required: dict[str, str | None]) -> str:
    """The one message for a table whose header row looks like data (no label is shown)."""
    named = " or ".join(f"the {role} column {col!r}" for role, col in required.items() if col is not None)
    n_data = sum(looks_like_data(c) for c in columns)
    return (f"The table seems to have no header row: its first row does not name {named}, and "
            f"{n_data} of its {len(columns)} fields look like numbers or are empty (not shown: they may be "
            "patient data). Add a header row naming each column, or set the column names in the site schema.")


def resolve(names: list[str], schema: SiteSchema, dictionary: FeatureDictionary
            ) -> tuple[dict[str, tuple[Feature, ColumnMap | None]], list[str]]:
    """(name -> (feature, its ColumnMap or None if matched by id/alias), unresolved names)."""
    mapped: dict[str, tuple[Feature, ColumnMap | None]] = {}
    unknown = []
    for name in names:
        if name in schema.columns:
            cm = schema.columns[name]
            if cm.feature in dictionary:
                mapped[name] = (dictionary.get(cm.feature), cm)
            continue  # schema.check_against reports the bad mapping
        feat = dictionary.resolve(name)
        if feat is not None:
            mapped[name] = (feat, None)
        else:
            unknown.append(name)
    return mapped, unknown


def one_column_per_feature(mapped: dict[str, tuple[Feature, ColumnMap | None]], problems: list[str]) -> None:
    """Two columns resolving to one feature (a mapped column plus an alias, ``hr`` plus ``HR``) is an error."""
    by_feature: dict[str, list[str]] = {}
    for col, (feat, _) in mapped.items():
        by_feature.setdefault(feat.id, []).append(col)
    for fid, cols in sorted(by_feature.items()):
        if len(cols) > 1 and not all(mapped[c][1] is not None for c in cols):  # all-mapped: check_against reports
            problems.append(f"Columns {sorted(cols)} all resolve to feature {fid!r} (by the site schema or a "
                            "dictionary id/alias). Keep exactly one: list the others under ignore.")


def _loose(name: str) -> str:
    return unicodedata.normalize("NFKC", name).strip().casefold()


def near_misses(columns: Iterable[object], declared: Iterable[str]) -> dict[str, str]:
    """Table columns that differ from a column the site schema names only by surrounding spaces or
    letter case or Unicode normalisation (``'temperature '`` for ``temperature``; ``Hämoglobin``
    with a combining umlaut, as macOS writes it), where the schema's spelling is absent.

    Such a column would otherwise be matched by a dictionary id or alias -- without the schema's
    unit or coding -- or reported as unknown beside a "missing column" problem that does not say why.
    """
    cols = [c for c in columns if isinstance(c, str)]
    present = set(cols)
    wanted: dict[str, str] = {}
    for name in declared:
        if name not in present:
            wanted.setdefault(_loose(name), name)
    out = {}  # column -> the problem
    for col in cols:
        target = wanted.get(_loose(col))
        if target is not None and target != col:
            out[col] = (f"Column {col!r} differs from {target!r}, which the site schema names, only by surrounding "
                        "spaces, letter case or Unicode normalisation. Rename the column in the table, or write the "
                        "name exactly as in the table in the site schema.")
    return out


#: a unit a column name gives: in brackets at its end (``Weight (kg)``, ``Glucose [mmol/L]``) or as
#: its last word after ``_`` or a space (``wt_lb``, ``Temp degC``)
_HEADER_UNIT = re.compile(r"(?:[(\[]\s*([^()\[\]]+?)\s*[)\]]|[_ ]([A-Za-z°µ%][\w°µ%/.\[\]]*))\s*$")


def header_unit(name: str) -> str | None:
    """The unit a column name gives (``'Weight (kg)'`` -> ``'kg'``), if it reads as a unit, else None."""
    m = _HEADER_UNIT.search(name)
    if m is None:
        return None
    unit = (m.group(1) or m.group(2)).strip()
    return unit if is_known_unit(unit) else None


def header_unit_problem(col: str, feat: Feature, cm: ColumnMap | None, *, what: str = "Column") -> str | None:
    """The problem of a numeric column whose name gives a unit other than the feature's canonical
    unit while the site schema declares none: its values would be read in the canonical unit
    (``Weight (kg)`` read as lb). A name's unit of another dimension (``KPS Pt``: a pint) is not
    a unit of this column and is passed over; a declared unit wins over the name."""
    if feat.kind != FeatureKind.NUMERIC or (cm is not None and cm.unit is not None):
        return None
    unit = header_unit(col)
    if unit is None:
        return None
    try:
        scale, offset = conversion(feature=feat.id, analyte=feat.analyte, source=unit, target=feat.unit,
                                   molar_mass=feat.molar_mass, valence=feat.valence)
    except SchemaError:  # another dimension: the name's last word is not this column's unit
        return None
    if (scale, offset) == (1.0, 0.0):
        return None
    return (f"{what} {col!r} ({feat.id}): its name gives the unit {unit!r}, but the site schema declares no unit "
            f"for it, so its values would be read in the dictionary's {feat.unit!r}. Declare the unit the values "
            f"are in: [columns.{col!r}] unit = {unit!r} (converted to {feat.unit!r}), or the right one if the "
            "name is wrong.")
