"""What ``clinograph predict`` writes back into the EHR besides ``--out``: the options, their
checks, and the writes (FHIR RiskAssessments, the OMOP results CSV and table). The formats are
in :mod:`clinograph.sdk.model.fhir_risk` and :mod:`clinograph.sdk.model.omop_results`
(docs/ehr_formats.md, "Predictions back into the EHR"). SDK imports are lazy (the CLI starts
without the training stack).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EhrOutputs:
    """What ``clinograph predict`` writes back into the EHR besides ``--out`` (None: nothing)."""

    fhir_out: Path | None = None
    fhir_subject: str | None = None
    outcome: str | None = None
    omop_out: Path | None = None
    omop_table: str | None = None


@dataclass
class Source:
    """New patients as read: the ingested table and what the EHR writers need to know of the source."""

    patients: object  # PatientTable
    omop_id: str = "person_source_value"  # the results table's id column ([omop] patient_id, else source ids)
    location: str = ""  # --table: a file, folder or database URL


def check_ehr_options(ehr: EhrOutputs, raw: dict) -> None:
    """Refuse inconsistent EHR output options before the model is loaded."""
    from clinograph.core.errors import ConfigError
    from clinograph.sdk.model.fhir_risk import check_subject
    from clinograph.sdk.model.omop_results import check_table_name

    problems = []
    if ehr.fhir_out is None and (ehr.fhir_subject is not None or ehr.outcome is not None):
        problems.append("--fhir-subject and --outcome shape the RiskAssessments; add --fhir-out PATH to write them.")
    if ehr.fhir_subject is not None:
        check_subject(ehr.fhir_subject)
    if ehr.outcome is not None and not 0 < len(ehr.outcome.strip()) <= 200:
        problems.append("--outcome is empty or longer than 200 characters; name the outcome briefly, e.g. "
                        "--outcome \"in-hospital death\".")
    by_id = isinstance(raw.get("fhir"), dict) and raw["fhir"].get("patient_id", "id") == "id"
    if ehr.fhir_out is not None and ehr.fhir_subject is None and not by_id:
        problems.append("--fhir-out needs --fhir-subject: these patient ids are not FHIR Patient ids (they were not "
                        "read from a FHIR source by id), so give the identifier system URI of your ids (e.g. "
                        "--fhir-subject https://hospital.example/fhir/sid/mrn), or 'reference' if they are FHIR ids.")
    if ehr.omop_table is not None:
        check_table_name(ehr.omop_table)
        if "omop" not in raw:
            problems.append("--omop-table writes into the OMOP database the patients are read from, so --schema must "
                            "be an [omop] source file and --table its database. Fix: use --omop-out PATH to write the "
                            "results as CSV instead.")
    if problems:
        raise ConfigError(" ".join(problems))


def write_ehr(preds, source: Source, ehr: EhrOutputs) -> list[str]:  # noqa: ANN001 - Predictions
    """Write the EHR outputs ``ehr`` asks for; the lines to print. Rows and resources are all built
    (and so checked) before anything is written; the database table goes first (one transaction,
    the write most likely to fail), then the files."""
    from clinograph.sdk.model.fhir_risk import REFERENCE, risk_assessments, write_risk_assessments
    from clinograph.sdk.model.omop_results import (
        result_rows,
        results_engine,
        write_results_csv,
        write_results_table,
    )

    subject = ehr.fhir_subject or REFERENCE
    if ehr.fhir_out is not None:
        risk_assessments(preds, subject=subject, outcome=ehr.outcome)
    rows = result_rows(preds, id_column=source.omop_id) if ehr.omop_out or ehr.omop_table else []
    lines, digest = [], preds.model_sha256[:16]
    if ehr.omop_table is not None:
        engine = results_engine(source.location)
        try:
            n = write_results_table(engine, ehr.omop_table, rows)
        finally:
            engine.dispose()
        lines.append(f"{n} OMOP result row(s) appended to table {ehr.omop_table} (model sha256 {digest}…)")
    if ehr.fhir_out is not None:
        n = write_risk_assessments(ehr.fhir_out, preds, subject=subject, outcome=ehr.outcome)
        lines.append(f"{n} FHIR RiskAssessment(s) written to {ehr.fhir_out} (model sha256 {digest}…)")
    if ehr.omop_out is not None:
        formulas = write_results_csv(ehr.omop_out, rows)
        lines.append(f"{len(rows)} OMOP result row(s) written to {ehr.omop_out} (model sha256 {digest}…)")
        if formulas:
            lines.append(f"warning: {formulas} row(s) of {ehr.omop_out} have a person_source_value starting with "
                         "= + - @ or a tab, written as it is (the file is for a database): a spreadsheet would run "
                         "it as a formula. Load the file into the database; do not open it in a spreadsheet.")
    return lines
