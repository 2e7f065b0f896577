"""OMOP CDM v5.4 -> the long table :func:`ingest` takes, through SQLAlchemy.

Reads ``person``, ``visit_occurrence``, ``condition_occurrence``, ``measurement`` and
``observation``. The cohort is a SQL query (returning ``person_id`` and ``index_datetime``) or
a concept set (persons with a visit or a condition of the given concepts; the index time is the
first one). Features are the ``measurement`` and ``observation`` rows whose concept is a
dictionary feature's ``omop_concept_id``, taken from ``lookback_days`` before the index time to
``after_days`` after it, binned into snapshots of ``snapshot_hours`` from the index time. Units
come from ``unit_source_value`` (UCUM, read through pint). The label is 1 if a condition or an
observation of the label's concept set starts within ``window_days`` after the index time.

Engines: :func:`omop_engine` opens DuckDB (embedded: a ``.duckdb`` file, or a folder of
``<table>.csv``/``.parquet`` files); any SQLAlchemy URL works, e.g.
``postgresql+psycopg://reader@db.hospital.local/cdm`` with ``cdm_schema = "cdm"``. Queries are
the same on both: bound parameters, no dialect-specific date arithmetic (windows are applied
after reading the cohort's rows).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from clinograph.secure.errors import ConfigError, SchemaError
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..ontology.dictionary import FeatureDictionary
from .extract import EhrExtract, to_long

REQUIRED = {
    "person": ("person_id", "person_source_value"),
    "visit_occurrence": ("person_id", "visit_concept_id", "visit_start_date", "visit_start_datetime"),
    "condition_occurrence": ("person_id", "condition_concept_id", "condition_start_date", "condition_start_datetime"),
    "measurement": ("person_id", "measurement_concept_id", "measurement_date", "measurement_datetime",
                    "value_as_number", "unit_source_value"),
    "observation": ("person_id", "observation_concept_id", "observation_date", "observation_datetime",
                    "value_as_number", "unit_source_value"),
}
_IDENT = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"
#: Why the f-string SQL here is not an injection vector: the only text put into a statement is
#: a table or column name from this module's constants, the cdm_schema (validated against
#: _IDENT), a file path (quoted) and the cohort ``sql`` -- the integrator's own query from
#: their own configuration, run with their own (read-only, see docs/ehr_formats.md) database
#: role. Every value (concept ids) is a bound parameter.
_SQL_NOTE = None


class OmopCohort(BaseModel):
    """Who is in the cohort and when each person's index time is: ``sql`` or a concept set."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sql: str | None = Field(default=None, min_length=1, max_length=20_000,
                            description="SELECT returning person_id and index_datetime")
    visit_concept_ids: tuple[int, ...] = ()
    condition_concept_ids: tuple[int, ...] = ()

    @model_validator(mode="after")
    def _one_way(self) -> OmopCohort:
        ways = [self.sql is not None, bool(self.visit_concept_ids), bool(self.condition_concept_ids)]
        if sum(ways) != 1:
            raise ValueError("define the cohort one way: sql, visit_concept_ids or condition_concept_ids "
                             f"({sum(ways)} given)")
        return self


class OmopLabel(BaseModel):
    """The label: 1 if a condition or observation of these concepts starts within the window."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    condition_concept_ids: tuple[int, ...] = ()
    observation_concept_ids: tuple[int, ...] = ()
    window_days: float = Field(gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _some(self) -> OmopLabel:
        if not (self.condition_concept_ids or self.observation_concept_ids):
            raise ValueError("the label needs condition_concept_ids or observation_concept_ids")
        return self


class OmopSource(BaseModel):
    """How one hospital's OMOP CDM becomes a long table (strict: unknown keys are errors)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    site: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
    cohort: OmopCohort
    label: OmopLabel | None = Field(description="None: an unlabeled extract")
    cdm_schema: str | None = Field(default=None, pattern=_IDENT)
    patient_id: Literal["person_id", "person_source_value"] = "person_id"
    lookback_days: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    after_days: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    snapshot_hours: float = Field(default=24.0, gt=0, allow_inf_nan=False)


def omop_engine(location: str | Path):  # -> sqlalchemy.Engine
    """An SQLAlchemy engine: a database URL as given, else embedded DuckDB over a file or folder.

    A ``.duckdb`` file is opened read-only; a folder of ``<table>.csv`` / ``<table>.parquet``
    files becomes an in-memory DuckDB with one view a file.

    Raises:
        ConfigError: the path does not exist or holds no OMOP table file.
    """
    import sqlalchemy as sa

    text = str(location)
    if "://" in text:
        return sa.create_engine(text)
    path = Path(text)
    if path.is_file():
        return sa.create_engine(f"duckdb:///{path}", connect_args={"read_only": True})
    if not path.is_dir():
        raise ConfigError(f"OMOP location {path} does not exist. Give a .duckdb file, a folder of OMOP table "
                          "files (person.csv, measurement.parquet, ...), or a database URL.")
    files = {p.stem.lower(): p for p in sorted(path.iterdir()) if p.suffix.lower() in (".csv", ".parquet")}
    if not set(files) & set(REQUIRED):
        raise ConfigError(f"OMOP folder {path} holds no table file named after an OMOP table "
                          f"({', '.join(f'{t}.csv' for t in REQUIRED)}).")
    engine = sa.create_engine("duckdb:///:memory:", poolclass=sa.pool.StaticPool)
    with engine.begin() as conn:
        for table, p in files.items():
            if re.match(_IDENT, table):
                reader = "read_parquet" if p.suffix.lower() == ".parquet" else "read_csv_auto"
                conn.exec_driver_sql(f"CREATE VIEW {table} AS SELECT * FROM {reader}('{_quote(p)}')")  # noqa: S608 (see _SQL_NOTE)
    return engine


