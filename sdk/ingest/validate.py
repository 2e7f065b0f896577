"""Ingestion: a hospital's DataFrame/CSV/Parquet -> a validated :class:`PatientTable`.

Every problem of a table is reported at once, naming the column and row numbers (1-based data
rows) and the fix -- never a cell value or a patient identifier. Nothing is dropped silently:
what an explicit policy drops is counted in the :class:`IngestReport`.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
from clinograph.secure.errors import ConfigError, SchemaError

from ..ontology.dictionary import Feature, FeatureDictionary, FeatureKind
from ..ontology.schema import SiteSchema
from ..ontology.units import conversion, normalise_unit
from .table import IngestReport, PatientTable

_UNIT_IN_CELL = re.compile(r"^\s*[-+]?\d+(?:[.,]\d+)?\s*[A-Za-z/%°µμ][\w/%°µμ.]*\s*$")
_TRUE = {"1", "1.0", "true", "t", "yes", "y"}
_FALSE = {"0", "0.0", "false", "f", "no", "n"}


def read_table(path: str | Path) -> pd.DataFrame:
    """Read CSV or Parquet by extension; errors say which formats are supported."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"Table {path} does not exist.")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return pd.read_csv(path, dtype=str, keep_default_na=True)
    if suffix in (".parquet", ".pq"):
        return pd.read_parquet(path)
    raise ConfigError(f"Table {path}: unsupported extension {suffix!r}; use .csv or .parquet.")


def _rows(mask: np.ndarray) -> str:
    idx = np.flatnonzero(mask) + 1
    shown = ", ".join(str(i) for i in idx[:5])
    more = f" (and {len(idx) - 5} more)" if len(idx) > 5 else ""
    return f"row{'s' if len(idx) > 1 else ''} {shown}{more}"


def _parse_cells(col: str, raw: pd.Series, feat: Feature, unit: str | None,
                 problems: list[str]) -> np.ndarray:
    """Parse one column into canonical-unit floats (NaN = missing); append problems."""
    present = raw.notna().to_numpy() & (raw.astype(str).str.strip() != "").to_numpy()
    out = np.full(len(raw), np.nan)
    text = raw.astype(str).str.strip()
    if feat.kind == FeatureKind.NUMERIC:
        num = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
        bad = present & np.isnan(num)
        if bad.any():
            unit_like = bad & text.str.match(_UNIT_IN_CELL).to_numpy()
            if unit_like.any():
                problems.append(f"Column {col!r} ({feat.id}): {_rows(unit_like)}: number with a unit string "
                                f"in the cell. Put the unit in the site schema ([columns].{col!r}.unit) and keep only "
                                "numbers in the column.")
            other = bad & ~unit_like
            if other.any():
                problems.append(f"Column {col!r} ({feat.id}): {_rows(other)}: text where a number is expected. "
                                "Clean these cells or leave them empty for missing.")
        inf = present & np.isinf(num)
        if inf.any():
            problems.append(f"Column {col!r} ({feat.id}): {_rows(inf)}: infinite value. Replace with a value or leave empty.")
        scale, offset = 1.0, 0.0
        if unit is not None:
            try:
                scale, offset = conversion(feature=feat.id, analyte=feat.analyte, source=unit, target=feat.unit)
            except SchemaError as exc:
                problems.extend(f"Column {col!r}: {p}" for p in exc.problems)
        vals = num * scale + offset
        ok = present & np.isfinite(vals)
        lo = feat.physical_min if feat.physical_min is not None else -np.inf
        hi = feat.physical_max if feat.physical_max is not None else np.inf
        impossible = ok & ((vals < lo) | (vals > hi))
        if impossible.any():
            problems.append(f"Column {col!r} ({feat.id}): {_rows(impossible)}: physically impossible value after "
                            f"conversion to {feat.unit} (allowed {lo:g} to {hi:g}). Check the unit in the site "
                            "schema or correct the values.")
        out[ok & ~impossible] = vals[ok & ~impossible]
    elif feat.kind == FeatureKind.BINARY:
        low = text.str.lower()
        t, f = low.isin(_TRUE).to_numpy(), low.isin(_FALSE).to_numpy()
        bad = present & ~(t | f)
        if bad.any():
            problems.append(f"Column {col!r} ({feat.id}): {_rows(bad)}: not binary (expected 0/1, true/false or "
                            "yes/no).")
        out[present & t] = 1.0
        out[present & f] = 0.0
    else:
        levels = {lvl.lower(): i for i, lvl in enumerate(feat.levels)}
        codes = text.str.lower().map(levels).to_numpy(dtype=float)
        bad = present & np.isnan(codes)
        if bad.any():
            problems.append(f"Column {col!r} ({feat.id}): {_rows(bad)}: not one of the levels {list(feat.levels)}.")
        out[present & ~np.isnan(codes)] = codes[present & ~np.isnan(codes)]
    if present.sum() == 0 or np.isnan(out).all():
        problems.append(f"Column {col!r} ({feat.id}) has no usable value at all. Remove it from [columns] or list it "
                        "under ignore.")
    return out


