"""MEDS datasets -> the long table :func:`ingest` takes.

A MEDS dataset (Medical Event Data Standard; schema from the ``meds`` package) is a folder
whose ``data/`` holds Parquet shards of events ``subject_id, time, code, numeric_value``
(``text_value`` optional, extra columns allowed). Codes are ``SYSTEM/CODE`` (``LOINC/2345-7``)
and map through the dictionary's codes; a unit is read from an extra ``unit`` column, else from
a last ``//``-separated part of the code (``LOINC/2345-7//mg/dL``; MEDS ETLs' ``LAB//50912//mg/dL`` is
``LAB/50912`` in mg/dL, ``//UNK`` no unit: :func:`split_code`),
else the source file's ``units`` for the feature; a numeric event with none of these is refused
(:mod:`.ehr_values`), never read in the dictionary's unit by assumption. A code of a *binary*
feature without ``numeric_value`` (a diagnosis, a procedure) is read as present (1); a numeric
feature's event without ``numeric_value`` is read from ``text_value`` when that is a number
with an optional comparison (``<0.5``: censored, read as ``censored`` says), else counted and
excluded. Labels come from a MEDS label
file (``subject_id, prediction_time, boolean_value``): features are the events at or before the
prediction time and at most ``lookback_hours`` before it (required with labels), binned into
snapshots of ``snapshot_hours`` counted back from it; static events (no time) join the prediction
time's snapshot. Shards are read in batches of :data:`BATCH_ROWS` rows, only the columns used; the events
not read (codes outside the dictionary, subjects outside the label file, dictionary events outside the
window) are counted in pyarrow and never become pandas rows: memory follows the events kept, not the
dataset. ``metadata/codes.parquet``'s ``parent_codes`` only name, in the report, codes
outside the dictionary whose parent is a dictionary code. Without labels, times count from each subject's first mapped event (not MEDS_BIRTH); the extract is
unlabeled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from clinograph.core.errors import ConfigError, SchemaError

from ..ontology.dictionary import FeatureDictionary, FeatureKind
from .ehr_values import CensorPolicy, declared_features
from .extract import EhrExtract, to_long
from .omop_vocab import censoring_in_text, parse_value_text


def shard_paths(root: Path) -> list[Path]:
    """The dataset's Parquet shards (``data/**/*.parquet``), in order.

    Raises:
        ConfigError: there is none (not a MEDS root).
    """
    import meds

    data = root / meds.data_subdirectory
    shards = sorted(data.rglob("*.parquet")) if data.is_dir() else []
    if not shards:
        raise ConfigError(f"MEDS dataset {root} has no Parquet shards under {meds.data_subdirectory}/. Give the "
                          "dataset's root folder (the one holding data/ and metadata/).")
    return shards


@dataclass
class _Scan:
    """What one pass over the shards keeps (the rows :func:`read_meds` reads, as pandas) and counts (the rows
    it never turns into pandas rows: codes outside the dictionary, subjects outside the label file, dictionary
    events outside the window)."""

    events: pd.DataFrame
    shards: list[str]                                   # shard names (the events' ``_shard`` is an index)
    zoned: dict[str, bool] = field(default_factory=dict)  # shard (with rows) -> its times carry a time zone
    split: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # each distinct code -> split_code
    dropped_codes: dict[str, int] = field(default_factory=dict)  # code -> rows in the cohort not kept
    outside: int = 0                                    # rows of subjects outside the label file
    after: int = 0                                      # dictionary events after the prediction time
    before: int = 0                                     # dictionary events surely before the lookback
    subjects: np.ndarray | None = None                  # every subject id of the dataset (unlabeled)


#: rows of a shard read at once: memory is bounded by the kept events plus one batch of one shard
BATCH_ROWS = 1 << 18
#: events dropped in pyarrow as before the lookback are at least this much further back (microseconds);
#: nearer ones are left to pandas, whose float hours decide as when every event was read in pandas
_MARGIN_US = 1_000_000
#: the shard columns read (any others are never read)
_COLUMNS = ("subject_id", "time", "code", "numeric_value", "text_value", "unit")


def _read_shards(root: Path, *, known: set[str], person: set[str], cohort: pd.DataFrame | None, labelled: bool,
                 lookback_hours: float | None) -> _Scan:
    """Every shard, batch by batch: the schema checks on every row, then only the events read are kept.

    Kept: events of dictionary codes (:func:`split_code`) and of ``person`` codes (MEDS_BIRTH, the sex
    codes) of subjects in ``cohort`` (the label file; ``labelled`` and no cohort: the label file is bad,
    nothing is kept, the shards' problems are still collected); dictionary events outside the window are
    dropped and counted. Every other row is counted (by code, or as outside the cohort), never kept.
    """
    import pyarrow.parquet as pq

    shards = shard_paths(root)
    scan = _Scan(events=pd.DataFrame(), shards=[str(s.relative_to(root)) for s in shards])
    window = None
    if cohort is not None:
        import pyarrow as pa

        when = pd.to_datetime(cohort["prediction_time"])
        if getattr(when.dt, "tz", None) is not None:  # align() reads zoned times as UTC
            when = when.dt.tz_convert("UTC").dt.tz_localize(None)
        window = (pa.array(cohort["subject_id"].to_numpy(np.int64)),
                  when.to_numpy().astype("datetime64[us]").astype(np.int64), lookback_hours)
    kept, problems, subjects = [], [], []
    for k, (shard, name) in enumerate(zip(shards, scan.shards, strict=True)):
        try:
            file = pq.ParquetFile(shard)
        except Exception:  # pyarrow raises several unrelated types for a bad file
            problems.append(f"MEDS shard {name} is not a readable Parquet file.")
            continue
        with file:
            read = not (labelled and cohort is None)  # a bad label file: the shards are only checked
            mine, problem = _scan_shard(file, k, name, scan, known, person, window,
                                        subjects if cohort is None else None, keep=read and not problems)
        if problem:
            problems.extend(problem)
        else:
            kept.extend(mine)
    if problems:
        raise SchemaError(problems, title=f"MEDS dataset {root} cannot be read")
    scan.events = _to_pandas(kept)
    if cohort is None:
        scan.subjects = np.unique(np.concatenate(subjects)) if subjects else np.array([], np.int64)
    return scan


def _scan_shard(file, k: int, name: str, scan: _Scan, known: set[str], person: set[str], window,  # noqa: ANN001, PLR0913
                subjects: list | None, *, keep: bool) -> tuple[list, list[str]]:
    """One shard, batch by batch: (its kept rows as pyarrow tables, its problems). Its rows are kept (and
    counted in ``scan``) only while ``keep`` and no problem is seen; ``subjects``: where to add its subject ids."""
    unreadable = [f"MEDS shard {name} is not a readable Parquet file."]
    try:
        columns = [c for c in _COLUMNS if c in file.schema_arrow.names]
        if _text_ids_that_change_in(file):
            return [], [_text_ids_problem(name)]
        batches = iter(file.iter_batches(batch_size=BATCH_ROWS, columns=columns))
    except Exception:  # pyarrow raises several unrelated types for a bad file
        return [], unreadable
    mine, empty, start = [], {}, 0
    while True:
        try:
            batch = next(batches, None)
        except Exception:  # a bad page after good ones
            return [], unreadable
        if batch is None:
            if start == 0:  # no row: the schema is still checked, on none
                problem = _checked(file.schema_arrow.empty_table().select(columns), name)[1]
                if problem:
                    return [], [problem]
            break
        table, problem = _checked(batch, name)
        if problem is not None:
            return [], [problem]
        _count_empty(table, start, empty)
        if len(table):
            scan.zoned[name] = _zoned(batch, "time")
        if keep and not empty:
            mine.append(_keep(table, k, start, scan, known, person, window))
            if subjects is not None:
                subjects.append(np.unique(table["subject_id"].to_numpy()))
        start += len(table)
    return mine, _empty_problems(empty, f"MEDS shard {name}")


def _text_ids_problem(name: str) -> str:
    return (f"MEDS shard {name}: subject_id is text, and some ids are not plain "
            "integers (leading zeros, signs or spaces): read as int64, as MEDS requires, two "
            "patients ('007', '7') would become one. Write subject_id as int64, mapping each "
            "local id to one integer.")


def _text_ids_that_change_in(file) -> bool:  # noqa: ANN001 - a pyarrow ParquetFile
    """:func:`_text_ids_that_change` over a whole shard, reading its subject_id column only (and only if text)."""
    import pyarrow as pa

    if "subject_id" not in file.schema_arrow.names:
        return False
    kind = file.schema_arrow.field("subject_id").type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        return False
    return any(_text_ids_that_change(pa.Table.from_batches([b]))
               for b in file.iter_batches(batch_size=BATCH_ROWS, columns=["subject_id"]))


def _checked(batch, name: str):  # noqa: ANN001, ANN202 - a pyarrow RecordBatch or Table -> (Table | None, problem)
    """The batch aligned to the MEDS data schema (``numeric_value`` added if absent), or the shard's problem."""
    import meds
    import pyarrow as pa

    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    if "numeric_value" not in table.column_names:  # optional in the MEDS schema: no event has a value
        table = table.append_column("numeric_value", pa.nulls(len(table), pa.float32()))
    try:
        return meds.DataSchema.align(table), None
    except Exception as exc:  # the meds schema names the missing or mistyped columns
        return None, (f"MEDS shard {name} does not fit the MEDS data schema ({type(exc).__name__}: "
                      f"{_schema_reason(exc)}). Required: subject_id int64, time timestamp[us], code string, "
                      "numeric_value float32.")


def _count_empty(table, start: int, empty: dict) -> None:  # noqa: ANN001 - a pyarrow Table
    """Add the batch's empty subject_id and code cells to ``empty`` (column -> [rows, first 6 row numbers])."""
    import pyarrow.compute as pc

    for col in ("subject_id", "code"):
        if col in table.column_names and table[col].null_count:
            rows = np.flatnonzero(pc.is_null(table[col]).to_numpy(zero_copy_only=False)) + start + 1
            seen = empty.setdefault(col, [0, []])
            seen[0] += len(rows)
            seen[1].extend(rows[: 6 - len(seen[1])].tolist())


def _empty_problems(empty: dict, where: str) -> list[str]:
    """:func:`_empty_cells`' problems from counts gathered batch by batch."""
    out = []
    for col in ("subject_id", "code"):
        if col in empty:
            n, rows = empty[col]
            shown = ", ".join(str(r) for r in rows[:5]) + (", ..." if n > 5 else "")
            out.append(f"{where}: {col} is empty in {n} row(s) (rows: {shown}). MEDS requires it in "
                       "every row: fill it, or drop those rows in the export.")
    return out


def _unit_text(column):  # noqa: ANN001, ANN202 - a pyarrow ChunkedArray -> large_string
    """An extra ``unit`` column as text (a non-text unit is no unit, as ``isinstance(u, str)`` read it)."""
    import pyarrow as pa

    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return column.cast(pa.large_string())
    return pa.nulls(len(column), pa.large_string())


def _keep(table, k: int, start: int, scan: _Scan, known: set[str], person: set[str], window):  # noqa: ANN001, ANN202
    """The rows of one aligned batch that are read (see :func:`_read_shards`); the others counted in ``scan``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    code = table["code"].combine_chunks().dictionary_encode()
    distinct = code.dictionary.to_pylist()
    for c in distinct:
        if c not in scan.split:
            scan.split[c] = split_code(c, known)
    idx = code.indices.to_numpy(zero_copy_only=False)
    mapped = np.array([scan.split[c][0] in known for c in distinct], dtype=bool)[idx]
    read = np.array([c in person for c in distinct], dtype=bool)[idx]
    keep = mapped | read
    if window is not None:
        ids, origin, lookback = window
        pos = pc.fill_null(pc.index_in(table["subject_id"], value_set=ids), -1).to_numpy(zero_copy_only=False)
        in_cohort = pos >= 0
        scan.outside += int((~in_cohort).sum())
        keep &= in_cohort
        timed = in_cohort & mapped & ~read & ~pc.is_null(table["time"]).to_numpy(zero_copy_only=False)
        if timed.any():
            us = pc.fill_null(table["time"].cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
            delta = us - origin[np.where(in_cohort, pos, 0)]
            after = timed & (delta > 0)
            before = timed & (delta < -float(lookback) * 3.6e9 - _MARGIN_US) if lookback is not None else \
                np.zeros(len(delta), bool)
            scan.after += int(after.sum())
            scan.before += int(before.sum())
            keep &= ~(after | before)
    else:
        in_cohort = np.ones(len(idx), bool)
    counts = np.bincount(idx[in_cohort & ~mapped & ~read], minlength=len(distinct))
    for j in np.flatnonzero(counts):
        scan.dropped_codes[distinct[j]] = scan.dropped_codes.get(distinct[j], 0) + int(counts[j])
    rows = np.flatnonzero(keep)
    out = {"subject_id": table["subject_id"].take(rows), "time": table["time"].take(rows),
           "code": code.take(pa.array(rows)), "numeric_value": table["numeric_value"].take(rows)}
    if "text_value" in table.column_names:
        out["text_value"] = table["text_value"].take(rows).cast(pa.large_string())
    if "unit" in table.column_names:
        out["unit"] = _unit_text(table["unit"].take(rows))
    out["_shard"] = pa.array(np.full(len(rows), k, np.int32))
    out["_row"] = pa.array(rows.astype(np.int64) + start + 1)
    return pa.table(out)


def _to_pandas(kept: list) -> pd.DataFrame:
    """The kept batches as one frame (code categorical; a column some shards lack is empty there)."""
    import pyarrow as pa

    if not kept:
        kept = [pa.table({"subject_id": pa.array([], pa.int64()), "time": pa.array([], pa.timestamp("us")),
                          "code": pa.array([], pa.string()).dictionary_encode(),
                          "numeric_value": pa.array([], pa.float32()), "_shard": pa.array([], pa.int32()),
                          "_row": pa.array([], pa.int64())})]
    table = pa.concat_tables(kept, promote_options="permissive")
    del kept[:]
    return table.to_pandas(self_destruct=True, split_blocks=True)


def _text_ids_that_change(table) -> bool:  # noqa: ANN001 - a pyarrow Table
    """Whether a text subject_id column holds ids that reading them as integers would change."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if "subject_id" not in table.column_names:
        return False
    ids = table["subject_id"]
    if not (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type)):
        return False
    plain = pc.match_substring_regex(ids, r"^(0|[1-9][0-9]{0,17})$")
    return not pc.all(pc.or_kleene(plain, pc.is_null(ids))).as_py()


