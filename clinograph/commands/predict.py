"""``clinograph predict``: per-patient risks for new patients from an exported model, without
the federation.

A hospital exports its selected, calibrated model (``NSFLTask.export``): the star path's weights
as safetensors (data only) and ``<weights>.json``, a description of the architecture, the
dictionary hash, features and calibration that binds the weights' SHA-256 and is signed by the
hospital's identity. This command verifies the signature against ``--trusted-key`` and the
digest against the weights before it builds the model (a TorchScript or pickle file is refused
and never run), maps a new table through the hospital's own site schema onto the dictionary the
model names, refuses another dictionary, checks every risk is a probability, and writes
``patient_id,risk``. The label column may be absent. With ``--audit`` (the federation's audit
directory) and ``--server-key``, the model's shared modules must also be the global model the
server published and released for the round its description names, and its weight-free model
settings the ones that round's signed plan carried (:mod:`clinograph.sdk.model.release`),
checked before the model computes anything. Both checks are required:
``--insecure-untrusted-model`` loads without whichever is not given (no ``--trusted-key``, no
``--audit``: a ckks or distributed-DP federation publishes no global model), with a warning.

A survival export (``[target] kind = "survival"``) writes ``patient_id`` and one column a
horizon, named by it (``risk_12mo``: P(T ≤ 12 months) = 1 − S(12 mo)); the new table needs no
follow-up time or event columns (present ones are ignored, never used as features).

Back into the EHR (docs/ehr_formats.md, "Predictions back into the EHR"): ``--fhir-out`` writes
one FHIR R4 ``RiskAssessment`` a patient (NDJSON), ``--omop-out`` the OMOP-side results table as
CSV, and ``--omop-table`` appends the same rows to a table in the OMOP database the patients were
read from. Every output names the released model by the SHA-256 of its weights, and all carry
the same risks as ``--out``. ``--schema`` may also be an EHR source file (``[omop]``, ``[meds]``,
``[fhir]``, as for ``clinograph check``); ``--table`` is then the source's location.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer

from .predict_ehr import EhrOutputs, Source, check_ehr_options, write_ehr


def predict(
    model: Annotated[Path, typer.Option("--model", help="The exported weights (.safetensors); its signed description "
                                         "<model>.json beside it.")],
    table: Annotated[str, typer.Option("--table", help="New patients: CSV or Parquet in the hospital's own columns; "
                                        "with an EHR source file as --schema, the source's location (file, folder, "
                                        "database URL).")],
    schema: Annotated[Path, typer.Option("--schema", help="The hospital's site schema (TOML), or an EHR source file "
                                         "(\\[omop]/\\[meds]/\\[fhir]).")],
    dictionary: Annotated[Path, typer.Option("--dictionary", help="The feature dictionary (TOML) the model uses.")],
    out: Annotated[Path, typer.Option("--out", help="Where to write patient_id,risk (CSV); a survival model writes "
                                       "patient_id and one risk_<horizon> column a horizon.")],
    trusted_key: Annotated[str | None, typer.Option("--trusted-key", help="The exporting hospital's Ed25519 public "
                                                    "key: its public_key in federation.toml, as base64 or a file "
                                                    "holding it (or a PEM public key).")] = None,
    audit: Annotated[Path | None, typer.Option("--audit", help="The federation's audit directory: the model's "
                                               "shared modules and model settings must be what the "
                                               "server released (needs --server-key; required unless "
                                               "--insecure-untrusted-model).")] = None,
    server_key: Annotated[str | None, typer.Option("--server-key", help="The server's Ed25519 public key "
                                                   "(\\[server] public_key in federation.toml, or server.pub: "
                                                   "base64, a file or PEM), for --audit.")] = None,
    insecure_untrusted_model: Annotated[bool, typer.Option(
        "--insecure-untrusted-model", help="INSECURE: load a model without the anchor not given: no --trusted-key "
        "(description unsigned) or no --audit (release unchecked); what is given, the weights' digest and the "
        "output ranges are still checked.")] = False,
    fhir_out: Annotated[Path | None, typer.Option("--fhir-out", help="Also write one FHIR R4 RiskAssessment a "
                                                  "patient here (NDJSON).")] = None,
    fhir_subject: Annotated[str | None, typer.Option("--fhir-subject", help="How RiskAssessment.subject names the "
                                                     "patient: 'reference' (Patient/<id>: the ids are FHIR Patient "
                                                     "ids; the default for a \\[fhir] source read by id) or the "
                                                     "identifier system URI of the ids (e.g. your MRN system).")] = None,
    outcome: Annotated[str | None, typer.Option("--outcome", help="The outcome's text in "
                                                "RiskAssessment.prediction (default: names the model).")] = None,
    omop_out: Annotated[Path | None, typer.Option("--omop-out", help="Also write the OMOP-side results table here "
                                                  "(CSV; schema in docs/ehr_formats.md).")] = None,
    omop_table: Annotated[str | None, typer.Option("--omop-table", help="Also append the results rows to this table "
                                                   "(schema.table allowed; created if absent) in the OMOP database "
                                                   "--table names (--schema an \\[omop] source file).")] = None,
) -> None:
    """Write each patient's risk from an exported model (and, if asked, FHIR RiskAssessments and OMOP results)."""
    from .guard import guarded

    guarded(_predict)(model, table, schema, dictionary, out, trusted_key=trusted_key,
                      insecure_untrusted_model=insecure_untrusted_model, audit=audit, server_key=server_key,
                      ehr=EhrOutputs(fhir_out=fhir_out, fhir_subject=fhir_subject, outcome=outcome,
                                     omop_out=omop_out, omop_table=omop_table))