def _labels(raw: pd.Series, col: str, problems: list[str]) -> np.ndarray:
    text = raw.astype(str).str.strip().str.lower()
    present = raw.notna().to_numpy() & (text != "").to_numpy() & (text != "nan").to_numpy()
    t, f = text.isin(_TRUE).to_numpy(), text.isin(_FALSE).to_numpy()
    bad = present & ~(t | f)
    if bad.any():
        problems.append(f"Label column {col!r}: {_rows(bad)}: not binary (expected 0/1, true/false or yes/no).")
    out = np.full(len(raw), np.nan)
    out[present & t], out[present & f] = 1.0, 0.0
    out[bad] = -1.0  # reported above; not also counted as missing
    return out


def _resolve_columns(columns: list[str], schema: SiteSchema, dictionary: FeatureDictionary,
                     reserved: set[str], problems: list[str]) -> dict[str, tuple[Feature, str | None]]:
    mapped: dict[str, tuple[Feature, str | None]] = {}
    for col in columns:
        if col in reserved or col in schema.ignore:
            continue
        if col in schema.columns:
            cm = schema.columns[col]
            if cm.feature in dictionary:
                mapped[col] = (dictionary.get(cm.feature), cm.unit)
            continue  # schema.check_against reports the bad mapping
        feat = dictionary.resolve(col)
        if feat is not None:
            mapped[col] = (feat, None)
            continue
        problems.append(f"Column {col!r} is not in the feature dictionary {dictionary.name} v{dictionary.version} "
                        f"(nearest: {dictionary.nearest(col)}). Map it in the site schema under [columns] or "
                        "list it under ignore.")
    return mapped


def ingest(df: pd.DataFrame, *, schema: SiteSchema, dictionary: FeatureDictionary) -> PatientTable:
    """Validate ``df`` against ``schema`` and ``dictionary`` and build a PatientTable.

    Raises:
        SchemaError: with every problem of the table listed.
    """
    problems: list[str] = []
    try:
        schema.check_against(dictionary)
    except SchemaError as exc:
        problems.extend(exc.problems)
    if df is None or len(df) == 0:
        raise SchemaError([f"The table for site {schema.site!r} is empty (0 rows). Export the data again."],
                          title="Table is empty")
    df = df.reset_index(drop=True)
    if schema.format == "wide":
        return _ingest_wide(df, schema, dictionary, problems)
    return _ingest_long(df, schema, dictionary, problems)


def _check_required(df: pd.DataFrame, cols: dict[str, str | None], problems: list[str]) -> None:
    for role, col in cols.items():
        if col is not None and col not in df.columns:
            problems.append(f"The {role} column {col!r} is missing (columns present: {len(df.columns)}). "
                            f"Set `{role}` in the site schema to the right column name.")


def _finish(problems: list[str], schema: SiteSchema) -> None:
    if problems:
        raise SchemaError(problems, title=f"Table for site {schema.site!r} cannot be ingested")


def _apply_label_policy(labels: np.ndarray, schema: SiteSchema, problems: list[str]) -> np.ndarray:
    missing = np.isnan(labels)
    if missing.any() and schema.policy.missing_label == "error":
        problems.append(f"Label column {schema.label!r}: {_rows(missing)}: no label. Fill them, or set "
                        "[policy] missing_label = \"drop\" to drop (and count) those patients.")
    return ~missing


def _ingest_wide(df, schema, dictionary, problems) -> PatientTable:
    _check_required(df, {"patient_id": schema.patient_id, "label": schema.label}, problems)
    reserved = {schema.patient_id, schema.label}
    mapped = _resolve_columns(list(df.columns), schema, dictionary, reserved, problems)
    ids = df[schema.patient_id].astype(str) if schema.patient_id in df.columns else pd.Series([], dtype=str)
    if len(ids):
        dup = ids.duplicated(keep=False).to_numpy()
        if dup.any():
            problems.append(f"Patient id column {schema.patient_id!r}: {_rows(dup)}: repeated id. A wide table has "
                            "one row a patient; use format = \"long\" for repeated measurements.")
        empty = (df[schema.patient_id].isna() | (ids.str.strip() == "")).to_numpy()
        if empty.any():
            problems.append(f"Patient id column {schema.patient_id!r}: {_rows(empty)}: no id.")
    parsed = {col: _parse_cells(col, df[col], feat, unit, problems) for col, (feat, unit) in mapped.items()}
    labels = _labels(df[schema.label], schema.label, problems) if schema.label in df.columns else np.zeros(len(df))
    keep = _apply_label_policy(labels, schema, problems)
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
            node = np.array([index[f"{feat.id}={feat.levels[int(c)]}"] for c in v[ok]], dtype=np.int64)
            val = np.ones(ok.sum())
        else:
            node = np.full(ok.sum(), index[feat.id], dtype=np.int64)
            val = v[ok]
        pats.append(remap[ok]), nodes.append(node), vals.append(val)
        stds.append(np.array([feat.standardise(x) for x in val]) if feat.kind == FeatureKind.NUMERIC else val)
    cat = (lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt))
    report = IngestReport(rows_read=len(df), patients=len(rows), observations=int(sum(len(p) for p in pats)),
                          dropped_patients_missing_label=int((~keep).sum()),
                          ignored_columns=tuple(c for c in df.columns if c in schema.ignore),
                          converted_columns={c: f"{u} -> {f.unit}" for c, (f, u) in mapped.items() if u and normalise_unit(u) != normalise_unit(f.unit)},
                          features_present=tuple(sorted({f.id for f, _ in mapped.values()})))
    return PatientTable(dictionary=dictionary, site=schema.site, patient_ids=tuple(ids.to_numpy()[rows]),
                        patient=cat(pats, np.int64), node=cat(nodes, np.int64), value=cat(vals, np.float64),
                        std_value=cat(stds, np.float64), time=np.zeros(sum(len(p) for p in pats), np.int64),
                        labels=labels[rows].astype(np.int64), report=report)