def _zoned(table, column: str) -> bool:  # noqa: ANN001 - a pyarrow Table
    """Whether ``column`` is a timestamp with a time zone (MEDS' is timestamp[us] without one)."""
    import pyarrow as pa

    return column in table.column_names and pa.types.is_timestamp(table[column].type) \
        and table[column].type.tz is not None


def _one_time_zone(zoned: dict[str, bool], labels: Path | None, labels_zoned: bool | None) -> None:
    """SchemaError unless the shards' times (and the label file's prediction times) are all with a
    time zone or all without: MEDS' align() converts zoned times to UTC, so a mix would shift
    events against each other and the prediction time by the UTC offset, silently (an event an
    hour after the prediction time read as a feature). ``zoned``: shard (with rows) -> zoned."""
    by_shard = sorted(zoned.items())
    kinds = {z for _, z in by_shard} | ({labels_zoned} if labels_zoned is not None else set())
    if len(kinds) > 1:
        names = [s for s, z in by_shard if z] + ([str(labels)] if labels_zoned else [])
        raise SchemaError(f"MEDS times mix time-zone-aware and naive timestamps (with a time zone: "
                          f"{', '.join(names[:5])}): read together, one side would be shifted by its UTC offset. "
                          "MEDS times are timestamp[us] without a time zone: write every shard and the label file "
                          "in the same local time (or all in UTC).", title="MEDS times cannot be compared")