def _check_paths(model: Path, table: str, schema: Path, dictionary: Path, out: Path, ehr: EhrOutputs,
                 source_file: bool) -> None:
    from clinograph.core.errors import ConfigError

    files = [("model", model, "give the .safetensors file written by NSFLTask.export."),
             ("schema", schema, "give the hospital's site schema or EHR source file (TOML)."),
             ("dictionary", dictionary, "give the federation's feature dictionary (TOML).")]
    if not source_file:
        files.insert(1, ("table", Path(table), "give the new patients' CSV or Parquet file."))
    problems = [f"--{what} {p} is not a file; {fix}" for what, p, fix in files if not p.is_file()]
    if problems:
        raise ConfigError(" ".join(problems))
    inputs = [("table", Path(table)), ("schema", schema), ("dictionary", dictionary), ("model", model),
              ("model description", model.with_name(model.name + ".json"))]
    outputs = [("--out", out), ("--fhir-out", ehr.fhir_out), ("--omop-out", ehr.omop_out)]
    for flag, target in ((f, t) for f, t in outputs if t is not None):
        if target.is_dir():
            raise ConfigError(f"{flag} {target} is a folder; give a file path such as {target / 'risks.csv'}.")
        clash = [what for what, p in inputs if target.exists() and p.exists() and target.resolve() == p.resolve()]
        if clash:
            raise ConfigError(f"{flag} {target} is the {clash[0]} file: writing the risks would overwrite it. "
                              f"Give another path for {flag}.")
    given = [t.resolve() for _, t in outputs if t is not None]
    if len(set(given)) != len(given):
        raise ConfigError("--out, --fhir-out and --omop-out name the same file; give each its own path.")


def _read_patients(table: str, schema: Path, d, raw: dict) -> Source:  # noqa: ANN001 - a FeatureDictionary
    from clinograph.sdk.ingest import ingest, read_site_table
    from clinograph.sdk.ingest.sources import EhrSourceConfig, is_source_file, read_source
    from clinograph.sdk.ontology import SiteSchema

    if is_source_file(raw):
        config = EhrSourceConfig.from_toml(schema)
        engine = None
        if config.omop is not None:
            from clinograph.sdk.ingest.omop import omop_engine

            engine = omop_engine(table)
        try:
            extract = read_source(config, table, dictionary=d, base=schema.parent, engine=engine)
        finally:
            if engine is not None:
                engine.dispose()  # a .duckdb file is opened read-only to read; --omop-table opens it to write
        omop_id = config.omop.patient_id if config.omop is not None else "person_source_value"
        return Source(patients=extract.ingest(d), omop_id=omop_id, location=table)
    s = SiteSchema.from_toml(schema)
    df = read_site_table(table, s)
    if s.survival is not None:  # new patients: no follow-up yet; time/event columns are never features
        seen = tuple(c for c in (s.survival.time, s.survival.event) if c in df.columns)
        s = s.model_copy(update={"survival": None, "label": None, "unlabeled": True, "ignore": tuple(s.ignore) + seen})
    elif s.label is not None and s.label not in df.columns:  # new patients: no outcome yet
        s = s.model_copy(update={"label": None, "unlabeled": True})
    return Source(patients=ingest(df, schema=s, dictionary=d), location=table)