def _quote(path: Path) -> str:
    return str(path).replace("'", "''")


def check_cdm(engine, *, cdm_schema: str | None = None) -> None:
    """Every table and column :func:`read_omop` reads exists; all problems at once.

    Raises:
        SchemaError: naming each missing table or column.
    """
    import sqlalchemy as sa

    where = f"schema {cdm_schema!r}" if cdm_schema else "the default schema"
    problems = []
    for table, cols in REQUIRED.items():  # by a zero-row SELECT: works on every dialect, no inspection
        name = f"{cdm_schema}.{table}" if cdm_schema else table
        try:
            with engine.connect() as conn:
                have = {str(k).lower() for k in conn.execute(sa.text(f"SELECT * FROM {name} WHERE 1 = 0")).keys()}  # noqa: S608 (see _SQL_NOTE)
        except sa.exc.SQLAlchemyError:
            problems.append(f"OMOP table {table!r} is missing in {where} (or cannot be read). Load it from the CDM "
                            "v5.4 export, set cdm_schema to the schema that holds the CDM, or grant the reader "
                            "SELECT on it.")
            continue
        missing = [c for c in cols if c not in have]
        if missing:
            problems.append(f"OMOP table {table!r} lacks column(s) {missing} (CDM v5.4 names). Export the table "
                            "with its CDM v5.4 columns.")
    if problems:
        raise SchemaError(problems, title="The database is not an OMOP CDM v5.4 instance Clinograph can read")


def _t(source: OmopSource, table: str) -> str:
    return f"{source.cdm_schema}.{table}" if source.cdm_schema else table


def _cohort_sql(source: OmopSource) -> tuple[str, dict]:
    c = source.cohort
    if c.sql is not None:
        return c.sql.strip().rstrip(";"), {}
    if c.visit_concept_ids:
        return (f"SELECT person_id, MIN(COALESCE(visit_start_datetime, CAST(visit_start_date AS TIMESTAMP))) "  # noqa: S608 (see _SQL_NOTE)
                f"AS index_datetime FROM {_t(source, 'visit_occurrence')} WHERE visit_concept_id IN :cohort_ids "
                "GROUP BY person_id", {"cohort_ids": list(c.visit_concept_ids)})
    return (f"SELECT person_id, MIN(COALESCE(condition_start_datetime, CAST(condition_start_date AS TIMESTAMP))) "  # noqa: S608 (see _SQL_NOTE)
            f"AS index_datetime FROM {_t(source, 'condition_occurrence')} WHERE condition_concept_id IN :cohort_ids "
            "GROUP BY person_id", {"cohort_ids": list(c.condition_concept_ids)})


def _query(conn, sql: str, params: dict) -> pd.DataFrame:
    import sqlalchemy as sa

    stmt = sa.text(sql)
    for key, value in params.items():
        if isinstance(value, list):
            stmt = stmt.bindparams(sa.bindparam(key, expanding=True))
    result = conn.execute(stmt, params)
    return pd.DataFrame(result.fetchall(), columns=list(result.keys()))