def _ingest_long(df, schema, dictionary, problems) -> PatientTable:
    lc = schema.long
    _check_required(df, {"long.patient": lc.patient, "long.feature": lc.feature, "long.value": lc.value,
                         "long.time": lc.time, "long.unit": lc.unit, "label": schema.label}, problems)
    if problems and any("column" in p and "is missing" in p for p in problems):
        _finish(problems, schema)
    names = sorted(df[lc.feature].astype(str).unique())
    mapped = _resolve_columns(names, schema, dictionary, set(), problems)
    ids = df[lc.patient].astype(str)
    labels_row = _labels(df[schema.label], schema.label, problems) if schema.label else np.zeros(len(df))
    lab = pd.DataFrame({"id": ids, "y": labels_row}).groupby("id", sort=True)["y"]
    inconsistent = (lab.nunique(dropna=True) > 1)
    if inconsistent.any():
        problems.append(f"Label column {schema.label!r}: {int(inconsistent.sum())} patient(s) have different labels "
                        "on different rows. A label must be constant per patient.")
    per_patient = lab.first()
    uniq_ids = per_patient.index.to_numpy()
    labels = per_patient.to_numpy(dtype=float)
    keep_p = _apply_label_policy(labels, schema, problems)
    values = np.full(len(df), np.nan)
    nodes = np.full(len(df), -1, dtype=np.int64)
    index = dictionary.node_index()
    for name, (feat, unit) in mapped.items():
        rows = (df[lc.feature].astype(str) == name).to_numpy()
        sub = df.loc[rows, lc.value]
        unit_here = unit
        if lc.unit is not None and lc.unit in df.columns:
            units = df.loc[rows, lc.unit].dropna().astype(str).unique()
            if len(units) > 1:
                problems.append(f"Feature {name!r} ({feat.id}) is recorded in several units {sorted(units)}; "
                                "convert to one unit before ingestion.")
            elif len(units) == 1:
                unit_here = units[0]
        v = _parse_cells(f"{lc.value}[{name}]", sub.reset_index(drop=True), feat, unit_here, problems)
        values[rows] = v
        if feat.kind == FeatureKind.CATEGORICAL:
            nodes[rows] = [index[f"{feat.id}={feat.levels[int(c)]}"] if not np.isnan(c) else -1 for c in v]
            values[rows] = np.where(np.isnan(v), np.nan, 1.0)
        else:
            nodes[rows] = index[feat.id]
    times = df[lc.time] if lc.time is not None and lc.time in df.columns else pd.Series(np.zeros(len(df)))
    tnum = pd.to_numeric(times, errors="coerce")
    if tnum.isna().any():
        problems.append(f"Time column {lc.time!r}: {_rows(tnum.isna().to_numpy())}: not a number (use hours or an "
                        "index).")
    _finish(problems, schema)
    pid = {p: i for i, p in enumerate(uniq_ids[keep_p])}
    pat = np.array([pid.get(x, -1) for x in ids], dtype=np.int64)
    ok = (pat >= 0) & (nodes >= 0) & ~np.isnan(values)
    snap = np.searchsorted(np.unique(tnum.to_numpy()), tnum.to_numpy())
    node_feat = {i: dictionary.get(n.split("=")[0]) for n, i in index.items()}
    std = np.array([node_feat[n].standardise(v) for n, v in zip(nodes[ok], values[ok], strict=True)])
    report = IngestReport(rows_read=len(df), patients=len(pid), observations=int(ok.sum()),
                          dropped_patients_missing_label=int((~keep_p).sum()),
                          converted_columns={n: f"{u} -> {f.unit}" for n, (f, u) in mapped.items() if u and normalise_unit(u) != normalise_unit(f.unit)},
                          features_present=tuple(sorted({f.id for f, _ in mapped.values()})))
    return PatientTable(dictionary=dictionary, site=schema.site, patient_ids=tuple(uniq_ids[keep_p]),
                        patient=pat[ok], node=nodes[ok], value=values[ok], std_value=std.astype(np.float64),
                        time=snap[ok].astype(np.int64), labels=labels[keep_p].astype(np.int64), report=report)
