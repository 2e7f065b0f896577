"""Reading a hospital table file (CSV/TSV or Parquet) into a DataFrame of text cells.

Whatever the file holds, the result is a DataFrame or a :class:`ClinographError`, and no error
quotes a cell: only regular files are opened (a directory, FIFO or device is refused before any
read); the encoding is taken from a byte-order mark (UTF-8, UTF-16, UTF-32), else UTF-8, else
Windows-1252 (Excel on Windows: its 0x80-0x9F are ’ – € ..., control characters in latin-1), else
latin-1 (every byte is a latin-1 character, so a stray latin-1 byte in a column you ignore is
accepted; the encoding used is recorded in ``df.attrs["encoding"]`` and in the ingest report);
UTF-16/32 without a byte-order mark is refused with the fix. Rows with more or fewer fields than
the header are reported (row numbers only), all at once. The CSV dialect -- field delimiter and
decimal separator -- is declared or detected (:mod:`.dialect`: German Excel's semicolons and
decimal commas read correctly); when a file looks like another dialect, the error says so.
"""

from __future__ import annotations

import codecs
import csv
import io
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from clinograph.core.errors import ConfigError, SchemaError
from clinograph.core.fileio import NotRegularFile, read_regular

from ..ontology.schema import SiteSchema
from .dialect import (
    DECIMALS,
    apply_decimal_comma,
    apply_thousands,
    detect_decimal,
    detect_delimiter,
    dialect_hint,
)
from .dialect import name as delimiter_name
from .rows import rows_text

# pandas' default missing-value spellings (read_csv keep_default_na=True).
NA_STRINGS = frozenset({"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
                        "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"})
DELIMITERS = (",", ";", "\t", "|")  # also .dialect.DELIMITERS
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))

def _read_regular(path: Path) -> bytes:
    try:
        return read_regular(path)
    except FileNotFoundError:
        raise ConfigError(f"Table {path} does not exist. Check the path.") from None
    except NotRegularFile as exc:
        raise ConfigError(f"Table {path} is {exc.kind}, not a regular file. Give the path of the exported "
                          ".csv or .parquet file.") from None
    except OSError as exc:
        raise ConfigError(f"Table {path} cannot be read: {exc.strerror or type(exc).__name__}.") from None


#: file signatures of what is exported instead of a CSV, and the fix
_NOT_TEXT = ((b"PK\x03\x04", "a ZIP archive (an Excel .xlsx workbook, or a zipped export)",
              "Save the sheet as CSV UTF-8 (Excel: File > Save As > CSV UTF-8), or unzip it"),
             (b"\xd0\xcf\x11\xe0", "an old Excel .xls workbook", "Save the sheet as CSV UTF-8"),
             (b"\x1f\x8b", "a gzip-compressed file", "Decompress it (gunzip)"),
             (b"PAR1", "a Parquet file", "Rename it to .parquet"),
             (b"%PDF", "a PDF document", "Export the table itself as CSV"))


def decode(data: bytes, *, name: str) -> tuple[str, str]:
    """(text, encoding) of a CSV file's bytes; see the module docstring for the rules."""
    for magic, what, fix in _NOT_TEXT:
        if data.startswith(magic):
            raise SchemaError(f"Table {name} is {what}, not a CSV text file. {fix}.", title="Table cannot be decoded")
    for bom, enc in _BOMS:
        if data.startswith(bom):
            try:
                return data.decode(enc), enc.removesuffix("-sig")
            except UnicodeDecodeError as exc:
                raise SchemaError(f"Table {name} starts with a {enc.upper()} byte-order mark but is not valid "
                                  f"{enc.upper()} (byte offset {exc.start}). Export it again as UTF-8.",
                                  title="Table cannot be decoded") from None
    head = data[:4096]
    if b"\x00" in head and head.count(b"\x00") < len(head) // 5:  # UTF-16/32 text is >= 1/4 NULs
        line, count = data[: data.index(b"\x00")].count(b"\n") + 1, data.count(b"\x00")
        raise SchemaError(f"Table {name} holds {count} NUL byte(s), the first on line {line}: a damaged "
                          "export or a binary file, not text. Remove the NUL bytes (e.g. tr -d '\\000') or export "
                          "the table again.", title="Table cannot be decoded")
    if b"\x00" in head:
        raise SchemaError(f"Table {name} holds NUL bytes: it looks like UTF-16 or UTF-32 without a byte-order "
                          "mark. Export it as UTF-8 (or UTF-16 with a byte-order mark).",
                          title="Table cannot be decoded")
    for enc in ("utf-8", "cp1252"):  # Excel on Windows writes cp1252 (its 0x80-0x9F are ’ – € ...)
        try:
            return data.decode(enc), enc
        except UnicodeDecodeError:
            pass
    return data.decode("latin-1"), "latin-1"