def _empty_cells(df: pd.DataFrame, columns: tuple[str, ...], where: str) -> list[str]:
    """One problem a required column with empty cells, naming the rows (1-based, the first 5).

    meds' ``align()`` checks nulls before it casts, so a text or double ``subject_id`` with a null
    passes it (and then broke ``astype(int64)``)."""
    out = []
    for col in columns:
        rows = np.flatnonzero(df[col].isna().to_numpy()) + 1 if col in df.columns else np.array([], int)
        if len(rows):
            shown = ", ".join(str(r) for r in rows[:5]) + (", ..." if len(rows) > 5 else "")
            out.append(f"{where}: {col} is empty in {len(rows)} row(s) (rows: {shown}). MEDS requires it in "
                       "every row: fill it, or drop those rows in the export.")
    return out


def _schema_reason(exc: Exception) -> str:
    """The schema error's first line, cut: it names columns and types, not values."""
    return str(exc).splitlines()[0][:200] if str(exc) else "schema mismatch"


def _labels(path: Path) -> pd.DataFrame:
    import meds
    import pyarrow.parquet as pq

    try:
        raw = pq.read_table(path)
        zoned = _zoned(raw, "prediction_time")
        table = meds.LabelSchema.align(raw)
    except FileNotFoundError:
        raise ConfigError(f"MEDS label file {path} does not exist.") from None
    except Exception as exc:
        raise SchemaError(f"MEDS label file {path} does not fit the MEDS label schema ({_schema_reason(exc)}). "
                          "It needs subject_id, prediction_time and boolean_value.",
                          title="MEDS labels cannot be read") from None
    df = table.to_pandas()
    df.attrs["zoned"] = zoned
    empty = _empty_cells(df, ("subject_id", "prediction_time"), f"MEDS label file {path}")
    if empty:
        raise SchemaError(empty, title="MEDS labels cannot be read")
    if "boolean_value" not in df.columns or df["boolean_value"].isna().all():
        raise SchemaError(f"MEDS label file {path} has no boolean_value set. Clinograph's tasks are binary: write "
                          "the outcome as boolean_value.", title="MEDS labels cannot be read")
    return df


