"""Open an EHR source without reading its rows: what a SuperNode checks at its start.

A hospital's SuperNode reads its export when a run starts (:func:`.sources.ingest_site`). A source
that cannot be read at all -- a database that refuses the connection or the password, a folder of
another format than the source file's section, a MEDS dataset without shards or label file -- was
found only then: the hospital refused the server's hello, and the operator learnt it from a failed
run. :func:`probe_source` finds these at the SuperNode's start, by opening the source as the reader
will (the OMOP CDM's tables and columns by zero-row queries, a MEDS root's shards and label file, a
FHIR export's files), reading no patient row. :func:`looks_like` names the format a location's
layout suggests, so that a source file of one format over an export of another says so.
"""

from __future__ import annotations

from pathlib import Path

from clinograph.core.errors import ConfigError, SchemaError

from ..ontology.dictionary import FeatureDictionary
from .sources import EhrSourceConfig

#: how each format's export is named in messages
FORMATS = {"omop": "an OMOP CDM (a folder of table files, a .duckdb file or a database URL)",
           "meds": "a MEDS dataset (a root holding data/*.parquet)",
           "fhir": "a FHIR export (Bundle .json or bulk .ndjson files)"}


def looks_like(location: str | Path) -> str | None:
    """``"omop"``, ``"meds"`` or ``"fhir"``: the format ``location``'s layout suggests (file names
    only, nothing opened); None when it suggests none."""
    from .fhir import READ_SUFFIXES
    from .omop import _TABLE_FILE, REQUIRED

    text = str(location)
    if "://" in text:
        return "omop"
    path = Path(text)
    if path.is_file():
        name = path.name.lower()
        return "omop" if name.endswith(".duckdb") else "fhir" if name.endswith(READ_SUFFIXES) else None
    if not path.is_dir():
        return None
    files = [p for p in path.iterdir() if p.is_file()]
    if any((m := _TABLE_FILE.match(p.name)) and m.group(1).lower() in REQUIRED for p in files):
        return "omop"
    if (path / "data").is_dir() and next((path / "data").rglob("*.parquet"), None) is not None:
        return "meds"
    if any(p.name.lower().endswith(READ_SUFFIXES) for p in files):
        return "fhir"
    return None


def probe_source(config: EhrSourceConfig, location: str | Path, *, base: Path | None = None,
                 where: str | None = None) -> None:
    """Open ``location`` as ``config``'s section reads it, reading no patient row. ``base``: the
    folder the source file's relative paths (MEDS ``labels``) are taken from; ``where``: how the
    location is named in a message (default: itself; a URL is never shown with its password).
    :func:`check_declared_features` checks the source file against the dictionary.

    Raises:
        SourceUnavailable: the OMOP database cannot be connected to.
        ConfigError: the location does not exist or holds no file of the section's format -- with
            the format its layout suggests when that is another one, and the fix.
        SchemaError: the OMOP CDM lacks tables or columns the reader reads (all named).
    """
    try:
        _open(config, location, base=base)
    except (ConfigError, SchemaError) as exc:
        hint = format_hint(config, location, where=where)
        if not hint:
            raise
        raise ConfigError(f"{exc}{hint}") from None


def check_declared_features(config: EhrSourceConfig, dictionary: FeatureDictionary) -> None:
    """The features ``config`` names are ``dictionary``'s, of the right kind (what each reader checks
    before it reads a row).

    Raises:
        SchemaError: every bad declaration at once.
    """
    if config.omop is not None:
        from .omop_assemble import check_declared

        check_declared(config.omop, dictionary)
        return
    from .ehr_values import declared_features

    section = config.meds if config.meds is not None else config.fhir
    name = f"[{config.kind}]"
    declared_features(section=name, person_section=name, age=section.age, sex=section.sex, conditions=(),
                      units=dict(section.units or {}), dictionary=dictionary)


def format_hint(config: EhrSourceConfig, location: str | Path, *, where: str | None = None) -> str:
    """``" -- LOCATION looks like <format>, but the source file is [<kind>]: <fix>"`` when ``location``'s
    layout suggests another format than ``config``'s section (:func:`looks_like`), else ``""``: added
    to a reader's error, which names only what its own format lacks."""
    kind, other = config.kind, looks_like(location)
    if other is None or other == kind:
        return ""
    return (f" -- {where or location} looks like {FORMATS[other]}, but the source file is [{kind}]: write the "
            f"source file's [{other}] section for it (docs/ehr_formats.md, 'Every source-file key'), or put "
            f"{FORMATS[kind]} there.")


def read_url_file(path: Path) -> str:
    """The database URL a ``source.url`` file holds (one line; a file, so that its credentials are
    on no command line).

    A URL with a password is read only from a file its owner alone may read (mode 0600), as libpq
    reads ``~/.pgpass``: a data-dir's files are often readable by every local user.

    Raises:
        ConfigError: the file is empty, more than one line, or not a URL (its text is not shown), or
            it holds a password and group or others may read it.
    """
    import os
    from urllib.parse import urlsplit

    from clinograph.core.fileio import read_regular

    text = read_regular(path, limit=4096).decode("utf-8", errors="replace").strip()
    if not text or "\n" in text or "://" not in text:
        raise ConfigError(f"{path} must hold one database URL on one line (e.g. postgresql+psycopg://reader@db/cdm); "
                          "it holds something else. Write the OMOP CDM's URL there.")
    try:
        password = urlsplit(text).password
    except ValueError:  # an unparsable URL: the engine names it (without echoing it)
        password = None
    mode = os.stat(path).st_mode & 0o777
    if password and mode & 0o077:
        raise ConfigError(f"{path} holds a database password and group or others may read it (mode {mode:04o}): "
                          f"chmod 600 {path}, or remove the password from the URL and keep it in ~/.pgpass or "
                          "PGPASSFILE (mode 0600), which the PostgreSQL driver reads.")
    return text


def _open(config: EhrSourceConfig, location: str | Path, *, base: Path | None) -> None:
    if config.omop is not None:
        from .omop import check_cdm, omop_engine

        engine = omop_engine(location)
        try:
            check_cdm(engine, cdm_schema=config.omop.cdm_schema,
                      death=bool(config.omop.label and config.omop.label.death))
        finally:
            engine.dispose()
        return
    if config.meds is not None:
        from .meds import shard_paths

        shard_paths(Path(location))
        if config.meds.labels is not None:
            labels = (base or Path(".")) / config.meds.labels
            if not labels.is_file():
                raise ConfigError(f"MEDS label file {labels} does not exist ([meds] labels = "
                                  f"{str(config.meds.labels)!r}, relative to the source file's folder). Put the "
                                  "label file there, or set labels to where it is.")
        return
    from .fhir import folder_files

    path = Path(location)
    if not path.exists():
        raise ConfigError(f"FHIR input {path} does not exist. Give a Bundle .json, an .ndjson file or a folder.")
    folder_files(path)