def read_omop(engine, *, source: OmopSource, dictionary: FeatureDictionary) -> EhrExtract:
    """The cohort's features and labels as an :class:`EhrExtract` (long table + schema + report).

    Measurement/observation rows of cohort persons whose concept is a dictionary feature's
    ``omop_concept_id`` are read; the others are only counted (by concept, in SQL).

    Raises:
        SchemaError: tables or columns are missing, or the cohort query does not return
            ``person_id`` and ``index_datetime``.
    """
    import sqlalchemy as sa

    check_cdm(engine, cdm_schema=source.cdm_schema)
    cohort_sql, params = _cohort_sql(source)
    with engine.connect() as conn:
        try:
            cohort = _query(conn, cohort_sql, params)
        except sa.exc.SQLAlchemyError as exc:
            raise SchemaError(f"The cohort query of site {source.site!r} failed ({type(exc.orig or exc).__name__}). "
                              "Check it against the CDM: it must SELECT person_id, index_datetime.",
                              title="Cohort query failed") from None
        missing = [c for c in ("person_id", "index_datetime") if c not in cohort.columns]
        if missing:
            raise SchemaError(f"The cohort query of site {source.site!r} returns no column(s) {missing}. "
                              "SELECT person_id and index_datetime (AS index_datetime).",
                              title="Cohort query has the wrong columns")
        frames, unmapped = [], {}
        ids = {"feature_ids": [f.omop_concept_id for f in dictionary.features if f.omop_concept_id] or [-1]}
        for table in ("measurement", "observation"):
            sql = (f"WITH cohort AS ({cohort_sql}) SELECT x.person_id, x.{table}_concept_id AS concept_id, "  # noqa: S608 (see _SQL_NOTE)
                   f"COALESCE(x.{table}_datetime, CAST(x.{table}_date AS TIMESTAMP)) AS t, "
                   f"x.value_as_number AS value, x.unit_source_value AS unit "
                   f"FROM {_t(source, table)} x JOIN cohort c ON x.person_id = c.person_id "
                   f"WHERE x.{table}_concept_id IN :feature_ids")
            frames.append(_query(conn, sql, {**params, **ids}))
            other = _query(conn, f"WITH cohort AS ({cohort_sql}) SELECT x.{table}_concept_id AS concept_id, "  # noqa: S608 (see _SQL_NOTE)
                                 f"COUNT(*) AS n FROM {_t(source, table)} x JOIN cohort c ON x.person_id = c.person_id "
                                 f"WHERE x.{table}_concept_id NOT IN :feature_ids GROUP BY x.{table}_concept_id",
                           {**params, **ids})
            for c, n in zip(other["concept_id"], other["n"], strict=True):
                k = f"OMOP/{int(c)}" if pd.notna(c) else "OMOP/(none)"
                unmapped[k] = unmapped.get(k, 0) + int(n)
        label_frames = []
        if source.label is not None:
            for table, ids in (("condition_occurrence", source.label.condition_concept_ids),
                               ("observation", source.label.observation_concept_ids)):
                if ids:
                    prefix = table.split("_")[0]
                    start = "start_" if table == "condition_occurrence" else ""
                    sql = (f"WITH cohort AS ({cohort_sql}) SELECT x.person_id, "  # noqa: S608 (see _SQL_NOTE)
                           f"COALESCE(x.{prefix}_{start}datetime, CAST(x.{prefix}_{start}date AS TIMESTAMP)) AS t "
                           f"FROM {_t(source, table)} x JOIN cohort c ON x.person_id = c.person_id "
                           f"WHERE x.{prefix}_concept_id IN :label_ids")
                    label_frames.append(_query(conn, sql, {**params, "label_ids": list(ids)}))
        person = _query(conn, f"SELECT person_id, person_source_value FROM {_t(source, 'person')}", {})  # noqa: S608 (see _SQL_NOTE)
    return _assemble(cohort, frames, label_frames, person, unmapped, source=source, dictionary=dictionary)


def _assemble(cohort, frames, label_frames, person, unmapped, *, source: OmopSource, dictionary) -> EhrExtract:
    cohort = cohort.dropna(subset=["person_id"]).drop_duplicates("person_id")
    index = pd.Series(pd.to_datetime(cohort["index_datetime"]).to_numpy(), index=cohort["person_id"].astype(np.int64))
    if source.patient_id == "person_source_value":
        names = dict(zip(person["person_id"].astype(np.int64), person["person_source_value"].astype(str), strict=True))
    else:
        names = {}
    key = (lambda pid: names.get(int(pid), str(int(pid)))) if names else (lambda pid: str(int(pid)))
    patients = [key(p) for p in index.index]
    rows = pd.concat([f for f in frames if len(f)], ignore_index=True) if any(len(f) for f in frames) else \
        pd.DataFrame(columns=["person_id", "concept_id", "t", "value", "unit"])
    t = pd.to_datetime(rows["t"])
    start = rows["person_id"].astype(np.int64).map(index)
    hours = ((t - start) / pd.Timedelta(hours=1)).to_numpy(dtype=float)
    keep = (hours >= -24.0 * source.lookback_days) & (hours <= 24.0 * source.after_days)
    rows = rows[keep]
    events = pd.DataFrame({"patient_id": [key(p) for p in rows["person_id"]], "hours": hours[keep],
                           "code": ["OMOP/" + str(int(c)) for c in rows["concept_id"]],
                           "value": rows["value"].to_numpy(), "unit": rows["unit"].to_numpy()})
    labels = None
    if source.label is not None:
        hits = set()
        window = 24.0 * source.label.window_days
        for lf in label_frames:
            if len(lf):
                h = ((pd.to_datetime(lf["t"]) - lf["person_id"].astype(np.int64).map(index))
                     / pd.Timedelta(hours=1)).to_numpy(dtype=float)
                hits |= {int(p) for p, x in zip(lf["person_id"], h, strict=True) if 0 <= x <= window}
        labels = pd.Series({key(p): float(int(p) in hits) for p in index.index}, dtype=float)
    notes = (f"rows outside the feature window ({source.lookback_days:g} day(s) before to {source.after_days:g} "
             f"after the index time): {int((~keep).sum())}",)
    return to_long(events, labels=labels, patients=patients, dictionary=dictionary, site=source.site,
                   source="OMOP CDM v5.4", snapshot_hours=source.snapshot_hours, notes=notes,
                   unmapped=unmapped)
