"""CDM v5.4 column types, applied to text columns on every engine: a CDM loaded as text reads as typed.

ETLs and loaders often create CDM tables with every column ``VARCHAR``/``TEXT`` (a CSV loaded as
it came, ``value_as_number`` as text, dates as text). The OMOP reader compares concept ids with
bound integers, coalesces datetimes with dates and reads numbers: on text columns PostgreSQL
refuses the comparison and DuckDB the coalesce, which ended in "the cohort query failed". So each
table is read through :func:`typed_relation`: the columns the reader reads whose CDM type is
known (:data:`CDM_TYPES`, by name) and which the database stores as text are cast to that type;
an empty cell is NULL. Text dates and datetimes must be ISO 8601 (``2024-01-31``,
``2024-01-31 08:00:00`` or ``...T08:00:00``) without a time-zone offset -- PostgreSQL would read
``01/02/2024`` by its ``DateStyle`` and drop an offset silently -- anything else fails the cast,
which the reader names as a cell that is not of its column's CDM type (never its value).
Columns stored with a type already are read as they are (a ``TIMESTAMPTZ`` stays one, and is
refused by name downstream).
"""

from __future__ import annotations

import re

#: CDM v5.4 column types by column name
CDM_TYPES = ((re.compile(r"_id$|^(year|month|day)_of_birth$"), "BIGINT"), (re.compile(r"_datetime$"), "TIMESTAMP"),
             (re.compile(r"_date$"), "DATE"),
             (re.compile(r"^(value_as_number|range_low|range_high|quantity)$"), "DOUBLE PRECISION"))


#: the CDM's text columns whose names end in ``_id`` (vocabulary tables, specimen, cost)
TEXT_IDS = frozenset({"vocabulary_id", "domain_id", "concept_class_id", "relationship_id", "specimen_source_id",
                      "cost_domain_id"})


def cdm_type(column: str) -> str | None:
    """The CDM v5.4 SQL type of a column, by its name (None: text, or not one the reader types)."""
    name = column.lower()
    if name in TEXT_IDS:
        return None
    return next((t for rx, t in CDM_TYPES if rx.search(name)), None)


def cast_text(column: str, sql_type: str) -> str:
    """SQL casting the text column ``column`` to ``sql_type`` (an empty cell: NULL; a date or
    datetime that is not ISO 8601 without an offset: a failing cast)."""
    v = f"NULLIF(TRIM({column}), '')"
    if sql_type in ("DATE", "TIMESTAMP"):  # LIKE is the same on every dialect; the cast checks the rest
        iso = f"{v} LIKE '____-__-__%' AND {v} NOT LIKE '%+%' AND {v} NOT LIKE '%:%-%' AND UPPER({v}) NOT LIKE '%Z'"
        v = f"CASE WHEN {iso} THEN {v} ELSE 'not an ISO 8601 time without offset: ' || {v} END"
    return f"CAST({v} AS {sql_type})"


#: columns a CDM may lack (CDM v5.2 and older, minimal ETLs): read as NULL, the date's 00:00 used
OPTIONAL = frozenset({"measurement_datetime", "observation_datetime", "visit_start_datetime",
                      "condition_start_datetime", "birth_datetime", "death_datetime"})

#: ``information_schema.columns.data_type`` of text columns (PostgreSQL, DuckDB), lower case
TEXT_TYPES = frozenset({"character varying", "varchar", "text", "character", "char", "bpchar", "string"})


def typed_relation(conn, *, table: str, schema: str | None, columns: tuple[str, ...]) -> str:  # noqa: ANN001
    """A FROM-clause item for ``table`` (no alias): the table itself when none of ``columns`` with a
    CDM type is stored as text (``information_schema.columns``, the same on PostgreSQL and
    DuckDB), else a subquery of ``columns`` with those cast (:func:`cast_text`)."""
    import sqlalchemy as sa

    name = f"{schema}.{table}" if schema else table
    where = "table_schema = :schema" if schema else "table_schema = current_schema()"
    stored = conn.execute(sa.text("SELECT column_name, data_type FROM information_schema.columns "  # noqa: S608 - constant
                                  f"WHERE table_name = :table AND {where}"), {"table": table, "schema": schema})
    stored = {str(c).lower(): str(t).lower() for c, t in stored}
    text = {c for c, t in stored.items() if t in TEXT_TYPES} & {c for c in columns if cdm_type(c)}
    absent = {c for c in columns if c not in stored and c in OPTIONAL}
    if not text and not absent:
        return name
    select = ", ".join(f"CAST(NULL AS TIMESTAMP) AS {c}" if c in absent else
                       f"{cast_text(c, cdm_type(c))} AS {c}" if c in text else c for c in columns)
    return f"(SELECT {select} FROM {name})"  # noqa: S608 - names from omop.REQUIRED and a validated schema
