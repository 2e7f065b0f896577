"""The hospital inside a Flower SuperNode, built from files -- the default participant factory.

``clinograph supernode --node-config "hospital='h1' data-dir='/srv/h1/data' state-dir='/srv/h1/state'
key-file='/srv/h1/keys/h1.ed25519.pem' federation-file='/srv/h1/keys/federation.toml'"``

``data-dir`` holds ``table.csv`` (or ``table.parquet``: the hospital's own columns and units),
``schema.toml`` (its SiteSchema) and ``hospital.toml`` (its :class:`~clinograph.sdk.config.HospitalConfig`:
model, training, privacy, release; ``dictionary`` relative to that file). The DP ledger lives
in ``state-dir``. A deployment writes these files; it copies no code.

A hospital whose data is an EHR export reads it where it is: ``schema.toml`` is then its EHR
source file (``[omop]``, ``[meds]`` or ``[fhir]``, as ``clinograph check`` and ``clinograph
simulate`` read it: docs/ehr_formats.md) and the source is ``data-dir/source`` (an OMOP CSV
folder, a MEDS root, a FHIR export folder), one FHIR file named by its format
(``source.json``: a Bundle; ``source.ndjson``, ``source.ndjson.gz``: bulk NDJSON),
``data-dir/source.duckdb`` (an OMOP CDM in DuckDB), or the database URL written in ``data-dir/source.url`` (an OMOP CDM in PostgreSQL: a
file, so that its credentials are not in the SuperNode's command line).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clinograph.secure.enrolment import load_federation

from clinograph.core.errors import ConfigError, SchemaError
from clinograph.core.identity import Identity

from ..config import DP_DEFAULT_MODEL_LINE, HospitalConfig, dp_default_model
from ..ingest.source_probe import check_declared_features, probe_source, read_url_file
from ..ingest.sources import EhrSourceConfig, ingest_site, load_site_source
from ..ontology import FeatureDictionary
from ..tasks import create_task
from .build import build_hospital
from .candidates import Candidate, candidate_configs
from .client import HospitalClient
from .member import FederationMember, MemberCandidate, canonical, with_horizon
from .setup import HospitalSetup, refuse_under_dp, setup_sums

_log = logging.getLogger(__name__)


def load_dictionary(config: HospitalConfig, where: Path) -> FeatureDictionary:
    """The dictionary the hospital config names (required: a silent default would be the demo's)."""
    if config.dictionary is None:
        raise ConfigError(f"{where} names no feature dictionary: set `dictionary = \"dictionary.toml\"` "
                          "(the same file at every hospital of the federation).")
    dictionary = FeatureDictionary.from_toml(config.dictionary)
    if isinstance(config.model.features, tuple):
        # an id the dictionary lacks is named here, not at round 0's training (model init said nothing)
        from .coverage import check_features

        check_features(config.model.features, dictionary)
    return dictionary


#: where an EHR source file's data is, in the data-dir (module docstring)
SOURCE_NAMES = ("source.url", "source", "source.duckdb", "source.json", "source.ndjson", "source.ndjson.gz")


def source_location(data: Path) -> str | Path | None:
    """The data-dir's EHR source: the URL in ``source.url`` (one line), else the one of
    :data:`SOURCE_NAMES` present, else None.

    Raises:
        ConfigError: ``source.url`` is empty, not one line, or not a URL; more than one source.
    """
    url = data / "source.url"
    present = [n for n in SOURCE_NAMES if (data / n).exists()]
    if len(present) > 1:  # one would be read and the other ignored, silently
        raise ConfigError(f"{data} holds {len(present)} EHR sources ({', '.join(present)}); the SuperNode reads one. "
                          f"Keep the one this hospital reads and move the other(s) out of the data-dir.")
    if url.is_file():
        try:
            return read_url_file(url)
        except ConfigError as exc:
            raise ConfigError(f"{exc} Or remove the file and put the export at {data / 'source'}.") from None
    return next((data / n for n in SOURCE_NAMES[1:] if (data / n).exists()), None)


def ehr_location(data: Path, source: EhrSourceConfig) -> str | Path:
    """Where ``source`` (the data-dir's EHR source file) reads from (:func:`source_location`).

    Raises:
        ConfigError: no source in the data-dir, or a database URL for a MEDS or FHIR source (files only).
    """
    kind = source.kind
    if kind != "omop" and (data / "source.url").is_file():
        raise ConfigError(f"{data / 'source.url'} names a database, but schema.toml is a [{kind}] source, which reads "
                          f"files: put the export at {data / 'source'} and remove source.url.")
    location = source_location(data)
    if location is None:
        put = {"omop": f"the OMOP CDM at {data / 'source'} (a folder of its table files), a DuckDB file at "
                       f"{data / 'source.duckdb'}, or its database URL in {data / 'source.url'}",
               "meds": f"the MEDS dataset's root (holding data/) at {data / 'source'}",
               "fhir": f"the FHIR export (a folder of Bundle .json or bulk .ndjson files) at {data / 'source'}, "
                       f"or its one file as {data / 'source.json'} (a Bundle) or source.ndjson(.gz)"}[kind]
        raise ConfigError(f"{data / 'schema.toml'} is an EHR source file ([{kind}]) but {data} holds no source: put "
                          f"{put}.")
    if kind == "fhir" and isinstance(location, Path) and location.name == "source" and location.is_file():
        # read by its name's suffix: without one, an NDJSON export was parsed as one JSON document
        raise ConfigError(f"{location} is one file; a FHIR file is read by its format's suffix: rename it "
                          f"{data / 'source.json'} (a Bundle or one resource) or source.ndjson / source.ndjson.gz "
                          "(bulk NDJSON), or put the export's folder at source.")
    return location


def check_data_dir(node_config: Mapping[str, Any]) -> None:
    """At the SuperNode's start, before Flower connects: the files :func:`make_hospital` reads are
    there and their settings valid -- ``hospital.toml`` (and the dictionary it names),
    ``schema.toml``, ``table.csv`` or ``table.parquet``. Before, a missing or bad file was found
    only at a run's first message: the hospital refused the server's hello with a traceback in its
    log, and the run went on without it. An EHR source is opened as its reader will open it
    (:func:`~clinograph.sdk.ingest.source_probe.probe_source`: the database connected to, the CDM's
    tables and columns, a MEDS root's shards and label file, a FHIR export's files; a format other
    than schema.toml's section named). The rows are read when a run starts.

    Raises:
        ConfigError: every problem at once, each naming its file and the fix.
    """
    data = Path(str(node_config.get("data-dir", "")))
    if not data.is_dir():
        raise ConfigError(f"--node-config data-dir {data} is not a directory: give the folder holding this hospital's "
                          "table.csv, schema.toml and hospital.toml (examples/flower_deployment/README.md, step 5).")
    problems: list[str] = []
    dictionary = None
    try:
        config = HospitalConfig.from_toml(data / "hospital.toml")
        dictionary = load_dictionary(config, data / "hospital.toml")
    except ConfigError as exc:
        problems.append(str(exc))
    else:
        if create_task(config.task).participant is not None:  # its own files: not ours to check
            if problems:
                raise ConfigError("\n".join(problems))
            return
    schema = None
    try:
        schema = load_site_source(data / "schema.toml")
    except ConfigError as exc:
        problems.append(str(exc))
    hospital = node_config.get("hospital")
    if schema is not None and isinstance(hospital, str) and schema.site != hospital:  # build_hospital's check, now
        problems.append(f"{data / 'schema.toml'} names site {schema.site!r}, but this SuperNode serves hospital "
                        f"{hospital!r} (--node-config hospital, its key's name): a hospital reads only its own "
                        f"data -- write site = {hospital!r} there, or give this node the data-dir of {schema.site!r}.")
    if isinstance(schema, EhrSourceConfig):
        if dictionary is not None:
            try:  # the features it names (age, sex, units, ...), as the reader checks them before any row
                check_declared_features(schema, dictionary)
            except SchemaError as exc:
                problems.append(f"{data / 'schema.toml'}: {exc}")
        try:  # opened as the reader will, no row read: a database, password or format that fails, found now
            location = ehr_location(data, schema)
            probe_source(schema, location, base=data,
                         where=str(data / "source.url") if isinstance(location, str) else None)
        except (ConfigError, SchemaError) as exc:
            problems.append(str(exc))
    elif schema is None and any((data / n).exists() for n in SOURCE_NAMES):
        pass  # an EHR export whose schema.toml failed: named above, not a missing table
    elif not any((data / f).is_file() for f in ("table.csv", "table.parquet")):
        problems.append(f"{data} holds no table.csv (or table.parquet): put this hospital's export there, in its own "
                        "column names and units (schema.toml maps them), or an EHR export at "
                        f"{data / 'source'} with its EHR source file as schema.toml.")
    if problems:
        raise ConfigError(f"The SuperNode's data-dir {data} cannot build the hospital ({len(problems)} problem(s)):\n"
                          + "\n".join("  - " + p.replace("\n", "\n    ") for p in problems))


def make_hospital(*, node_config: Mapping[str, Any], run_config: Mapping[str, Any], run_id: int,
                  identity: Identity) -> Any:
    """The hospital over this node's data, keys and settings, for a whole federation run: the
    set-up sums its config asks for (``[scaling] source = "federated"``, ``[model] features =
    "shared"``: :mod:`.setup`), then its own candidates (``[selection] candidates`` × ``restarts``
    of ``hospital.toml``), each built on the ingested table (rescaled by the set-up) when the
    server's signed ``run/start`` names it.

    Raises:
        ConfigError: a set-up sum under ``[privacy]`` (exact sums are outside the accountant).
    """
    data = Path(str(node_config["data-dir"]))
    if not node_config.get("federation-file"):
        raise ConfigError("--node-config lacks federation-file (the federation.toml from `clinograph keys init`).")
    federation = load_federation(Path(str(node_config["federation-file"])))
    config = HospitalConfig.from_toml(data / "hospital.toml")
    dictionary = load_dictionary(config, data / "hospital.toml")
    if dp_default_model(config):
        _log.info("%s", DP_DEFAULT_MODEL_LINE)
    own = create_task(config.task).participant
    if own is not None:  # a task whose hospital is not a FederationMember (concepts: a voted run)
        return own(node_config=node_config, config=config, dictionary=dictionary, federation=federation,
                   identity=identity, data=data)
    schema = load_site_source(data / "schema.toml")
    if isinstance(schema, EhrSourceConfig):  # an EHR export read where it is (module docstring)
        location = ehr_location(data, schema)
    else:
        location = next((data / f for f in ("table.csv", "table.parquet") if (data / f).exists()), data / "table.csv")
    table = ingest_site(location, schema, dictionary=dictionary, base=data)
    shown = data / "source.url" if isinstance(location, str) else location  # a URL may carry a password
    _log.info("read %d patient(s) from %s (%d feature(s) observed)", table.n_patients,
              f"the {schema.kind.upper()} export at {shown}" if isinstance(schema, EhrSourceConfig) else shown,
              len(table.report.features_present))
    cands = candidate_configs(config) or [Candidate(name="model", overrides={}, config=config)]
    refuse_under_dp(config, cands, where=str(data / "hospital.toml"))  # before anything runs
    state_dir = Path(str(node_config["state-dir"])) / "privacy"
    sums = setup_sums(config, dictionary=dictionary, candidates=cands)
    setup = HospitalSetup(table=table, dictionary=dictionary, config=config, candidates=cands, identity=identity,
                          state_dir=state_dir,
                          server=federation.server_public(), peers=federation.enrolled(),
                          federation_id=federation.federation_id) if sums else None

    def build(fid: str, cfg: HospitalConfig) -> HospitalClient:
        t, d = (setup.table, setup.dictionary) if setup is not None else (table, dictionary)
        return build_hospital(t, dictionary=d, config=setup.resolve(cfg) if setup is not None else cfg,
                              identity=identity, server=federation.server_public(), peers=federation.enrolled(),
                              federation_id=fid, state_dir=state_dir)

    return FederationMember(identity=identity, server=federation.server_public(),
                            federation_id=federation.federation_id,
                            candidates=[MemberCandidate(name=c.name, overrides=canonical(c.overrides),
                                                        build=lambda fid, rounds, cfg=c.config: build(
                                                            fid, with_horizon(cfg, rounds)))
                                        for c in cands], setup=setup,
                            position=Path(str(node_config["state-dir"])) / "member_position.json", run_key=str(run_id))


make_hospital.preflight = check_data_dir  # type: ignore[attr-defined]  # the launcher calls it at start