_SEP_LINE = re.compile(r"\A\ufeff?sep=(.)[ \t]*\r?\n")


def excel_sep_line(text: str) -> tuple[str, str | None]:
    """(text without Excel's ``sep=;`` first line, the delimiter it declares or None).

    Excel writes and reads such a line to fix the delimiter of a CSV file; it is not the header.
    """
    m = _SEP_LINE.match(text)
    if m is None or m.group(1) in "\r\n\"'":
        return text, None
    return text[m.end():], m.group(1)


def parse_csv(text: str, *, name: str, delimiter: str | None = None) -> pd.DataFrame:
    """A DataFrame of text cells (NaN for pandas' missing spellings) from CSV text.

    Raises:
        SchemaError: empty file, no header, broken quoting or ragged rows (row numbers only).
    """
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise SchemaError(f"Table {name} is empty or holds only whitespace. Export the data again, with a "
                          "header row.", title="Table is empty")
    delim = delimiter or detect_delimiter(text)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delim, strict=True)
    try:  # blank and whitespace-only lines carry nothing (pandas skips them too)
        rows = [r for r in reader if r and not (len(r) == 1 and not r[0].strip())]
    except csv.Error:
        raise SchemaError(f"Table {name} is not valid CSV near line {reader.line_num} (a quote is not closed, a "
                          "stray quote sits inside a field, or a field is over the size limit). Export it again "
                          "with standard quoting.", title="Table cannot be parsed") from None
    if not rows:
        raise SchemaError(f"Table {name} has no rows. Export the data again, with a header row.",
                          title="Table is empty")
    header, body = rows[0], rows[1:]
    width = len(header)
    lengths = np.array([len(r) for r in body], dtype=np.int64)
    problems = []
    for what, mask in (("more", lengths > width), ("fewer", lengths < width)):
        if mask.any():
            problems.append(f"Table {name}: data {rows_text(mask)} have {what} fields than the header "
                            f"({width}). Check the delimiter {delim!r} and quoting, or fix those rows."
                            f"{dialect_hint(text, delim)}")
    if width == 1 and (hint := dialect_hint(text, delim)):
        problems.append(f"Table {name} has a single column when split at {delimiter_name(delim)}s.{hint}")
    elif width == 1 and len(body) >= 2 and len(set(lengths.tolist())) == 1 and lengths[0] > 1:
        problems.insert(0, f"Table {name}: the first line has 1 field but every line below has {int(lengths[0])}: the "
                        "file seems to start with a title or comment line above the header (not shown). Remove "
                        "the line(s) above the header row.")
    if problems:
        raise SchemaError(problems, title=f"Table {name} cannot be parsed in this dialect" if width == 1
                          else f"Table {name} has ragged rows")
    df = pd.DataFrame(body, columns=header, dtype=object) if body else pd.DataFrame(columns=header, dtype=object)
    return df.where(~df.isin(NA_STRINGS), np.nan) if len(df) else df


