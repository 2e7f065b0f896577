"""OMOP CDM v5.4 -> the long table :func:`ingest` takes, through SQLAlchemy.

Reads ``person``, ``observation_period``, ``visit_occurrence``, ``condition_occurrence``,
``measurement``, ``observation`` (and ``death`` when the label uses it). The cohort is a SQL
query (returning ``person_id`` and ``index_datetime``) or a concept set (persons with a visit or a
condition of the given concepts; the index time is the first one). Features are the
``measurement`` and ``observation`` rows whose concept is a dictionary feature's
``omop_concept_id``, taken from ``lookback_days`` before the index time to ``after_days`` after
it and inside one of the person's ``observation_period`` rows (the others are counted and
excluded), binned into snapshots of ``snapshot_hours`` from the index time. ``[omop.person]``
adds age at the index date and sex from ``person``; ``[omop.conditions]`` adds presence features
from ``condition_occurrence`` (1 if the concept starts in the window, else 0). Units: each row's
``unit_concept_id`` (:data:`.omop_vocab.UNIT_CONCEPTS` plus the source file's
``unit_concepts``), else its ``unit_source_value`` (UCUM); rows without either are refused unless
the source file declares the feature's unit (:mod:`.ehr_values`). Censored values
(``operator_concept_id``, or a text-only ``value_source_value``/``value_as_string`` such as
``<0.5``) follow the declared ``censored`` policy. The label is 1 if a condition or an observation
of the label's concept set starts, or (``death = true``) the person dies, within ``window_days``
after the index time.

Columns stored as text are read as their CDM type on every engine (:mod:`.omop_types`).

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
from pydantic import ConfigDict, Field, model_validator

from clinograph.core.configmodel import ConfigModel
from clinograph.core.errors import ConfigError, SchemaError, SourceUnavailable

from ..ontology.dictionary import FeatureDictionary
from .ehr_values import CensorPolicy
from .extract import EhrExtract
from .omop_types import OPTIONAL, cdm_type, typed_relation

REQUIRED = {
    "person": ("person_id", "person_source_value", "gender_concept_id", "year_of_birth", "month_of_birth",
               "day_of_birth", "birth_datetime"),
    "observation_period": ("person_id", "observation_period_start_date", "observation_period_end_date"),
    "visit_occurrence": ("person_id", "visit_concept_id", "visit_start_date", "visit_start_datetime"),
    "condition_occurrence": ("person_id", "condition_concept_id", "condition_start_date", "condition_start_datetime"),
    "measurement": ("person_id", "measurement_concept_id", "measurement_date", "measurement_datetime",
                    "value_as_number", "unit_source_value", "measurement_id", "unit_concept_id",
                    "operator_concept_id", "value_as_concept_id", "value_source_value"),
    "observation": ("person_id", "observation_concept_id", "observation_date", "observation_datetime",
                    "value_as_number", "unit_source_value", "observation_id", "unit_concept_id",
                    "value_as_concept_id", "value_as_string"),
}
#: read only when the label uses it (``death = true``)
DEATH = {"death": ("person_id", "death_date", "death_datetime")}
_IDENT = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"
#: Why the f-string SQL here is not an injection vector: the only text put into a statement is
#: a table or column name from this module's constants, the cdm_schema (validated against
#: _IDENT), a file path (quoted) and the cohort ``sql`` -- the integrator's own query from
#: their own configuration, run with their own (read-only, see docs/ehr_formats.md) database
#: role. Every value (concept ids) is a bound parameter.
_SQL_NOTE = None


class OmopCohort(ConfigModel):
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


class OmopLabel(ConfigModel):
    """The label: 1 if a condition or observation of these concepts starts, or (``death``) the
    person dies (``death.death_date``), within ``window_days`` after the index time."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    condition_concept_ids: tuple[int, ...] = ()
    observation_concept_ids: tuple[int, ...] = ()
    death: bool = False
    window_days: float = Field(gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _some(self) -> OmopLabel:
        if not (self.condition_concept_ids or self.observation_concept_ids or self.death):
            raise ValueError("the label needs condition_concept_ids, observation_concept_ids or death = true")
        return self


class OmopSex(ConfigModel):
    """Sex from ``person.gender_concept_id`` (8507 male, 8532 female; others missing, counted): the
    dictionary feature and the level code (categorical) or 1/0 (binary) each one is written as."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    feature: str = Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")
    male: str = Field(min_length=1, max_length=64)
    female: str = Field(min_length=1, max_length=64)


class OmopPerson(ConfigModel):
    """``[omop.person]``: features read from ``person``. ``age``: a numeric feature, given the age
    in years at the index date (``birth_datetime``, else ``year_of_birth``/``month_of_birth``/
    ``day_of_birth``, a missing month or day taken as July / the 1st); ``sex``: :class:`OmopSex`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    age: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_]{0,63}$")
    sex: OmopSex | None = None


