"""Ingestion: a hospital's DataFrame/CSV/Parquet -> a validated :class:`PatientTable`.

Every problem of a table is reported at once, naming the column and row numbers (1-based data
rows) and the fix -- never a cell value or a patient identifier (binary/categorical *codes*
excepted, as :mod:`.cells` limits them). Nothing is changed silently: what an explicit policy
drops is counted in the :class:`IngestReport`; everything else that does not fit is an error.
In a long table, feature codes and units are named only if they belong to the dictionary's or
the unit vocabulary; other codes are counted, not shown.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from difflib import get_close_matches

import numpy as np
import pandas as pd

from clinograph.core.errors import SchemaError

from ..ontology.dictionary import FeatureDictionary, FeatureKind
from ..ontology.schema import SiteSchema, coding_problems
from ..ontology.units import EXAMPLE_UNITS, conversion, is_known_unit, normalise_unit, same_unit
from .cells import as_text, date_cells, parse_cells, parse_labels, present_mask
from .columns import (
    check_labels,
    empty_name_message,
    header_is_data,
    header_unit_problem,
    near_misses,
    no_header_message,
    one_column_per_feature,
    resolve,
)
from .dialect import point_grouped_cells, point_grouped_problem
from .plausibility import far_from_reference
from .read import read_table
from .rows import rows_text
from .survival import survival_input, with_survival
from .table import IngestReport, PatientTable

__all__ = ["ingest", "read_table"]
# whitespace, control characters and invisible format characters (zero-width space/joiners, BOM, bidi marks)
#: ids of a spreadsheet's summary rows (English, German, French, Dutch, Spanish), compared case-insensitively
SUMMARY_IDS = frozenset({"total", "totals", "grand total", "sum", "subtotal", "mean", "average", "avg", "median",
                         "overall", "summe", "gesamt", "gesamtsumme", "mittelwert", "durchschnitt", "somme", "moyenne",
                         "totaal", "gemiddelde", "suma", "media", "promedio"})
#: unmapped columns named one problem each (with the nearest dictionary entries); the rest in one problem
SHOWN_UNKNOWN = 10
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SPACE = re.compile(r"[\s\x00-\x1f\x7f\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]+")


def ingest(df: pd.DataFrame, *, schema: SiteSchema, dictionary: FeatureDictionary) -> PatientTable:
    """Validate ``df`` against ``schema`` and ``dictionary`` and build a PatientTable.

    Raises:
        SchemaError: with every problem of the table listed.
    """
    if not isinstance(df, pd.DataFrame):
        raise SchemaError(f"ingest() needs a pandas DataFrame, got {type(df).__name__}. Read the file with "
                          "read_table() first.", title="Table is not a DataFrame")
    for name, value, kind, fix in (("schema", schema, SiteSchema, "cg.SiteSchema.from_toml('site.toml')"),
                                   ("dictionary", dictionary, FeatureDictionary,
                                    "cg.FeatureDictionary.from_toml('dictionary.toml')")):
        if not isinstance(value, kind):
            raise SchemaError(f"ingest() needs {name}= a {kind.__name__}, got {type(value).__name__}. Pass {fix}.",
                              title=f"The {name} argument is not a {kind.__name__}")
    df = declared_missing(df, schema)
    if schema.survival is not None:  # time-to-event label: time + event columns (sdk/ingest/survival.py)
        try:
            prepared = survival_input(df, schema=schema)
        except SchemaError as exc:
            raise _with_feature_problems(exc, df, schema, dictionary) from None
        return with_survival(ingest(prepared.frame, schema=prepared.schema, dictionary=dictionary), prepared)
    problems: list[str] = []
    try:
        schema.check_against(dictionary)
    except SchemaError as exc:  # units are checked below, with the dictionary's molar masses
        problems.extend(p for p in exc.problems if ": cannot convert unit " not in p)
    problems.extend(schema_unit_problems(schema, dictionary))
    lc = schema.long
    required = ({"patient_id": schema.patient_id, "label": schema.label} if schema.format == "wide" else
                {"long.patient": lc.patient, "long.feature": lc.feature, "long.value": lc.value, "long.time": lc.time,
                 "long.unit": lc.unit, "label": schema.label})
    known = {c for c in required.values() if c} | set(schema.columns) | set(schema.ignore)
    if schema.format == "wide":
        known |= {str(c) for c in df.columns if isinstance(c, str) and dictionary.resolve(c) is not None}
    check_labels(df, site=schema.site, required=required, known=known, ignore_blank="" in schema.ignore)
    if len(df.columns) == 0:  # not 'no header row ... 0 of its 0 fields look like numbers'
        raise SchemaError([f"The table for site {schema.site!r} has no columns. Export the data again, with a header "
                           "row naming each column."], title="Table is empty")
    parquet = df.attrs.get("encoding") == "parquet"  # column names of their own: no header row to lose
    if not parquet and header_is_data(df.columns, required=required, known=known):
        problems.append(no_header_message([str(c) for c in df.columns], required))
        _finish(problems, schema)
    if len(df) == 0:
        raise SchemaError([f"The table for site {schema.site!r} is empty (0 rows). Export the data again."],
                          title="Table is empty")
    df = df.reset_index(drop=True)
    _check_required(df, required, problems)
    problems.extend(_near_misses(df, schema, required).values())
    if schema.format == "wide":
        return _ingest_wide(df, schema, dictionary, problems)
    return _ingest_long(df, schema, dictionary, problems)


def _with_feature_problems(exc: SchemaError, df: pd.DataFrame, schema: SiteSchema,
                           dictionary: FeatureDictionary) -> SchemaError:
    """``exc`` (the time and event columns' problems) with the problems of the rest of the table --
    ids, feature cells, columns -- read as an unlabelled table without the time and event columns, so a
    survival table's problems come at once, not the label's first."""
    spec = schema.survival
    plain = schema.model_copy(update={"survival": None, "label": None, "unlabeled": True, "label_codes": None,
                                      "ignore": tuple(dict.fromkeys((*schema.ignore, spec.time, spec.event)))})
    try:
        ingest(df.drop(columns=[c for c in (spec.time, spec.event) if c in df.columns]), schema=plain,
               dictionary=dictionary)
    except SchemaError as more:
        return SchemaError(list(dict.fromkeys([*exc.problems, *more.problems])),
                           title=f"Table for site {schema.site!r} cannot be ingested")
    return exc


def declared_missing(df: pd.DataFrame, schema: SiteSchema) -> pd.DataFrame:
    """``df`` with the cells that are one of ``[policy] missing_values`` set missing; how many is
    ``attrs["declared_missing_cells"]`` (added to any earlier count), by column name in
    ``attrs["declared_missing_by_column"]``."""
    tokens = {t.strip() for t in schema.policy.missing_values}
    if not tokens or isinstance(df.columns, pd.MultiIndex):
        return df
    numbers = [float(t) for t in tokens if _is_number(t)]  # '-999' is also -999.0 and '-999,00' (decimal comma)

    def hits(raw: pd.Series) -> np.ndarray:
        text = as_text(raw).str.strip()
        hit = text.isin(tokens).to_numpy(dtype=bool)
        if numbers:
            hit = hit | pd.to_numeric(text, errors="coerce").isin(numbers).to_numpy(dtype=bool)  # not |=: read-only
        return hit

    hit = np.column_stack([hits(df.iloc[:, i]) for i in range(df.shape[1])]) if df.shape[1] \
        else np.zeros((len(df), 0), bool)
    if not hit.any():
        return df
    out = df.astype(object).mask(hit)
    by_column = dict(df.attrs.get("declared_missing_by_column", {}))
    for i in np.flatnonzero(hit.any(axis=0)):
        by_column[str(df.columns[i])] = by_column.get(str(df.columns[i]), 0) + int(hit[:, i].sum())
    out.attrs = {**df.attrs, "declared_missing_cells": int(df.attrs.get("declared_missing_cells", 0)) + int(hit.sum()),
                 "declared_missing_by_column": by_column}
    return out


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def schema_unit_problems(schema: SiteSchema, dictionary: FeatureDictionary) -> list[str]:
    """Every schema unit that does not convert to its feature's canonical unit, once each."""
    out = []
    for col, cm in schema.columns.items():
        if cm.unit is None or cm.feature not in dictionary:
            continue
        feat = dictionary.get(cm.feature)
        if feat.kind != FeatureKind.NUMERIC:
            continue
        try:
            conversion(feature=feat.id, analyte=feat.analyte, source=cm.unit, target=feat.unit,
                       molar_mass=feat.molar_mass, valence=feat.valence)
        except SchemaError as exc:
            out.extend(f"Column {col!r}: {p}" for p in exc.problems)
    return out


def _check_required(df: pd.DataFrame, cols: dict[str, str | None], problems: list[str]) -> None:
    for role, col in cols.items():
        if col is not None and col not in df.columns:
            problems.append(f"The {role} column {col!r} is missing (columns present: {len(df.columns)}). "
                            f"Set `{role}` in the site schema to the right column name.")


def _near_misses(df: pd.DataFrame, schema: SiteSchema, required: dict[str, str | None]) -> dict[str, str]:
    declared = [c for c in required.values() if c] + list(schema.columns if schema.format == "wide" else ())
    return near_misses(df.columns, [*declared, *schema.ignore, *(schema.concepts or ())])


def _level_nodes(index: dict[str, int], feat) -> np.ndarray:  # noqa: ANN001 - a dictionary Feature
    """The graph node of each level of a categorical feature, by level code (``<feature>=<level>``)."""
    return np.array([index[f"{feat.id}={lvl}"] for lvl in feat.levels], dtype=np.int64)


def _units_row(df: pd.DataFrame, mapped: dict) -> str | None:
    """The problem of a wide table whose first data row names units (``kg``, ``mg/dL``) in every
    numeric column it fills -- at least two -- instead of values; None if it does not."""
    if len(df) < 2:
        return None
    filled = [col for col, (feat, _) in mapped.items()
              if feat.kind == FeatureKind.NUMERIC and present_mask(df[col].iloc[:1])[0]]
    units = [col for col in filled if is_known_unit(str(df[col].iloc[0]).strip())]
    if len(units) < 2 or len(units) != len(filled):
        return None
    return (f"Row 1 holds unit names in the numeric column(s) {', '.join(map(repr, units))}, not a patient's "
            "values: the export has a units row under the header. Delete that row, and write each column's unit "
            "in the site schema ([columns].<column>.unit).")


def _finish(problems: list[str], schema: SiteSchema) -> None:
    if problems:  # each problem once: a schema unit is checked up front and again for its cells
        raise SchemaError(list(dict.fromkeys(problems)), title=f"Table for site {schema.site!r} cannot be ingested")


def _id_cells(raw: pd.Series, col: str, problems: list[str]) -> pd.Series:
    """Ids as the hospital writes them: whole numbers stored as floating point (a Parquet or
    DataFrame column of integer ids with a gap) as integers ('1', not '1.0'); bytes (a Parquet
    binary column) as UTF-8 text. Fractional floats and floats beyond 2**53 (digits already lost)
    are problems."""
    if pd.api.types.is_float_dtype(raw.dtype):
        v = raw.to_numpy(dtype=float)
        here = ~np.isnan(v)
        v = np.where(here, v, 0.0)
        bad = (np.abs(v) >= 2.0**53) | (np.isfinite(v) & (np.mod(v, 1, where=np.isfinite(v), out=np.zeros_like(v)) != 0))
        if bad.any():
            problems.append(f"Patient id column {col!r}: {rows_text(bad)}: ids stored as floating-point numbers that "
                            "are not whole or are beyond 2**53 (where digits are lost). Export the ids as text or "
                            "integers.")
            return raw
        return pd.Series(pd.array(v.astype(np.int64), dtype="Int64"), index=raw.index).where(here)
    given = raw.dropna() if raw.dtype == object else raw.iloc[:0]
    if len(given) and isinstance(given.iloc[0], bytes):  # a binary column (a mixed one is text already)
        def text(x):  # noqa: ANN001, ANN202
            if not isinstance(x, bytes):
                return x
            try:
                return x.decode("utf-8")
            except UnicodeDecodeError:
                return None
        out = raw.map(text)
        undecodable = out.isna().to_numpy() & raw.notna().to_numpy()
        if undecodable.any():
            problems.append(f"Patient id column {col!r}: {rows_text(undecodable)}: binary ids that are not UTF-8 "
                            "text. Export the ids as text.")
            return raw
        return out
    return raw


def _ids(raw: pd.Series, col: str, problems: list[str]) -> np.ndarray:
    """Stripped patient ids; empty ids and ids differing only by whitespace are problems."""
    raw = _id_cells(raw, col, problems)
    present = present_mask(raw)
    if (~present).any():
        problems.append(f"Patient id column {col!r}: {rows_text(~present)}: no id. Fill them or remove those rows.")
    text = as_text(raw)
    ids = text.str.strip().to_numpy(dtype=object)
    # the key an id is compared by: without whitespace/invisible characters, NFKC-normalised; plain
    # printable-ASCII ids are their own key, so only the others are looked at one by one
    key = text.to_numpy(dtype=object).copy()
    odd = np.flatnonzero(~text.str.fullmatch(r"[!-~]*").to_numpy(dtype=bool))
    for i in odd:
        key[i] = _SPACE.sub("", unicodedata.normalize("NFKC", key[i]))
    clash = np.zeros(len(key), dtype=bool)
    if len(odd):
        wanted = set(key[odd])
        spellings: dict[str, set[str]] = {}  # in Python: pandas' nunique/groupby hash 'p1' and 'p1\x00' alike
        for k, r, here in zip(key, text, present, strict=True):
            if here and k in wanted:
                spellings.setdefault(k, set()).add(r)
        clash = present & np.array([len(spellings.get(k, ())) > 1 for k in key], dtype=bool)
    summary = present & pd.Series(ids).str.casefold().isin(SUMMARY_IDS).to_numpy(dtype=bool)
    if summary.any():
        problems.append(f"Patient id column {col!r}: {rows_text(summary)}: the id is a summary word (total, sum, "
                        "mean, ...): a spreadsheet's totals row, not a patient. Remove summary rows from the export.")
    control = present & text.str.contains(_CONTROL).to_numpy(dtype=bool) & ~clash
    if control.any():
        problems.append(f"Patient id column {col!r}: {rows_text(control)}: ids holding control characters (NUL, "
                        "escape, ...). Export the ids as plain text.")
    if clash.any():
        problems.append(f"Patient id column {col!r}: {rows_text(clash)}: ids that differ from another id only by "
                        "whitespace, invisible characters (zero-width, control or direction marks) or Unicode "
                        "normalisation (é written as e + accent). Clean the ids so each patient has exactly one "
                        "spelling.")
    return ids


def _labels(df: pd.DataFrame, schema: SiteSchema, problems: list[str]) -> np.ndarray | None:
    if schema.label is None:  # declared unlabeled (SiteSchema refuses a silent None)
        return None
    return parse_labels(df[schema.label], schema.label, problems, codes=schema.label_codes) \
        if schema.label in df.columns \
        else np.full(len(df), np.nan)


def _apply_label_policy(labels: np.ndarray, schema: SiteSchema, problems: list[str],
                        df_columns: object = ()) -> np.ndarray:
    missing = np.isnan(labels)
    if missing.all() and schema.label is not None and schema.label not in df_columns:
        return ~missing  # the missing label column is reported once, not again for every row
    if missing.any() and schema.policy.missing_label == "error" and schema.label is not None:
        problems.append(f"Label column {schema.label!r}: {rows_text(missing)}: no label. Fill them, or set "
                        "[policy] missing_label = \"drop\" to drop (and count) those patients.")
    return ~missing


def _cat(xs: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(xs).astype(dtype) if xs else np.zeros(0, dtype)


def _converted(mapped: dict, units: dict[str, list[str]]) -> dict[str, str]:
    """column or code -> "its unit(s) -> canonical unit", for those not already in the feature's unit."""
    return {n: f"{', '.join(units[n])} -> {f.unit}" for n, (f, _) in mapped.items()
            if any(not same_unit(u, f.unit) for u in units.get(n, ()))}


def _as_key_frame(df: pd.DataFrame) -> pd.DataFrame:
    """``df``'s cells as text, by position (labels may repeat), to compare rows whatever the dtypes."""
    return pd.DataFrame({i: as_text(df.iloc[:, i]).str.strip() for i in range(df.shape[1])})


def _far(mapped: dict, parsed: dict[str, np.ndarray]) -> dict[str, str]:
    """column or code -> why its values look like another unit (:func:`.plausibility.far_from_reference`)."""
    out = {n: far_from_reference(f, parsed[n]) for n, (f, _) in mapped.items() if n in parsed}
    return {n: why for n, why in out.items() if why is not None}


def _ingest_wide(df, schema, dictionary, problems) -> PatientTable:
    reserved = {schema.patient_id, schema.label, *(schema.concepts or ())}
    near = _near_misses(df, schema, {"patient_id": schema.patient_id, "label": schema.label})  # reported
    names = [c for c in df.columns if c not in reserved and c not in schema.ignore and c not in near]
    mapped, unknown = resolve(names, schema, dictionary)
    if blank := [i for i, c in enumerate(df.columns) if c in unknown and not c.strip()]:
        problems.append(empty_name_message(blank))
    unmatched = [c for c in schema.columns if c not in df.columns]  # mapped by the schema, absent from the table
    named = [c for c in unknown if c.strip()]
    summary = []
    if len(named) > SHOWN_UNKNOWN:  # one problem for the rest, with the list to paste (a 300-column export)
        rest = named[SHOWN_UNKNOWN:]
        summary.append(f"{len(rest)} more column(s) are not in the feature dictionary {dictionary.name} "
                        f"v{dictionary.version} nor mapped in the site schema: {', '.join(map(repr, rest))}. Map the "
                        "ones that are features under [columns]; to leave out all the columns named here and above, "
                        f"write in the site schema: ignore = [{', '.join(json.dumps(c) for c in named)}]")
    for col in named[:SHOWN_UNKNOWN]:
        renamed = get_close_matches(col.lower(), [c.lower() for c in unmatched], n=1, cutoff=0.6)
        hint = (f" The site schema maps {next(c for c in unmatched if c.lower() == renamed[0])!r}, which is not in "
                "the table: if the column was renamed, fix its name under [columns].") if renamed else ""
        if re.fullmatch(r"Unnamed: \d+(\.\d+)?", col):  # pandas' name for an empty header cell
            hint += (" It is pandas' name for a column whose header cell is empty (a trailing delimiter on every "
                     "line, or an index column): drop it (e.g. df.drop(columns=[...])) or list it under ignore.")
        problems.append(f"Column {col!r} is not in the feature dictionary {dictionary.name} v{dictionary.version} "
                        f"(nearest: {dictionary.nearest(col)}). Map it in the site schema under [columns] or "
                        f"list it under ignore.{hint}")
    problems.extend(summary)
    one_column_per_feature(mapped, problems)
    if not mapped and not unknown and not near:
        problems.append(f"No column of the table is a feature: every column is the patient id, the label or listed "
                        f"under ignore ({len(df.columns)} columns). Map the feature columns under [columns] in the "
                        "site schema (or remove them from ignore).")
    ids = _ids(df[schema.patient_id], schema.patient_id, problems) if schema.patient_id in df.columns \
        else np.array([""] * len(df), dtype=object)
    if schema.patient_id in df.columns:
        dup = pd.Series(ids).duplicated(keep=False).to_numpy() & present_mask(df[schema.patient_id])
        copies = np.zeros(len(df), dtype=bool)
        if dup.any():  # every cell equal: a row exported twice
            copies[np.flatnonzero(dup)] = _as_key_frame(df[dup]).duplicated(keep=False).to_numpy()
        if copies.any():
            problems.append(f"Patient id column {schema.patient_id!r}: {rows_text(copies)}: the same row more than "
                            "once (every cell equal): the export repeated those patients. Remove the copies.")
        if (dup & ~copies).any():
            problems.append(f"Patient id column {schema.patient_id!r}: {rows_text(dup & ~copies)}: repeated id. A wide "
                            "table has one row a patient; use format = \"long\" for repeated measurements.")
    parsed, empty = {}, []
    for col, (feat, cm) in mapped.items():
        if (named := header_unit_problem(col, feat, cm)) is not None:
            problems.append(named)
        if cm is not None and coding_problems(col, cm, feat):  # reported with the schema's: its cells are not read
            parsed[col] = np.full(len(df), np.nan)
            continue
        if len(df) and not present_mask(df[col]).any():  # not measured at this hospital: as an absent column
            empty.append(col)
            parsed[col] = np.full(len(df), np.nan)
            continue
        coding = cm.normalised_coding(feat) if cm is not None and cm.coding is not None else None
        parsed[col] = parse_cells(col, df[col], feat, cm.unit if cm else None, problems, coding=coding)
        if feat.kind == FeatureKind.NUMERIC and (grouped := point_grouped_cells(df, col)).any():
            problems.append(point_grouped_problem(f"Column {col!r} ({feat.id})", grouped))
    if (units_row := _units_row(df, mapped)) is not None:
        problems.insert(0, units_row)
    labels = _labels(df, schema, problems)
    keep = _apply_label_policy(labels, schema, problems, df.columns) if labels is not None else np.ones(len(df), bool)
    _finish(problems, schema)
    index = dictionary.node_index()
    rows = np.flatnonzero(keep)
    remap = -np.ones(len(df), dtype=np.int64)
    remap[rows] = np.arange(len(rows))
    pats, nodes, vals, stds = [], [], [], []
    for col, (feat, _) in mapped.items():
        v = parsed[col]
        ok = keep & ~np.isnan(v)
        if feat.kind == FeatureKind.CATEGORICAL:
            node = _level_nodes(index, feat)[v[ok].astype(np.int64)]
            val = np.ones(ok.sum())
        else:
            node = np.full(ok.sum(), index[feat.id], dtype=np.int64)
            val = v[ok]
        pats.append(remap[ok]), nodes.append(node), vals.append(val)
        stds.append(feat.standardise_array(val))  # vectorised: a Python loop took ~90 s for 1e6 rows
    units = {c: [cm.unit] if cm and cm.unit else [] for c, (_, cm) in mapped.items()}
    report = IngestReport(rows_read=len(df), patients=len(rows), observations=int(sum(len(p) for p in pats)),
                          dropped_patients_missing_label=int((~keep).sum()),
                          ignored_columns=tuple(c for c in df.columns if c in schema.ignore),
                          converted_columns=_converted(mapped, units),
                          features_present=tuple(sorted({f.id for f, _ in mapped.values()})),
                          encoding=df.attrs.get("encoding"), labelled=labels is not None,
                          declared_missing_cells=int(df.attrs.get("declared_missing_cells", 0)),
                          declared_missing_by_column=dict(df.attrs.get("declared_missing_by_column", {})),
                          absent_columns=tuple(c for c in schema.columns if c not in df.columns),
                          empty_columns=tuple(empty), far_from_reference=_far(mapped, parsed))
    out_labels = labels[rows].astype(np.int64) if labels is not None else np.full(len(rows), -1, np.int64)
    return PatientTable(dictionary=dictionary, site=schema.site, patient_ids=tuple(ids[rows]),
                        patient=_cat(pats, np.int64), node=_cat(nodes, np.int64), value=_cat(vals, np.float64),
                        std_value=_cat(stds, np.float64), time=np.zeros(sum(len(p) for p in pats), np.int64),
                        labels=out_labels, report=report)



def _long_ids_and_codes(df, schema, dictionary, problems):
    lc = schema.long
    ids = _ids(df[lc.patient], lc.patient, problems)
    codes_raw = df[lc.feature]
    has_code = present_mask(codes_raw)
    if (~has_code).any():
        problems.append(f"Feature column {lc.feature!r}: {rows_text(~has_code)}: no feature code. Fill them or "
                        "remove those rows.")
    codes = as_text(codes_raw).str.strip().to_numpy(dtype=object)
    names = sorted({c for c, h in zip(codes, has_code, strict=True) if h})
    mapped, unknown = resolve(names, schema, dictionary)
    if unknown:
        rows = has_code & np.isin(codes, unknown)
        problems.append(f"Feature column {lc.feature!r}: {len(unknown)} distinct feature code(s) in {rows_text(rows)} "
                        f"are not in the feature dictionary {dictionary.name} v{dictionary.version} nor mapped in "
                        "the site schema (codes not shown: they are cell contents). Map each code under [columns] "
                        "in the site schema, or remove those rows.")
    return ids, codes, mapped


def _row_units(df, rows, name, feat, cm, schema, problems) -> list[tuple[str | None, np.ndarray]]:
    """The units of one feature code's rows, as (unit, its rows) groups over the table's rows: the
    schema's unit for all of them, else the unit column's. A code recorded in several units (a lab
    that changed analysers: mg/dL rows beside mmol/L ones) is one group a unit, each converted
    through the unit library on its own (a unit that does not convert to the feature's is refused
    by :func:`parse_cells`); spellings of one unit are one group (mg/dl == mg/dL)."""
    lc = schema.long
    unit = cm.unit if cm else None
    if lc.unit is None or lc.unit not in df.columns:
        return [(unit, rows)]
    cells = df.loc[rows, lc.unit]
    present = present_mask(cells)
    text = as_text(cells).str.strip()
    known = present & text.map(is_known_unit).to_numpy()
    if (present & ~known).any():
        problems.append(f"Unit column {lc.unit!r} for feature code {name!r} ({feat.id}): "
                        f"{int(text[present & ~known].nunique())} unit string(s) are not known units (not shown: "
                        f"cell contents). Write units in UCUM, e.g. {', '.join(EXAMPLE_UNITS)}. Fix the unit cells, "
                        f"or set the unit in the site schema ([columns].{name!r}.unit).")
        return [(unit, rows)]
    units: list[str] = []  # distinct units, a spelling of one unit counted once (mg/dl == mg/dL, cells/mm3 == cells/uL)
    group_of: dict[str, int] = {}  # each distinct cell text -> its unit's place in `units` (one pint check a text)
    for cell in sorted(set(text[present])):
        u = normalise_unit(cell)
        j = next((k for k, v in enumerate(units) if same_unit(u, v)), None)
        if j is None:
            units.append(u)
            j = len(units) - 1
        group_of[cell] = j
    of_row = np.where(present, text.map(group_of).fillna(-1).to_numpy(), -1).astype(np.int64)
    if not units:
        return [(unit, rows)]
    if unit is not None and any(not same_unit(unit, u) for u in units):
        problems.append(f"Feature code {name!r} ({feat.id}): the unit column {lc.unit!r} says "
                        f"{', '.join(map(repr, units))} but the site schema says {unit!r} ([columns].{name!r}.unit). "
                        "Make them agree (or remove one).")
        return [(unit, rows)]
    at = np.flatnonzero(rows)
    no_unit = np.zeros(len(df), dtype=bool)
    no_unit[at] = ~present & present_mask(df.loc[rows, lc.value])
    if no_unit.any() and unit is None:
        problems.append(f"Unit column {lc.unit!r} for feature code {name!r} ({feat.id}): {rows_text(no_unit)}: a value "
                        f"without a unit while the other rows of this code give {', '.join(map(repr, units))}. Fill "
                        f"the unit cells, or set the unit in the site schema ([columns].{name!r}.unit).")
    valued = present_mask(df.loc[rows, lc.value])
    kept = [j for j in range(len(units)) if ((of_row == j) & valued).any()] or [0]  # a unit beside no value: none
    groups = []
    for j in kept:
        mine = of_row == j
        if j == kept[0]:
            mine = mine | ~np.isin(of_row, kept)  # rows without a unit (no value, or named above) and unused units
        mask = np.zeros(len(df), dtype=bool)
        mask[at[mine]] = True
        groups.append((units[j], mask))
    return groups


def _ingest_long(df, schema, dictionary, problems) -> PatientTable:
    lc = schema.long
    if any("column" in p and "is missing" in p for p in problems):
        _finish(problems, schema)
    ids, codes, mapped = _long_ids_and_codes(df, schema, dictionary, problems)
    labels_row = _labels(df, schema, problems)
    per_patient_y = None
    if labels_row is not None:
        lab = pd.DataFrame({"id": ids, "y": labels_row}).groupby("id", sort=True)["y"]
        inconsistent = lab.nunique(dropna=True) > 1
        if inconsistent.any():
            problems.append(f"Label column {schema.label!r}: {int(inconsistent.sum())} patient(s) have different "
                            "labels on different rows. A label must be constant per patient.")
        per_patient_y = lab.first()
        uniq_ids = per_patient_y.index.to_numpy()
        labels = per_patient_y.to_numpy(dtype=float)
        keep_p = _apply_label_policy(labels, schema, problems, df.columns)
    else:
        uniq_ids = np.array(sorted(set(ids)), dtype=object)
        labels = np.full(len(uniq_ids), -1.0)
        keep_p = np.ones(len(uniq_ids), bool)
    values = np.full(len(df), np.nan)
    parsed = np.full(len(df), np.nan)
    nodes = np.full(len(df), -1, dtype=np.int64)
    feat_of_row = np.full(len(df), -1, dtype=np.int64)
    index = dictionary.node_index()
    feature_pos = {f.id: i for i, f in enumerate(dictionary.features)}
    units_used: dict[str, list[str]] = {}
    for name, (feat, cm) in mapped.items():
        rows = codes == name
        groups = _row_units(df, rows, name, feat, cm, schema, problems)
        units_used[name] = [u for u, _ in groups if u is not None]
        if not units_used[name] and (named := header_unit_problem(name, feat, cm, what="Feature code")) is not None:
            problems.append(named)  # 'glucose_mmol' with no unit anywhere: read in the canonical unit otherwise
        if cm is not None and coding_problems(name, cm, feat):  # reported with the schema's: cells not read
            feat_of_row[rows] = feature_pos[feat.id]
            continue
        coding = cm.normalised_coding(feat) if cm is not None and cm.coding is not None else None
        for unit_here, in_unit in groups:  # each unit's rows converted on their own
            parsed[in_unit] = parse_cells(f"{lc.value}[{name}]", df.loc[in_unit, lc.value], feat, unit_here, problems,
                                          coding=coding, key=name, rows=np.flatnonzero(in_unit))
        v = parsed[rows]
        if feat.kind == FeatureKind.NUMERIC and (grouped := rows & point_grouped_cells(df, lc.value)).any():
            problems.append(point_grouped_problem(f"Column {f'{lc.value}[{name}]'!r} ({feat.id})", grouped))
        feat_of_row[rows] = feature_pos[feat.id]
        if feat.kind == FeatureKind.CATEGORICAL:
            nodes[rows] = np.where(np.isnan(v), -1, _level_nodes(index, feat)[np.nan_to_num(v).astype(np.int64)])
            values[rows] = np.where(np.isnan(v), np.nan, 1.0)
        else:
            nodes[rows] = index[feat.id]
            values[rows] = v
    times = df[lc.time] if lc.time is not None and lc.time in df.columns else pd.Series(np.zeros(len(df)))
    if pd.api.types.is_datetime64_any_dtype(times) or isinstance(times.dtype, pd.PeriodDtype):
        times = as_text(times)  # not nanoseconds since 1970: reported as dates below
    tnum = pd.to_numeric(as_text(times).str.strip(), errors="coerce").to_numpy(dtype=float) \
        if times.dtype == object else pd.to_numeric(times, errors="coerce").to_numpy(dtype=float)
    bad_t = ~np.isfinite(tnum)
    if bad_t.any():
        dates = bad_t & date_cells(times)
        if dates.any():
            problems.append(f"Time column {lc.time!r}: {rows_text(dates)}: dates or datetimes. The time column holds "
                            "hours (or a snapshot index), the same for every patient's clock: convert them to hours "
                            "since each patient's admission or index time before ingestion.")
        if (bad_t & ~dates).any():
            problems.append(f"Time column {lc.time!r}: {rows_text(bad_t & ~dates)}: not a finite number (use hours "
                            "or an index).")
    pid_all = {p: i for i, p in enumerate(uniq_ids)}
    pat_all = np.array([pid_all.get(x, -1) for x in ids], dtype=np.int64)
    usable = (nodes >= 0) & ~np.isnan(values) & np.isfinite(tnum)
    obs = pd.DataFrame({"p": pat_all, "t": tnum, "f": feat_of_row, "v": parsed})[usable]
    n_dupes = 0
    if len(obs):
        groups = obs.groupby(["p", "t", "f"])["v"]
        conflicting = groups.transform("nunique") > 1
        if conflicting.any():
            mask = np.zeros(len(df), bool)
            mask[obs.index[conflicting.to_numpy()]] = True
            problems.append(f"Value column {lc.value!r}: {rows_text(mask)}: the same patient, time and feature is "
                            "recorded more than once with different values. Keep one observation per patient, time "
                            "and feature.")
        repeat = obs.duplicated(["p", "t", "f"], keep="first").to_numpy() & ~conflicting.to_numpy()
        n_dupes = int(repeat.sum())
        usable[obs.index[repeat]] = False
    _finish(problems, schema)
    pid = {p: i for i, p in enumerate(uniq_ids[keep_p])}
    pat = np.array([pid.get(x, -1) for x in ids], dtype=np.int64)
    ok = (pat >= 0) & usable
    snap = np.searchsorted(np.unique(tnum[np.isfinite(tnum)]), tnum)
    node_feat = {i: dictionary.get(n.split("=")[0]) for n, i in index.items()}
    std = np.empty(int(ok.sum()))
    for n in np.unique(nodes[ok]):  # one vectorised call a node, not one a value
        at = nodes[ok] == n
        std[at] = node_feat[int(n)].standardise_array(values[ok][at])
    report = IngestReport(rows_read=len(df), patients=len(pid), observations=int(ok.sum()),
                          dropped_patients_missing_label=int((~keep_p).sum()),
                          converted_columns=_converted(mapped, units_used),
                          features_present=tuple(sorted({f.id for f, _ in mapped.values()})),
                          encoding=df.attrs.get("encoding"), duplicate_observations_dropped=n_dupes,
                          declared_missing_cells=int(df.attrs.get("declared_missing_cells", 0)),
                          declared_missing_by_column=dict(df.attrs.get("declared_missing_by_column", {})),
                          labelled=labels_row is not None,
                          far_from_reference=_far(mapped, {n: parsed[codes == n] for n in mapped}))
    return PatientTable(dictionary=dictionary, site=schema.site, patient_ids=tuple(uniq_ids[keep_p]),
                        patient=pat[ok], node=nodes[ok], value=values[ok], std_value=std.astype(np.float64),
                        time=snap[ok].astype(np.int64), labels=labels[keep_p].astype(np.int64), report=report)