def read_table(path: str | Path, *, delimiter: str | None = None, decimal: str | None = None) -> pd.DataFrame:
    """Read a CSV/TSV (by extension ``.csv``, ``.tsv``, ``.txt``) or Parquet table.

    ``delimiter``: None detects it (the candidate of ``,`` ``;`` tab ``|`` that splits the first
    lines consistently). ``decimal``: ``"."`` or ``","``; None detects decimal commas in a file
    not separated by commas whose numbers are all written with commas. What was used is in
    ``df.attrs["delimiter"]`` and ``df.attrs["decimal"]``.

    Raises:
        ConfigError: the path does not exist, is not a regular file or has another extension; an
            unknown delimiter or decimal separator.
        SchemaError: the file cannot be decoded or parsed (no cell is quoted).
    """
    if not isinstance(path, (str, os.PathLike)) or isinstance(path, bytes):
        raise ConfigError(f"read_table: expected the path as a file name (str or pathlib.Path), got "
                          f"{type(path).__name__}; e.g. read_table('site_a.csv'). A table already in memory goes to "
                          "ingest() as a DataFrame.")
    for name, value in (("delimiter", delimiter), ("decimal", decimal)):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"read_table: expected {name} as one character (a str), got {type(value).__name__} "
                              "(or leave it unset to detect it).")
    path = Path(path)
    bad = []
    if delimiter is not None and (len(delimiter) != 1 or delimiter in "\r\n\"'"):
        bad.append(f"delimiter {delimiter!r} is not one character other than a quote or a line break; use one of "
                   "',', ';', '\\t', '|' (or leave it unset to detect it)")
    if decimal is not None and decimal not in DECIMALS:
        bad.append(f"decimal {decimal!r} is not one of {list(DECIMALS)} (or leave it unset to detect it)")
    if bad:
        raise ConfigError(f"read_table({path.name}): " + "; ".join(bad) + ".")
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".tsv", ".txt", ".parquet", ".pq"):
        if not path.exists():
            raise ConfigError(f"Table {path} does not exist.")
        if not path.is_file():
            kind = "a directory" if path.is_dir() else "a device, pipe or socket"
            raise ConfigError(f"Table {path} is {kind}, not a regular file. Give the path of the exported .csv "
                              "or .parquet file.")
        hint = {".xlsx": " (save the sheet as CSV UTF-8)", ".xls": " (save the sheet as CSV UTF-8)",
                ".ods": " (save the sheet as CSV UTF-8)", ".gz": " (decompress it first)",
                ".zip": " (unzip it first)"}.get(suffix, "")
        raise ConfigError(f"Table {path}: unsupported extension {suffix!r}; use .csv or .parquet{hint}.")
    data = _read_regular(path)
    if suffix in (".parquet", ".pq"):
        try:
            df = pd.read_parquet(io.BytesIO(data))
        except Exception:  # pyarrow raises several unrelated types for a bad file
            raise SchemaError(f"Table {path} is not a readable Parquet file. Export it again, or use .csv.",
                              title="Table cannot be parsed") from None
        if len(df.columns) == 0:
            raise SchemaError(f"Table {path} has no columns (a Parquet file written from an empty table). Export "
                              "the data again, with its columns.", title="Table is empty")
        df.attrs["encoding"] = "parquet"
        return df
    text, encoding = decode(data, name=str(path))
    text, declared = excel_sep_line(text)
    delim = delimiter or declared or ("\t" if suffix == ".tsv" else None) or detect_delimiter(text)
    df = parse_csv(text, name=str(path), delimiter=delim)
    dec = decimal or ("." if delim == "," else detect_decimal(df))
    df = apply_decimal_comma(df) if dec == "," else apply_thousands(df, ".")
    df.attrs.update(encoding=encoding, delimiter=delim, decimal=dec)
    return df


def read_site_table(path: str | Path, schema: SiteSchema, *, delimiter: str | None = None,
                    decimal: str | None = None) -> pd.DataFrame:
    """:func:`read_table` in the dialect the site schema declares (``delimiter``, ``decimal``);
    an argument given here wins over the schema's, and what neither gives is detected."""
    return read_table(path, delimiter=delimiter if delimiter is not None else schema.delimiter,
                      decimal=decimal if decimal is not None else schema.decimal)