class OmopConditions(ConfigModel):
    """``[omop.conditions]``: binary dictionary features (by their ``omop_concept_id``) read from
    ``condition_occurrence``: 1 if a condition of the concept starts from ``lookback_days`` before
    the index time to ``after_days`` after it, else 0 (OMOP records what was diagnosed)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    features: tuple[str, ...] = Field(min_length=1)
    lookback_days: float = Field(ge=0, allow_inf_nan=False)


class OmopOptions(ConfigModel):
    """``[omop]`` of a source file: how one hospital's OMOP CDM becomes a long table (strict:
    unknown keys are errors). ``units``: feature id -> the unit of its rows that carry none;
    ``unit_concepts``: unit concept ids -> UCUM, added to :data:`.omop_vocab.UNIT_CONCEPTS`;
    ``censored``: how censored values are read (:mod:`.ehr_values`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cohort: OmopCohort
    label: OmopLabel | None = None
    cdm_schema: str | None = Field(default=None, pattern=_IDENT)
    patient_id: Literal["person_id", "person_source_value"] = "person_id"
    lookback_days: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    after_days: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    snapshot_hours: float = Field(default=24.0, gt=0, allow_inf_nan=False)
    units: dict[str, str] = Field(default_factory=dict)
    unit_concepts: dict[int, str] = Field(default_factory=dict)
    censored: CensorPolicy | None = None
    person: OmopPerson | None = None
    conditions: OmopConditions | None = None


class OmopSource(OmopOptions):
    """:class:`OmopOptions` of one site (``label`` given explicitly: None for an unlabeled extract)."""

    site: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
    label: OmopLabel | None = Field(description="None: an unlabeled extract")


def omop_engine(location: str | Path):  # -> sqlalchemy.Engine
    """An SQLAlchemy engine: a database URL as given, else embedded DuckDB over a file or folder.

    A ``.duckdb`` file is opened read-only; a folder of ``<table>.csv`` / ``<table>.parquet``
    files becomes an in-memory DuckDB with one view a file. Embedded DuckDB runs without file
    access (``enable_external_access = false``, configuration locked): a query can read the
    database or the table files and nothing else, and can write no file (with :func:`read_omop`
    checking that the cohort ``sql`` is one SELECT).

    Raises:
        ConfigError: the path does not exist or holds no OMOP table file.
        SchemaError: a table file the reader serves cannot be read (not UTF-8, binary, damaged); files
            of other tables (note.csv, drug_exposure.csv) are not opened.
    """
    import duckdb
    import sqlalchemy as sa

    text = str(location)
    if "://" in text:
        try:
            return sa.create_engine(text)
        except (sa.exc.ArgumentError, ImportError) as exc:  # an unknown scheme or driver (NoSuchModuleError), an
            # unparsable URL, a dialect SQLAlchemy knows whose driver is not installed (mysql://: no MySQLdb)
            try:  # named without its password; a URL that does not parse is not echoed at all
                shown = sa.engine.make_url(text).render_as_string(hide_password=True)
            except sa.exc.ArgumentError:
                shown = "(not a URL SQLAlchemy can parse)"
            raise ConfigError(f"OMOP location {shown} is no database this installation can open "
                              f"({type(exc).__name__}): give a PostgreSQL URL (postgresql+psycopg://user@host/cdm), "
                              "duckdb:///path/cdm.duckdb, or the path of a .duckdb file or a folder of OMOP table "
                              "files.") from None
    path = Path(text)
    if path.is_file():
        return sa.create_engine(f"duckdb:///{path}", connect_args={"read_only": True, "config": dict(_NO_FILES)})
    if not path.is_dir():
        raise ConfigError(f"OMOP location {path} does not exist. Give a .duckdb file, a folder of OMOP table "
                          "files (person.csv, measurement.parquet, ...), or a database URL.")
    files = {m.group(1).lower(): p for p in sorted(path.iterdir()) if (m := _TABLE_FILE.match(p.name))}
    if not set(files) & set(REQUIRED):
        raise ConfigError(f"OMOP folder {path} holds no table file named after an OMOP table "
                          f"({', '.join(f'{t}.csv' for t in REQUIRED)}).")
    files = {t: p for t, p in files.items() if t in FOLDER_TABLES}  # the others are never read
    engine = sa.create_engine("duckdb:///:memory:", poolclass=sa.pool.StaticPool)
    problems = []
    for table, p in files.items():
        parquet = p.suffix.lower() == ".parquet"
        source = f"{'read_parquet' if parquet else 'read_csv_auto'}('{_quote(p)}')"  # .gz: by DuckDB
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql(f"CREATE VIEW {table} AS SELECT {_typed(conn, source)} FROM {source}")  # noqa: S608 (see _SQL_NOTE)
        except (sa.exc.SQLAlchemyError, duckdb.Error) as exc:  # its message may quote a cell: only its type
            problems.append(f"OMOP table file {p.name} cannot be read as {'Parquet' if parquet else 'CSV'} "
                            f"({type(getattr(exc, 'orig', None) or exc).__name__}): not UTF-8 text, binary or "
                            f"damaged. Export it again ({'Parquet' if parquet else 'CSV in UTF-8 with a header row'}).")
    if problems:
        raise SchemaError(problems, title=f"OMOP folder {path.name} cannot be read")
    with engine.begin() as conn:
        paths = ", ".join(f"'{_quote(p)}'" for p in files.values())
        conn.exec_driver_sql(f"SET allowed_paths = [{paths}]")  # the views read these, nothing else
        for name, value in _NO_FILES.items():
            conn.exec_driver_sql(f"SET {name} = {str(value).lower()}")
    return engine


def _typed(conn, source: str) -> str:  # noqa: ANN001 - a Connection
    """The select list of a table file's view: text columns with a CDM name cast to the CDM's type."""
    columns = conn.exec_driver_sql(f"DESCRIBE SELECT * FROM {source}").fetchall()  # noqa: S608 (see _SQL_NOTE)
    out = []
    for name, dtype, *_ in columns:
        ident = '"' + str(name).replace('"', '""') + '"'
        cast = cdm_type(str(name)) if dtype == "VARCHAR" else None  # a CSV column empty on every row, ...
        out.append(f"CAST({ident} AS {cast}) AS {ident}" if cast else ident)
    return ", ".join(out) or "*"


#: the tables a folder's files are served as (the reader's, the label's death, the vocabulary's concept)
FOLDER_TABLES = frozenset({*REQUIRED, *DEATH, "concept"})
#: a table file of a folder: ``person.csv``, ``MEASUREMENT.tsv``, ``measurement.csv.gz``, ``death.parquet``
_TABLE_FILE = re.compile(r"^(.+?)\.(?:(?:csv|tsv)(?:\.gz)?|parquet)$", re.IGNORECASE)

#: Embedded DuckDB's sandbox: no file read or written but the database (and allowed_paths), no
#: extension installed or loaded, no database attached; the cohort query cannot undo it.
_NO_FILES = {"enable_external_access": False, "lock_configuration": True}


def _one_select(sql: str, *, what: str) -> None:
    """``sql`` is one SELECT statement (ConfigError otherwise), checked with DuckDB's own parser
    (PostgreSQL's grammar, forked) before it runs on any database -- a COPY, ATTACH, SET,
    COMMIT or second statement never runs. A SELECT that writes (PostgreSQL's data-modifying
    ``WITH``) still parses as SELECT: the read-only transaction (:func:`read_only`) refuses it."""
    import duckdb

    try:
        kinds = [st.type.name for st in duckdb.extract_statements(sql)]
    except duckdb.Error as exc:
        kinds = [f"unparsable ({type(exc).__name__})"]
    if kinds != ["SELECT"]:
        raise ConfigError(f"{what} must be one SELECT statement (returning person_id, index_datetime); DuckDB "
                          f"reads it as {len(kinds)} statement(s): {', '.join(kinds) or 'none'}. Write the cohort "
                          "as a single SELECT (WITH ... SELECT is fine); it may not copy, attach, set or write.")


def _quote(path: Path) -> str:
    return str(path).replace("'", "''")


def check_cdm(engine, *, cdm_schema: str | None = None, death: bool = False) -> tuple[str, ...]:
    """The database answers, and every table and column :func:`read_omop` reads exists; all
    problems at once. ``death``: the ``death`` table is needed too (a death label). Returns the
    ``*_datetime`` columns the CDM lacks (``table.column``; read as NULL: the date at 00:00).

    Raises:
        SourceUnavailable: the database cannot be connected to (named apart from missing tables).
        SchemaError: naming each missing table or column.
    """
    import sqlalchemy as sa

    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sa.exc.SQLAlchemyError as exc:
        url = engine.url.render_as_string(hide_password=True)
        if engine.url.get_backend_name() == "duckdb" and engine.url.database not in (None, "", ":memory:"):
            raise SourceUnavailable(f"OMOP location {engine.url.database} cannot be opened as a DuckDB database "
                                    f"({type(exc.orig or exc).__name__}): it is no DuckDB file, a damaged one, or one "
                                    "another DuckDB version wrote. Give a .duckdb file this DuckDB reads, a folder of "
                                    "OMOP table files (person.csv, measurement.parquet, ...), or a database URL.") from None
        raise SourceUnavailable(f"Cannot connect to the OMOP database {url} ({type(exc.orig or exc).__name__}). "
                                "Check the host, port, database name and credentials (PGPASSFILE / ~/.pgpass), "
                                "and that the server is running and accepts connections from here.") from None
    where = f"schema {cdm_schema!r}" if cdm_schema else "the default schema"
    problems, absent = [], []
    for table, cols in {**REQUIRED, **(DEATH if death else {})}.items():  # by a zero-row SELECT: every dialect
        name = f"{cdm_schema}.{table}" if cdm_schema else table
        try:
            with engine.connect() as conn:
                have = {str(k).lower() for k in conn.execute(sa.text(f"SELECT * FROM {name} WHERE 1 = 0")).keys()}  # noqa: S608 (see _SQL_NOTE)
        except sa.exc.SQLAlchemyError:
            problems.append(f"OMOP table {table!r} is missing in {where} (or cannot be read). Load it from the CDM "
                            "v5.4 export, set cdm_schema to the schema that holds the CDM, or grant the reader "
                            "SELECT on it.")
            continue
        required = [c for c in cols if c not in OPTIONAL]
        missing = [c for c in required if c not in have]
        absent += [f"{table}.{c}" for c in cols if c not in have and c in OPTIONAL and len(have) > 1]
        if missing and len(missing) == len(required) and len(have) <= 1:  # a file read as one column: not split
            problems.append(f"OMOP table {table!r} has {len(have)} column(s) and none of the CDM v5.4 ones: a table "
                            "file that is empty, binary, or a CSV whose rows could not be split (a row with more or "
                            "fewer fields than the header, an unusual delimiter). Export it again as CSV with a "
                            "header row.")
        elif missing:
            problems.append(f"OMOP table {table!r} lacks column(s) {missing} (CDM v5.4 names). Export the table "
                            "with its CDM v5.4 columns.")
    if problems:
        raise SchemaError(problems, title="The database is not an OMOP CDM v5.4 instance Clinograph can read")
    return tuple(absent)


def _relations(conn, source: OmopSource) -> dict[str, str]:  # noqa: ANN001 - a Connection
    """Table -> FROM-clause item of the CDM's tables, text columns typed (:mod:`.omop_types`)."""
    tables = {**REQUIRED, **(DEATH if source.label is not None and source.label.death else {})}
    return {t: typed_relation(conn, table=t, schema=source.cdm_schema, columns=cols) for t, cols in tables.items()}


def _cohort_sql(source: OmopSource, rel: dict[str, str]) -> tuple[str, dict]:
    c = source.cohort
    if c.sql is not None:
        return c.sql.strip().rstrip(";"), {}
    if c.visit_concept_ids:
        return (f"SELECT person_id, MIN(COALESCE(visit_start_datetime, CAST(visit_start_date AS TIMESTAMP))) "  # noqa: S608 (see _SQL_NOTE)
                f"AS index_datetime FROM {rel['visit_occurrence']} v WHERE visit_concept_id IN :cohort_ids "
                "GROUP BY person_id", {"cohort_ids": list(c.visit_concept_ids)})
    return (f"SELECT person_id, MIN(COALESCE(condition_start_datetime, CAST(condition_start_date AS TIMESTAMP))) "  # noqa: S608 (see _SQL_NOTE)
            f"AS index_datetime FROM {rel['condition_occurrence']} c WHERE condition_concept_id IN :cohort_ids "
            "GROUP BY person_id", {"cohort_ids": list(c.condition_concept_ids)})


def _query(conn, sql: str, params: dict) -> pd.DataFrame:
    import sqlalchemy as sa

    stmt = sa.text(sql)
    for key, value in params.items():
        if isinstance(value, list):
            stmt = stmt.bindparams(sa.bindparam(key, expanding=True))
    result = conn.execute(stmt, params)
    cursor = getattr(result, "cursor", None)
    if conn.dialect.name == "duckdb" and cursor is not None:  # DuckDB hands over columns, not Python rows
        df = cursor.df()
    else:
        df = pd.DataFrame(result.fetchall(), columns=list(result.keys()))
    # DuckDB names a result column as the table stores it: PERSON_ID in CSVs with upper-case headers
    return df.rename(columns=str.lower)


def _shared_text(df: pd.DataFrame, columns: tuple[str, ...]) -> pd.DataFrame:
    """``df`` with each text column's repeated strings one object (DuckDB hands over one string a row:
    10^6 rows of ``mg/dL`` were 10^6 strings); in place, values unchanged."""
    for col in columns:
        if col in df.columns and df[col].dtype == object and len(df):
            values = df[col].to_numpy()
            codes, uniques = pd.factorize(values)
            if 0 < len(uniques) * 2 < len(values):
                df[col] = np.where(codes >= 0, np.asarray(uniques, dtype=object)[np.maximum(codes, 0)], values)
    return df


def read_omop(engine, *, source: OmopSource, dictionary: FeatureDictionary) -> EhrExtract:
    """The cohort's features and labels as an :class:`EhrExtract` (long table + schema + report).

    Measurement/observation rows of cohort persons whose concept is a dictionary feature's
    ``omop_concept_id`` are read; the others are only counted (by concept, in SQL).

    Raises:
        SourceUnavailable: the database cannot be connected to.
        ConfigError: the cohort query is not one SELECT statement (DuckDB's parser, on every database),
            or the dictionary has no omop_concept_id (and no ``[omop.person]``) to map rows with.
        SchemaError: tables or columns are missing, a query with the cohort fails (on PostgreSQL
            also: it tries to write in the read-only transaction), the cohort query does not return
            ``person_id`` and ``index_datetime`` (naive timestamps), or ``[omop.person]``/``[omop.conditions]`` name
            features the dictionary does not have as declared.
        UnitError: values without a unit (and no declared one), unit concepts or units that do not
            convert, censored values without a declared ``censored`` policy -- every feature at once.
    """
    import sqlalchemy as sa

    from .omop_assemble import check_declared

    check_declared(source, dictionary)
    if not any(f.omop_concept_id for f in dictionary.features) and source.person is None:
        raise ConfigError(f"The dictionary {dictionary.name} gives no feature an omop_concept_id: no measurement or "
                          f"observation row of site {source.site!r} can be mapped. Add each feature's standard "
                          "concept id (omop_concept_id = ...) to the dictionary, or read the site another way.")
    absent = check_cdm(engine, cdm_schema=source.cdm_schema, death=bool(source.label and source.label.death))
    if source.cohort.sql is not None:  # wrapped as a CTE below: one SELECT stays one statement
        _one_select(source.cohort.sql.strip().rstrip(";"), what=f"The cohort query of site {source.site!r}")
    import duckdb

    with engine.connect() as conn:
        try:
            read_only(conn)
            rel = _relations(conn, source)
            cohort_sql, params = _cohort_sql(source, rel)
            return _read(conn, cohort_sql, params, rel, source=source, dictionary=dictionary, absent=absent)
        except (sa.exc.SQLAlchemyError, duckdb.Error) as exc:  # DuckDB's own: a result it cannot hand over
            if isinstance(exc, sa.exc.DataError) or isinstance(getattr(exc, "orig", None) or exc,
                                                                 duckdb.ConversionException):  # a failed cast
                conn.rollback()  # the failed transaction: an embedded DuckDB shares its one connection
                cols = _uncastable_columns(engine, source)
                where = f" (in {', '.join(cols)})" if cols else ""
                raise SchemaError(f"The OMOP CDM of site {source.site!r} holds a cell that is not of its column's "
                                  f"CDM type{where} (a number with a decimal comma, an impossible date, a date that is not "
                                  "ISO 8601 or carries a time-zone offset, text in a concept id column; not shown: "
                                  "it may be patient data). Check the tables' number and date formats (ISO dates, "
                                  "'.' decimals) and export or load them again.",
                                  title="OMOP table cannot be read") from None
            if isinstance(getattr(exc, "orig", None) or exc, duckdb.InvalidInputException):  # a file past its sniff
                raise SchemaError(f"A table file of the OMOP folder of site {source.site!r} cannot be read past its "
                                  "first rows (InvalidInputException): bytes that are not UTF-8, a row with more or "
                                  "fewer fields than the header, or a damaged file. Export the tables again as CSV "
                                  "in UTF-8 with a header row (or Parquet).", title="OMOP table cannot be read") from None
            raise SchemaError(f"The cohort query of site {source.site!r} failed "
                              f"({type(getattr(exc, 'orig', None) or exc).__name__}"
                              "), alone or as the cohort of a read. Check it against the CDM: one SELECT of "
                              "person_id, index_datetime that only reads (the transaction is read-only).",
                              title="Cohort query failed") from None


def _uncastable_columns(engine, source: OmopSource) -> list[str]:  # noqa: ANN001 - an Engine
    """``table.column`` of each CDM-typed column the reader reads whose cells do not all cast to its
    CDM type (one query a column, each in its own read-only transaction: a failed cast ends it)."""
    import duckdb
    import sqlalchemy as sa

    bad = []
    for table, cols in {**REQUIRED, **(DEATH if source.label is not None and source.label.death else {})}.items():
        for col in (c for c in cols if cdm_type(c)):
            try:
                with engine.connect() as conn:
                    read_only(conn)
                    rel = typed_relation(conn, table=table, schema=source.cdm_schema, columns=(col,))
                    conn.execute(sa.text(f"SELECT COUNT(CAST({col} AS {cdm_type(col)})) FROM {rel} x"))  # noqa: S608 (see _SQL_NOTE)
            except (sa.exc.SQLAlchemyError, duckdb.Error):  # DuckDB's own: a result it cannot hand over
                bad.append(f"{table}.{col}")
    return bad


def _one_index_a_person(cohort: pd.DataFrame, *, site: str) -> None:
    """SchemaError (counts only, never ids or times) for cohort rows without a person or an index
    time, and for persons given several index times: silently, the first row's would be taken."""
    empty = int((cohort["person_id"].isna() | cohort["index_datetime"].isna()).sum())
    several = int((cohort.dropna().groupby("person_id")["index_datetime"].nunique() > 1).sum())
    problems = ([f"The cohort query of site {site!r} returns {empty} row(s) without a person_id or an "
                 "index_datetime. Filter them out (WHERE ... IS NOT NULL)."] if empty else []) + \
        ([f"The cohort query of site {site!r} gives {several} person(s) more than one index_datetime; one "
          "would be taken by row order. Return one row a person (e.g. MIN(...) ... GROUP BY person_id)."]
         if several else [])
    if problems:
        raise SchemaError(problems, title="Cohort query rows are not one index time a person")


def read_only(conn) -> None:  # noqa: ANN001 - an SQLAlchemy Connection, before its first query
    """Make the connection's transaction read-only where the database enforces it (PostgreSQL:
    ``SET TRANSACTION READ ONLY``, which no later statement of the transaction can undo). Embedded
    DuckDB is read-only already (:func:`omop_engine`); the documented read-only role (docs/
    ehr_formats.md) stays the first defence on a database server."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET TRANSACTION READ ONLY")


def _read(conn, cohort_sql: str, params: dict, rel: dict[str, str], *, source: OmopSource,  # noqa: ANN001 - a Connection
          dictionary: FeatureDictionary, absent: tuple[str, ...] = ()) -> EhrExtract:
    from .omop_assemble import assemble

    in_cohort = "IN (SELECT person_id FROM cohort)"
    cohort = _query(conn, cohort_sql, params)
    missing = [c for c in ("person_id", "index_datetime") if c not in cohort.columns]
    if missing:
        raise SchemaError(f"The cohort query of site {source.site!r} returns no column(s) {missing}. "
                          "SELECT person_id and index_datetime (AS index_datetime).",
                          title="Cohort query has the wrong columns")
    if isinstance(cohort["index_datetime"].dtype, pd.DatetimeTZDtype):
        raise SchemaError(f"The cohort query of site {source.site!r} returns index_datetime with a time zone; "
                          "the CDM's datetimes have none. CAST it AS TIMESTAMP (in the CDM's local time).",
                          title="Cohort query has the wrong columns")
    _one_index_a_person(cohort, site=source.site)
    frames, unmapped = [], {}
    ids = {"feature_ids": [f.omop_concept_id for f in dictionary.features if f.omop_concept_id] or [-1]}
    for table, operator, text in (("measurement", "x.operator_concept_id", "x.value_source_value"),
                                  ("observation", "CAST(NULL AS INTEGER)", "x.value_as_string")):
        sql = (f"WITH cohort AS ({cohort_sql}) SELECT x.{table}_id AS record_id, "  # noqa: S608 (see _SQL_NOTE)
               f"x.person_id, x.{table}_concept_id AS concept_id, "
               f"COALESCE(x.{table}_datetime, CAST(x.{table}_date AS TIMESTAMP)) AS t, "
               f"x.value_as_number AS value, x.unit_source_value AS unit_text, x.unit_concept_id AS unit_concept, "
               f"{operator} AS operator, x.value_as_concept_id AS value_concept, {text} AS value_text "
               f"FROM {rel[table]} x WHERE x.person_id {in_cohort} AND x.{table}_concept_id IN :feature_ids")
        rows = _query(conn, sql, {**params, **ids})
        rows.insert(0, "source_table", table)  # one string for the table, not one a row
        frames.append(_shared_text(rows, ("unit_text", "value_text")))
        del rows
        other = _query(conn, f"WITH cohort AS ({cohort_sql}) SELECT x.{table}_concept_id AS concept_id, "  # noqa: S608 (see _SQL_NOTE)
                             f"COUNT(*) AS n FROM {rel[table]} x WHERE x.person_id {in_cohort} "
                             f"AND x.{table}_concept_id NOT IN :feature_ids GROUP BY x.{table}_concept_id",
                       {**params, **ids})
        for c, n in zip(other["concept_id"], other["n"], strict=True):
            k = f"OMOP/{int(c)}" if pd.notna(c) else "OMOP/(none)"
            unmapped[k] = unmapped.get(k, 0) + int(n)
    conditions = None
    if source.conditions is not None:
        cids = [dictionary.get(f).omop_concept_id for f in source.conditions.features]
        conditions = _query(conn, f"WITH cohort AS ({cohort_sql}) SELECT x.person_id, "  # noqa: S608 (see _SQL_NOTE)
                                  "x.condition_concept_id AS concept_id, COALESCE(x.condition_start_datetime, "
                                  "CAST(x.condition_start_date AS TIMESTAMP)) AS t "
                                  f"FROM {rel['condition_occurrence']} x WHERE x.person_id {in_cohort} "
                                  "AND x.condition_concept_id IN :condition_ids",
                            {**params, "condition_ids": cids})
    label_frames = []
    if source.label is not None:
        for table, ids in (("condition_occurrence", source.label.condition_concept_ids),
                           ("observation", source.label.observation_concept_ids)):
            if ids:
                prefix = table.split("_")[0]
                start = "start_" if table == "condition_occurrence" else ""
                sql = (f"WITH cohort AS ({cohort_sql}) SELECT x.person_id, "  # noqa: S608 (see _SQL_NOTE)
                       f"COALESCE(x.{prefix}_{start}datetime, CAST(x.{prefix}_{start}date AS TIMESTAMP)) AS t "
                       f"FROM {rel[table]} x WHERE x.person_id {in_cohort} "
                       f"AND x.{prefix}_concept_id IN :label_ids")
                label_frames.append(_query(conn, sql, {**params, "label_ids": list(ids)}))
        if source.label.death:
            label_frames.append(_query(conn, f"WITH cohort AS ({cohort_sql}) SELECT x.person_id, "  # noqa: S608 (see _SQL_NOTE)
                                             "COALESCE(x.death_datetime, CAST(x.death_date AS TIMESTAMP)) AS t "
                                             f"FROM {rel['death']} x WHERE x.person_id {in_cohort}", params))
    person = _query(conn, f"WITH cohort AS ({cohort_sql}) SELECT person_id, person_source_value, "  # noqa: S608 (see _SQL_NOTE)
                          "gender_concept_id, year_of_birth, month_of_birth, day_of_birth, birth_datetime "
                          f"FROM {rel['person']} x WHERE person_id {in_cohort}", params)
    periods = _query(conn, f"WITH cohort AS ({cohort_sql}) SELECT person_id, observation_period_start_date AS "  # noqa: S608 (see _SQL_NOTE)
                           "start, observation_period_end_date AS stop "
                           f"FROM {rel['observation_period']} x WHERE person_id {in_cohort}", params)
    unit_vocabulary = _unit_vocabulary(conn, source, frames)
    _no_time_zones({"measurement": frames[0], "observation": frames[1], "condition_occurrence": conditions,
                    "person": person, "the label tables": pd.concat(label_frames) if label_frames else None},
                   site=source.site)
    return assemble(cohort, frames, conditions, label_frames, person, periods, unmapped, source=source,
                    dictionary=dictionary, unit_vocabulary=unit_vocabulary, absent_columns=absent)


def _unit_vocabulary(conn, source: OmopSource, frames: list[pd.DataFrame]) -> dict[int, str]:  # noqa: ANN001
    """The UCUM codes (``concept_code``) of the rows' unit concepts in the CDM's own ``concept``
    table (vocabulary_id 'UCUM'), when the CDM has one: the site's vocabulary, which knows every
    unit concept its ETL wrote. Empty without a concept table."""
    import sqlalchemy as sa

    ids = sorted({int(c) for f in frames for c in pd.to_numeric(f["unit_concept"], errors="coerce").dropna()} - {0})
    where = "table_schema = :schema" if source.cdm_schema else "table_schema = current_schema()"
    found = conn.execute(sa.text(f"SELECT COUNT(*) FROM information_schema.tables WHERE table_name = 'concept' "  # noqa: S608 - constant
                                 f"AND {where}"), {"schema": source.cdm_schema}).scalar()
    if not ids or not found:
        return {}
    rel = typed_relation(conn, table="concept", schema=source.cdm_schema,
                         columns=("concept_id", "concept_code", "vocabulary_id"))
    rows = _query(conn, f"SELECT concept_id, concept_code FROM {rel} c WHERE vocabulary_id = 'UCUM' "  # noqa: S608 (see _SQL_NOTE)
                        "AND concept_id IN :unit_ids", {"unit_ids": ids})
    return {int(c): str(code).strip() for c, code in zip(rows["concept_id"], rows["concept_code"], strict=True)
            if pd.notna(c) and isinstance(code, str) and code.strip()}


def _no_time_zones(frames: dict[str, pd.DataFrame | None], *, site: str) -> None:
    """SchemaError naming every table whose datetimes came back with a time zone (TIMESTAMPTZ): the
    CDM's are local and naive, and one offset-aware column beside naive index times cannot be placed
    in a window without guessing the hospital's time zone."""
    zoned = [name for name, df in frames.items() if df is not None
             and any(isinstance(dtype, pd.DatetimeTZDtype) for dtype in df.dtypes)]
    if zoned:
        raise SchemaError(f"The OMOP CDM of site {site!r} holds datetimes with a time zone (TIMESTAMPTZ) in "
                          f"{', '.join(zoned)}; CDM v5.4 datetimes are TIMESTAMP without time zone, in the "
                          "hospital's local time, like the index times. Convert those columns (e.g. a view "
                          "with CAST(x AT TIME ZONE 'Europe/Berlin' AS TIMESTAMP)) and read again.",
                          title="OMOP datetimes have a time zone")
