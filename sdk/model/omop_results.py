"""Predictions as rows of an OMOP-side results table: a CSV, and optionally a table in the database.

OMOP CDM v5.4 has no table for a model's scores, so Clinograph writes its own beside the CDM
(docs/ehr_formats.md, "The OMOP results table"), one row a patient (a survival model: a patient
and horizon), append-only:

================== ================ =========================================================
column             type             meaning
================== ================ =========================================================
person_id          BIGINT, null     ``person.person_id``, when the ids are OMOP person ids
person_source_value VARCHAR(256)    the patient's source id otherwise (exactly one is set)
model_sha256       VARCHAR(64)      SHA-256 (hex) of the released model's weights
score              DOUBLE           the risk, a probability in [0, 1]
horizon            DOUBLE, null     survival: the time t of the risk P(T <= t); null: binary
horizon_unit       VARCHAR(16)      survival: the UCUM unit of ``horizon`` (d, wk, mo, a)
created_datetime   TIMESTAMP        when the risk was made, UTC
================== ================ =========================================================

The CSV holds the cells as they are (no spreadsheet escaping: it is for loading into a
database); a missing value is an empty cell.
"""

from __future__ import annotations

import csv
import re
from datetime import timezone
from pathlib import Path
from typing import Any, Literal

from clinograph.core.errors import ConfigError

from .predictions import Predictions, spreadsheet_safe

RESULT_COLUMNS = ("person_id", "person_source_value", "model_sha256", "score", "horizon", "horizon_unit",
                  "created_datetime")
IdColumn = Literal["person_id", "person_source_value"]
#: a table name, optionally schema-qualified (``results.clinograph_risk``)
_TABLE = re.compile(r"^(?:([A-Za-z_][A-Za-z0-9_]{0,62})\.)?([A-Za-z_][A-Za-z0-9_]{0,62})$")
_INT = re.compile(r"^-?\d{1,18}$")


def result_rows(predictions: Predictions, *, id_column: IdColumn) -> list[dict[str, Any]]:
    """The results table's rows for ``predictions`` (keys: :data:`RESULT_COLUMNS`).

    Raises:
        ConfigError: ``id_column = "person_id"`` with ids that are not integers (counted, not shown).
    """
    p = predictions
    if id_column == "person_id":
        bad = sum(not _INT.match(i) for i in p.patient_ids)
        if bad:
            raise ConfigError(f"{bad} of {len(p.patient_ids)} patient id(s) are not OMOP person_id integers. Fix: "
                              "write them as person_source_value (read the OMOP source with patient_id = "
                              "\"person_source_value\", or predict from a table).")
    created = p.created.astimezone(timezone.utc).replace(tzinfo=None)
    rows = []
    for pid, risks in zip(p.patient_ids, p.risks, strict=True):
        ident = {"person_id": int(pid), "person_source_value": None} if id_column == "person_id" else \
            {"person_id": None, "person_source_value": pid}
        for j, risk in enumerate(risks):
            rows.append({**ident, "model_sha256": p.model_sha256, "score": float(risk),
                         "horizon": None if p.horizons is None else p.horizons[j],
                         "horizon_unit": p.time_unit, "created_datetime": created})
    return rows


def write_results_csv(path: str | Path, rows: list[dict[str, Any]]) -> int:
    """Write ``rows`` (:func:`result_rows`) as CSV with the header :data:`RESULT_COLUMNS`, cells as
    they are (the file is for loading into a database: an escaped id would no longer join). Returns
    how many rows hold a ``person_source_value`` a spreadsheet would run as a formula
    (:func:`.predictions.spreadsheet_safe`), for the caller to warn about."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    formulas = 0
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(RESULT_COLUMNS)
        for r in rows:
            source = r["person_source_value"]
            formulas += isinstance(source, str) and spreadsheet_safe(source) != source
            writer.writerow(["" if r[c] is None else r[c].isoformat(sep=" ") if c == "created_datetime" else r[c]
                             for c in RESULT_COLUMNS])
    return formulas


def check_table_name(name: str) -> tuple[str | None, str]:
    """(schema or None, table) of a results table name; refuses anything but plain identifiers."""
    m = _TABLE.match(name)
    if m is None:
        raise ConfigError(f"Results table name {name[:80]!r} is not a table name (letters, digits, _; optionally "
                          "schema.table, e.g. results.clinograph_risk).")
    return m.group(1), m.group(2)


def results_table(name: str):  # -> sqlalchemy.Table
    """The documented schema as an SQLAlchemy table named ``name`` (``schema.table`` allowed)."""
    import sqlalchemy as sa

    schema, table = check_table_name(name)
    return sa.Table(table, sa.MetaData(schema=schema),
                    sa.Column("person_id", sa.BigInteger, nullable=True),
                    sa.Column("person_source_value", sa.String(256), nullable=True),
                    sa.Column("model_sha256", sa.String(64), nullable=False),
                    sa.Column("score", sa.Float(precision=53), nullable=False),
                    sa.Column("horizon", sa.Float(precision=53), nullable=True),
                    sa.Column("horizon_unit", sa.String(16), nullable=True),
                    sa.Column("created_datetime", sa.DateTime(timezone=False), nullable=False))


def write_results_table(engine, name: str, rows: list[dict[str, Any]]) -> int:
    """Append ``rows`` to table ``name`` in ``engine``'s database, creating it with the documented
    schema if it is absent; returns the rows written. All rows are written in one transaction.

    Raises:
        ConfigError: an existing table without the documented columns (named), or a database
            error (its class and the fix; never a value).
    """
    import sqlalchemy as sa

    table = results_table(name)
    try:
        if sa.inspect(engine).has_table(table.name, schema=table.schema):
            with engine.connect() as conn:  # the columns of an empty select: portable (DuckDB reflects poorly)
                probe = sa.select(sa.text("*")).select_from(sa.table(table.name, schema=table.schema))
                have = {str(k).lower() for k in conn.execute(probe.where(sa.false())).keys()}
            missing = [c for c in RESULT_COLUMNS if c not in have]
            if missing:
                raise ConfigError(f"Results table {name} exists but lacks the column(s) {', '.join(missing)} of the "
                                  f"documented schema ({', '.join(RESULT_COLUMNS)}; docs/ehr_formats.md). Fix: give "
                                  "another table name, or add the columns.")
        with engine.begin() as conn:
            table.create(conn, checkfirst=True)
            if rows:
                conn.execute(table.insert(), rows)
    except sa.exc.SQLAlchemyError as exc:
        raise ConfigError(f"Results table {name} could not be written ({type(exc).__name__}). Fix: give a database "
                          "user that may create the table and insert into it (the CDM reader is usually read-only), "
                          "or write the CSV (--omop-out) and load it yourself.") from None
    return len(rows)


def results_engine(location: str):  # -> sqlalchemy.Engine
    """A writable engine on the OMOP database at ``location`` (a URL or a .duckdb file)."""
    import sqlalchemy as sa

    if "://" in location:
        return sa.create_engine(location)
    path = Path(location)
    if path.is_file():
        return sa.create_engine(f"duckdb:///{path}")
    raise ConfigError(f"--omop-table: the OMOP source {path} is a folder of table files, not a database, so there is "
                      "no table to write into. Fix: write the results as CSV with --omop-out PATH.")