def _predict(model: Path, table: str, schema: Path, dictionary: Path, out: Path, *, trusted_key: str | None,
             insecure_untrusted_model: bool, ehr: EhrOutputs | None = None, now: datetime | None = None,
             audit: Path | None = None, server_key: str | None = None) -> None:
    import csv
    import tomllib

    from clinograph.core.errors import SchemaError
    from clinograph.core.tomlio import read_toml_text
    from clinograph.sdk.model.description import SURVIVAL_FORMAT
    from clinograph.sdk.model.load import load_exported, predict_exported, predict_survival_exported
    from clinograph.sdk.ontology import FeatureDictionary

    ehr = ehr or EhrOutputs()
    try:
        raw = tomllib.loads(read_toml_text(schema, what="schema")) if schema.is_file() else {}
    except tomllib.TOMLDecodeError:
        raw = {}  # SiteSchema.from_toml reports the syntax error with its line
    from clinograph.sdk.ingest.sources import is_source_file

    _check_paths(model, table, schema, dictionary, out, ehr, source_file=is_source_file(raw))
    check_ehr_options(ehr, raw)
    key = hospital_key(trusted_key) if trusted_key is not None else None
    server = hospital_key(server_key, flag="--server-key", whose="the server's") if server_key is not None else None
    exported = load_exported(model, trusted=key, insecure_untrusted_model=insecure_untrusted_model,
                             audit_dir=audit, server=server)
    info = exported.description
    d = FeatureDictionary.from_toml(dictionary)
    if d.digest() != info.dictionary_hash:
        raise SchemaError([f"--dictionary {dictionary} has hash {d.digest()[:12]}…, the model was trained on "
                           f"{info.dictionary_hash[:12]}…. Use the federation's dictionary file."],
                          title="Dictionary mismatch")
    source = _read_patients(table, schema, d, raw)
    pt = source.patients
    if info.format == SURVIVAL_FORMAT and info.survival is not None:
        header = ["patient_id", *info.survival.risk_columns]
        risks = [list(r) for r in predict_survival_exported(exported, pt)[2]]
        what = f"{len(header) - 1} horizons ({', '.join(header[1:])})"
    else:
        header, risks, what = ["patient_id", "risk"], [[r] for r in predict_exported(exported, pt)], \
            f"calibration {info.calibration.method}"
    from clinograph.sdk.model.predictions import Predictions, spreadsheet_safe

    preds = Predictions.of(description=info, patient_ids=list(pt.patient_ids), risks=risks, created=now)
    written = write_ehr(preds, source, ehr)  # all built and checked first; --out is written last
    out.parent.mkdir(parents=True, exist_ok=True)
    ids = [spreadsheet_safe(pid) for pid in pt.patient_ids]
    with out.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows([pid, *(float(x) for x in r)] for pid, r in zip(ids, risks, strict=True))
    escaped = sum(a != b for a, b in zip(ids, pt.patient_ids, strict=True))
    note = (f"; {escaped} patient id(s) starting with = + - @ or a tab were written with a leading ' so that a "
            "spreadsheet shows them as text instead of running them as a formula") if escaped else ""
    signed = (f"site {info.site!r}, signature checked against key {key.fingerprint[:16]}" if key is not None
              else "signature NOT checked (no --trusted-key, --insecure-untrusted-model)")
    signed += (f"; shared weights and model settings checked against the global model and plan the server "
               f"released for round {exported.released_round}" if exported.released_round is not None
               else "; release NOT checked against an audit trail (no --audit, --insecure-untrusted-model)")
    typer.echo(f"{len(risks)} patients' risks written to {out} (model {model.name}, {signed}, {what}){note}")
    if pt.report is not None and pt.report.absent_columns:
        from .check import absent_columns_text

        typer.echo(f"warning: {absent_columns_text(pt.report.absent_columns)}", err=True)
    for line in written:
        typer.echo(line)


def hospital_key(value: str, *, flag: str = "--trusted-key", whose: str = "the exporting hospital's"):  # noqa: ANN201
    """The public key given as ``flag`` as a PublicIdentity (imported lazily: the CLI starts without
    the SDK), read by :func:`clinograph.core.keyarg.read_public_key`: base64 of 32 bytes, inline or
    in a file, or a PEM public key; anything else a ConfigError saying what it is."""
    from clinograph.core.identity import PublicIdentity
    from clinograph.core.keyarg import read_public_key

    where = "[server] public_key, or server.pub" if flag == "--server-key" else "[hospitals.<name>] public_key"
    fix = f"Pass {whose} public key: the base64 in federation.toml's {where}, or a file holding it."
    return PublicIdentity("trusted", read_public_key(value, flag=flag, fix=fix))