#: the last code part MEDS ETLs write for a lab without a unit (``LAB//50912//UNK``): no unit
NO_UNIT = "UNK"


def _system_code(base: str) -> str:
    """``loinc/2345-7`` -> ``LOINC/2345-7``; MEDS' own ``//`` separator: ``LAB//50912`` -> ``LAB/50912``."""
    system, sep, rest = base.partition("/")
    return f"{system.strip().upper()}{sep}{rest.removeprefix('/').strip()}"


def split_code(code: str, known: frozenset[str] | set[str] = frozenset()) -> tuple[str, str | None]:
    """(``SYSTEM/CODE``, unit) of a MEDS code: ``"LOINC/2345-7//mg/dL"`` -> (``"LOINC/2345-7"``,
    ``"mg/dL"``); MEDS' ``//``-separated codes as MEDS ETLs write labs, ``"LAB//50912//mg/dL"`` ->
    (``"LAB/50912"``, ``"mg/dL"``); the system upper-cased. The whole code is the code if it is one
    of ``known`` (the dictionary's codes), else all but a last ``//`` part, which is the unit
    (``UNK``: none)."""
    parts = code.split("//")
    candidates = [(_system_code(code), None)]
    if len(parts) > 1:
        candidates.append((_system_code("//".join(parts[:-1])), parts[-1].strip()))
    base, unit = next((c for c in candidates if c[0] in known), candidates[-1])
    return base, None if unit in (None, "", NO_UNIT) else unit


def read_meds(root: str | Path, *, dictionary: FeatureDictionary, site: str, labels: str | Path | None,
              lookback_hours: float | None, snapshot_hours: float = 24.0,
              units: dict[str, str] | None = None, censored: CensorPolicy | None = None,
              age: str | None = None, sex=None) -> EhrExtract:  # noqa: ANN001 - a sources.MedsSex
    """A MEDS dataset as an :class:`EhrExtract` (long table + schema + report).

    ``labels``: a MEDS label Parquet file (one prediction time per subject), or None for an
    unlabeled extract. ``lookback_hours``: how far before the prediction time events are read
    (required with labels; None only for an unlabeled extract, which reads every event).
    ``units``: feature id -> unit of its events that carry none. ``censored``: how a
    ``text_value`` such as ``<0.5`` (``numeric_value`` empty) is read (:mod:`.ehr_values`).
    Patient ids are the subject ids, as text. ``age``: a numeric feature given the years from the
    subject's ``MEDS_BIRTH`` to the prediction time (unlabeled: to the first mapped event), as OMOP's
    age at the index date; ``sex``: the feature, its level codes and the MEDS codes of male and
    female (``GENDER//M``, ``GENDER//F``); both read at the prediction time's snapshot.

    Raises:
        ConfigError: the folder or label file does not exist, or labels without lookback_hours.
        UnitError: numeric events without a unit and no declared one (every feature at once).
        SchemaError: shards or labels do not fit the MEDS schema (all shards named at once; a text
            subject_id whose ids reading as int64 would change, such as '007', too), or a
            subject has several prediction times.
    """
    root = Path(root)
    if labels is not None and lookback_hours is None:
        raise ConfigError("MEDS with labels needs lookback_hours: how far before the prediction time events are read "
                          "as features (a years-old event is not a snapshot of today). Set lookback_hours under "
                          "[meds] in the source file.")
    import meds

    declared_features(section="[meds]", person_section="[meds]", age=age, sex=sex, conditions=(),
                      units=dict(units or {}), dictionary=dictionary)
    known = set(dictionary.by_code())
    person = ({meds.birth_code} if age else set()) | ({sex.male_code, sex.female_code} if sex is not None else set())
    lab, bad_labels = None, None
    if labels is not None:  # read first (its subjects and times filter the shards), its errors raised after theirs
        try:
            lab = _labels(Path(labels))
        except (ConfigError, SchemaError) as exc:
            bad_labels = exc
    scan = _read_shards(root, known=known, person=person, cohort=lab, labelled=labels is not None,
                        lookback_hours=lookback_hours)
    if bad_labels is not None:
        raise bad_labels
    events = scan.events
    sid = events["subject_id"].astype(np.int64)
    raw = events["code"]  # categorical: per-row work below is per distinct code, then taken
    names = raw.cat.categories.astype(str).tolist()
    split = scan.split

    def per_row(values: list, dtype: object = object) -> np.ndarray:
        """A value a distinct code (``names``' order) as one value a kept event."""
        return np.asarray(values, dtype=dtype)[raw.cat.codes.to_numpy()] if len(raw) else np.array([], dtype)

    code_unit = per_row([split[c][1] for c in names])
    unit = code_unit
    if "unit" in events.columns:  # an extra unit column wins where it holds text
        given = events["unit"].to_numpy(dtype=object)
        text = np.fromiter((isinstance(u, str) and bool(u.strip()) for u in given), bool, len(given))
        unit = np.where(text, given, code_unit)
    t = pd.to_datetime(events["time"])
    is_mapped = per_row([split[c][0] in known for c in names], bool)
    if labels is not None:
        _one_time_zone(scan.zoned, Path(labels), lab.attrs["zoned"])
        repeated = lab["subject_id"].duplicated(keep=False)
        if repeated.any():
            raise SchemaError(f"MEDS label file {labels}: {int(lab.loc[repeated, 'subject_id'].nunique())} subject(s) "
                              "have several prediction times. Keep one per subject (one task row a patient).",
                              title="MEDS labels cannot be read")
        origin = pd.Series(pd.to_datetime(lab["prediction_time"]).to_numpy(), index=lab["subject_id"].astype(np.int64))
        y = pd.Series(lab["boolean_value"].astype(float).to_numpy(), index=[str(s) for s in lab["subject_id"]])
        subjects = [str(s) for s in origin.index]
    else:  # times count from the subject's first mapped event (not MEDS_BIRTH, decades before)
        _one_time_zone(scan.zoned, None, None)
        mapped = is_mapped & t.notna().to_numpy()
        origin = t[mapped].groupby(sid[mapped]).min()
        y, subjects = None, [str(s) for s in scan.subjects.tolist()]
    # copy: written below, and pandas 3 (copy-on-write) hands out a read-only view
    # reindex, not map: pandas 3 cannot map through an empty Series of times (no event mapped)
    hours = ((t - origin.reindex(sid).to_numpy()) / pd.Timedelta(hours=1)).to_numpy(dtype=float, copy=True)
    del t
    static = events["time"].isna().to_numpy()
    hours[static] = 0.0
    # the shards' pass kept only subjects in the cohort (it counted the others: scan.outside)
    in_cohort = sid.isin(origin.index).to_numpy() if labels is not None else np.ones(len(sid), bool)
    # the window is the features': codes outside the dictionary (MEDS_BIRTH, ...) are counted as such, whenever
    # they are, and never copied on (most of a MEDS dataset's events are such codes; the shards' pass dropped
    # those it does not read, and the dictionary events surely outside the window, counted)
    timed = is_mapped & ~static
    keep = in_cohort & is_mapped & (static | (hours <= 0 if labels is not None else np.ones(len(hours), bool)))
    after = in_cohort & timed & (hours > 0) if labels is not None else np.zeros(len(hours), bool)
    before = np.zeros(len(hours), bool)
    if lookback_hours is not None and labels is not None:
        before = in_cohort & timed & (hours < -lookback_hours)
        keep &= ~before
    codes = per_row([split[c][0] for c in names])
    value = events["numeric_value"].to_numpy(dtype=float, copy=True)
    kinds = {k: f.kind for k, f in dictionary.by_code().items()}
    kind = [kinds.get(split[c][0]) for c in names]
    presence = per_row([k == FeatureKind.BINARY for k in kind], bool) & np.isnan(value)
    value[presence] = 1.0
    numeric = per_row([k == FeatureKind.NUMERIC for k in kind], bool)
    censor = np.full(len(value), None, dtype=object)
    from_text = marked = substituted = 0
    if "text_value" in events.columns:  # numeric_value 0.5 beside text_value "<0.5": censored, not exact
        marked, substituted = censoring_in_text(np.where(numeric & keep, value, np.nan), events["text_value"], censor)
    if "text_value" in events.columns:  # "<0.5" as text_value, numeric_value empty: a censored lab
        for i in np.flatnonzero(numeric & np.isnan(value) & keep & events["text_value"].notna().to_numpy()):
            number, op = parse_value_text(events["text_value"].iat[i])
            if number is not None:
                value[i], censor[i], from_text = number, op, from_text + 1
    no_value = numeric & np.isnan(value) & keep
    # a categorical feature's event without numeric_value (smoking status as text_value): its level is not
    # read (as OMOP's value_as_concept_id and FHIR's valueCodeableConcept are not): counted and excluded
    no_level = per_row([k == FeatureKind.CATEGORICAL for k in kind], bool) & np.isnan(value) & keep
    keep &= ~(no_value | no_level)
    shard_names = np.asarray(scan.shards, dtype=object)
    shard_of, row_of = events["_shard"].to_numpy(), events["_row"].to_numpy()

    def where(mask: np.ndarray) -> np.ndarray:
        """``data/0.parquet row 12`` of the events in ``mask`` (built for those only: one string an event)."""
        return np.array([f"{s} row {r}" for s, r in zip(shard_names[shard_of[mask]], row_of[mask], strict=True)],
                        dtype=object)

    name_of = {s: str(s) for s in pd.unique(sid)}  # one string a subject, not one an event (10^6 events)
    read_by_person = np.zeros(len(keep), bool)  # MEDS_BIRTH and sex codes read as age and sex
    person, person_notes = _person(raw, sid, events["time"], origin, where, in_cohort, read_by_person, age=age,
                                   sex=sex, name_of=name_of,
                                   binary=sex is not None and dictionary.get(sex.feature).kind == FeatureKind.BINARY)
    prefix = np.asarray([f"{s} row " for s in scan.shards], dtype=object)  # records made text when kept
    columns = {"patient_id": sid[keep].map(name_of).to_numpy(dtype=object), "hours": hours[keep],
               "code": codes[keep], "value": value[keep], "unit": unit[keep], "censor": censor[keep],
               "where_prefix": prefix[shard_of[keep]], "where_row": row_of[keep]}
    if len(person):  # appended column by column (a concat of frames copied every kept event once more)
        person = person.rename(columns={"where": "where_prefix"}).assign(where_row=np.int64(-1))
        columns = {c: _appended(a, person[c].to_numpy()) for c, a in columns.items()}
    frame = pd.DataFrame(columns)
    del columns
    n_after, n_before = scan.after + int(after.sum()), scan.before + int(before.sum())
    excluded = {"outside the cohort": scan.outside, "after the prediction time": n_after,
                "before the lookback": n_before, "numeric code without numeric_value": int(no_value.sum()),
                "categorical code without numeric_value": int(no_level.sum())}
    notes = (f"events outside the cohort or after the prediction time: {scan.outside + n_after}",
             *([f"events before the lookback ({lookback_hours} h before the prediction time; excluded): "
                f"{n_before}"] if lookback_hours is not None else []),
             f"codes of binary features without numeric_value, read as present: {int((presence & keep).sum())}",
             f"events of numeric features without numeric_value (excluded): {int(no_value.sum())}",
             *([f"events of categorical features without numeric_value (their level is not read; excluded): "
                f"{int(no_level.sum())}"] if no_level.any() else []),
             *([f"values read from text_value: {from_text}"] if from_text else []),
             *([f"values censored by their text_value (numeric_value beside a text_value such as '<0.5'): "
                f"{marked}"] if marked else []),
             *([f"values whose text_value is censored but whose numeric_value differs from its bound (an ETL's "
                f"substitute; read as numeric_value): {substituted}"] if substituted else []))
    unmapped = {b for b, _ in split.values() if b not in known}
    notes += person_notes + _parent_hints(root, unmapped, known, dictionary)
    outside = pd.Series(codes[in_cohort & ~is_mapped & ~read_by_person]).value_counts().to_dict()
    for c, n in scan.dropped_codes.items():  # the rows the shards' pass counted without keeping
        outside[split[c][0]] = outside.get(split[c][0], 0) + n
    del events, sid, hours, codes, value, unit, censor
    return to_long(frame, labels=y, patients=subjects, dictionary=dictionary, site=site, source="MEDS",
                   snapshot_hours=snapshot_hours, notes=notes, units=units, censored=censored,
                   setting="[meds] in the source file",
                   excluded=excluded, unmapped={str(c): int(n) for c, n in outside.items()})


def _appended(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a`` then ``b``, in ``a``'s dtype when ``b`` fits it (as pd.concat would: float values stay float)."""
    if a.dtype != object and b.dtype == object:
        return np.concatenate([a.astype(object), b])
    return np.concatenate([a, b.astype(a.dtype)]) if a.dtype != object else np.concatenate([a, b.astype(object)])


def _person(raw: pd.Series, sid: pd.Series, t: pd.Series, origin: pd.Series, where, in_cohort: np.ndarray,  # noqa: ANN001
            read: np.ndarray, *, age: str | None, sex, binary: bool,  # noqa: ANN001 - a sources.MedsSex
            name_of: dict) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """Age (years from MEDS_BIRTH to each subject's time 0) and sex (its male/female codes) as events at
    hour 0; the rows read (MEDS_BIRTH, the sex codes) are marked in ``read`` (in place: not unmapped codes).
    A subject with several birth times or both sex codes gets none (counted). ``raw``: the codes (categorical);
    ``where``: the source records of the events in a mask."""
    import meds

    frames, notes = [], []
    if age:
        born = in_cohort & (raw == meds.birth_code).to_numpy() & t.notna().to_numpy()
        read |= born  # read as the age, not counted as a code outside the dictionary
        births = t[born].groupby(sid[born].to_numpy())
        several = births.nunique() > 1
        first = births.min()[~several]
        first = first[first.index.isin(origin.index)]
        years = ((origin.reindex(first.index) - first) / pd.Timedelta(days=365.25)).to_numpy(dtype=float)
        place = pd.Series(where(born)).groupby(sid[born].to_numpy()).first().reindex(first.index)
        frames.append(pd.DataFrame({"patient_id": first.index.map(name_of), "code": f"FEATURE/{age}", "value": years,
                                    "unit": "a", "where": place.to_numpy()}))
        notes.append(f"subjects in the cohort without one {meds.birth_code} time (age missing): "
                     f"{int(len(origin) - len(first))}")
    if sex is not None:
        codes = {sex.male_code: sex.male, sex.female_code: sex.female}
        rows = in_cohort & raw.isin(list(codes)).to_numpy()
        read |= rows
        level = raw[rows].astype(str).map(codes)
        by_subject = level.groupby(sid[rows].to_numpy())
        one = by_subject.nunique() == 1
        value = by_subject.first()[one]
        value = value[value.index.isin(origin.index)]
        place = pd.Series(where(rows)).groupby(sid[rows].to_numpy()).first().reindex(value.index)
        frames.append(pd.DataFrame({"patient_id": value.index.map(name_of), "code": f"FEATURE/{sex.feature}",
                                    "value": (value.astype(float) if binary else value).to_numpy(dtype=object), "unit": None, "where": place.to_numpy()}))
        notes.append(f"subjects in the cohort without one of {sex.male_code!r} / {sex.female_code!r} (sex missing): "
                     f"{int(len(origin) - len(value))}")
    frames = [f for f in frames if len(f)]
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return (out.assign(hours=0.0, censor=None) if len(out) else out), tuple(notes)


def _parent_hints(root: Path, unmapped: set[str], known: set[str], dictionary: FeatureDictionary) -> tuple[str, ...]:
    """A report line naming the codes outside the dictionary that the dataset's own
    ``metadata/codes.parquet`` links to a dictionary code by ``parent_codes`` (``LAB//50912//mg/dL``
    -> ``LOINC/2160-0``): never mapped by that link (a parent may be broader), but shown, with the fix."""
    import pyarrow.parquet as pq

    path = root / "metadata" / "codes.parquet"
    if not unmapped or not path.is_file():
        return ()
    try:
        codes = pq.read_table(path, columns=["code", "parent_codes"]).to_pylist()
    except Exception:  # pyarrow raises several types; metadata is optional in MEDS
        return ("metadata/codes.parquet has no readable code and parent_codes columns (not used)",)
    by_code = dictionary.by_code()
    hints = sorted({f"{base} -> {parent} ({by_code[parent].id!r})" for row in codes
                    if isinstance(row.get("code"), str) and (base := split_code(row["code"], known)[0]) in unmapped
                    for parent in (split_code(p, known)[0] for p in row.get("parent_codes") or () if isinstance(p, str))
                    if parent in known})
    if not hints:
        return ()
    system, _, code = hints[0].split(" -> ")[0].partition("/")
    return (f"codes outside the dictionary whose parent_codes in metadata/codes.parquet are dictionary codes (not "
            f"mapped by that link: a parent may be broader): {len(hints)} ({'; '.join(hints[:5])}). If a code measures "
            f"the same, add it to the feature's codes in the dictionary (e.g. {system.lower()} = \"{code}\").",)

