"""``clinograph check SCHEMA TABLE``: what a hospital table becomes, before anything leaves.

Reads and ingests locally, then prints the features mapped (and from which column or code),
the unit conversions, the counts (patients, observations per feature, snapshots, labels) and
what was refused (columns ignored, codes not in the dictionary, patients dropped) -- or every
problem at once. Nothing is sent anywhere and no cell value or patient id is printed.

``SCHEMA`` is a site schema (``site_schema.toml``; then ``TABLE`` is a CSV/Parquet file) or an
EHR source file with ``[omop]``, ``[meds]`` or ``[fhir]`` (then ``TABLE`` is the source's
location: a .duckdb file, a folder, a database URL, a MEDS root or a FHIR export); see
docs/ehr_formats.md. Mount with ``app.command("check")(check)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from clinograph.core.errors import ClinographError


def check(
    schema: Annotated[Path, typer.Argument(help="site_schema.toml, or an EHR source file (\\[omop]/\\[meds]/\\[fhir]).")],
    table: Annotated[str, typer.Argument(help="CSV/Parquet table, or the EHR source's location (file, folder, URL).")],
    dictionary: Annotated[Path, typer.Option("--dictionary", help="The federation's feature dictionary (TOML).")],
    delimiter: Annotated[str | None, typer.Option("--delimiter", help="CSV field delimiter (default: detected).")] = None,
    decimal: Annotated[str | None, typer.Option("--decimal", help="CSV decimal separator '.' or ',' (default: "
                                                                  "detected).")] = None,
) -> None:
    """Preview what TABLE becomes under SCHEMA: features mapped, converted, counted, refused. Sends nothing."""
    from .guard import (
        guarded,  # a non-ClinographError: exit 3, no traceback (it could quote a cell)
    )

    guarded(_check)(schema, table, dictionary=dictionary, delimiter=delimiter, decimal=decimal)


def _check(schema: Path, table: str, *, dictionary: Path, delimiter: str | None, decimal: str | None) -> None:
    try:
        lines = preview(schema, table, dictionary=dictionary, delimiter=delimiter, decimal=decimal)
    except ClinographError as exc:
        typer.echo(f"refused: {exc}", err=True)
        raise typer.Exit(code=2) from None
    for line in lines:
        typer.echo(line)
    typer.echo("Nothing was sent: this is a local preview.")


def preview(schema_path: Path, table: str, *, dictionary: Path, delimiter: str | None = None,
            decimal: str | None = None) -> list[str]:
    """The preview's lines (see :func:`check`).

    Raises:
        ClinographError: the schema, dictionary or table cannot be read, or the table does not
            ingest (every problem listed).
    """
    import tomllib

    from clinograph.core.errors import ConfigError, SchemaError
    from clinograph.core.tomlio import read_toml_text
    from clinograph.sdk.ingest import ingest, read_site_table
    from clinograph.sdk.ingest.source_probe import format_hint, read_url_file
    from clinograph.sdk.ingest.sources import EhrSourceConfig, is_source_file, read_source
    from clinograph.sdk.ontology import FeatureDictionary, SiteSchema

    d = FeatureDictionary.from_toml(dictionary)
    try:
        raw = tomllib.loads(read_toml_text(schema_path, what="schema"))
    except tomllib.TOMLDecodeError:
        raw = {}  # load_toml_model below reports the syntax error with its line
    lines = [f"dictionary: {d.name} v{d.version} ({len(d.features)} features)"]
    if is_source_file(raw):
        config = EhrSourceConfig.from_toml(schema_path)
        where = None
        if table.endswith(".url") and Path(table).is_file():  # a SuperNode data-dir's source.url: its URL
            where, table = table, read_url_file(Path(table))
        try:
            extract = read_source(config, table, dictionary=d, base=schema_path.parent)
        except (ConfigError, SchemaError) as exc:
            hint = format_hint(config, table, where=where)
            if not hint:
                raise
            raise ConfigError(f"{exc}{hint}") from None
        lines += [f"site: {config.site} ({config.kind})", *extract.report.lines()]
        result = extract.ingest(d)
        mapping = {f: f"codes of {f}" for f in extract.report.by_feature}
    else:
        site = SiteSchema.from_toml(schema_path)
        df = read_site_table(table, site, delimiter=delimiter, decimal=decimal)  # the flags win over the schema's
        lines += [f"site: {site.site} ({site.format} table)", f"rows read: {len(df)}"]
        if "delimiter" in df.attrs:
            lines.append(f"dialect: delimiter {df.attrs['delimiter']!r}, decimal {df.attrs['decimal']!r}, "
                         f"encoding {df.attrs['encoding']}")
        result = ingest(df, schema=site, dictionary=d)
        mapping = {cm.feature: f"column {col!r}" for col, cm in site.columns.items()}
        if result.report.absent_columns:
            lines.append(f"warning: {absent_columns_text(result.report.absent_columns)}")
        if result.report.empty_columns:
            lines.append(f"warning: {empty_columns_text(result.report.empty_columns)}")
        lines += [f"warning: column {col!r}: {why}." for col, why in result.report.far_from_reference.items()]
    return lines + _summary(result, d, mapping)


def empty_columns_text(columns: tuple[str, ...]) -> str:
    """The warning for mapped columns without a value in any row (shown by check and simulate)."""
    return (f"{len(columns)} mapped column(s) hold no value in any row: {', '.join(map(repr, columns))}; their "
            "features are missing for every patient here (not measured, or every cell a declared missing value). "
            "If the export should have them, check it; else nothing to do (or list them under ignore).")


def absent_columns_text(columns: tuple[str, ...]) -> str:
    """The warning for site-schema columns a wide table lacks (shown by check and predict)."""
    return (f"the site schema maps {len(columns)} column(s) the table does not have: "
            f"{', '.join(map(repr, columns))}; their features are missing for every patient. Check the export "
            "(a renamed or dropped column), or remove them from [columns].")


def _summary(t, d, mapping: dict[str, str]) -> list[str]:
    import numpy as np

    r = t.report
    node_ids = d.node_ids()
    counts: dict[str, int] = {}
    for node, n in zip(*np.unique(t.node, return_counts=True), strict=True):
        fid = node_ids[int(node)].split("=")[0]
        counts[fid] = counts.get(fid, 0) + int(n)
    out = [f"patients: {t.n_patients}, observations: {r.observations}, snapshots: {t.n_snapshots}"]
    if t.survival is not None:  # labels are the events: say so in the survival task's words
        ev = int(np.sum(t.survival.event))  # counts only: check prints no cell value (a follow-up time is one)
        out.append(f"survival: {ev} event(s), {len(t.survival.event) - ev} censored (labels are the events)")
    elif r.labelled:
        pos, neg = int((t.labels == 1).sum()), int((t.labels == 0).sum())
        out.append(f"labels: {pos} positive, {neg} negative")
        if t.n_patients and not (pos and neg):
            out.append(f"warning: every patient's label is {1 if pos else 0}: this table alone cannot be used to "
                       "evaluate a classifier (AUROC is undefined), and in a federation it pulls the model towards "
                       "one class. Check the label column and its coding (0/1, true/false, yes/no).")
    else:
        out.append("labels: none (schema declared unlabeled)")
    out.append("features mapped:")
    for f in d.features:
        if f.id in counts:
            conv = next((c for col, c in r.converted_columns.items() if mapping.get(f.id) == f"column {col!r}"), None)
            unit = f", converted {conv}" if conv else (f", in {f.unit}" if f.kind.value == "numeric" else "")
            src = mapping.get(f.id, "its id or alias")
            out.append(f"  {f.id:<24} {counts[f.id]:>7} observation(s){unit}  <- {src}")
    absent = [f.id for f in d.features if f.id not in counts]
    if absent:
        out.append(f"features this hospital does not observe ({len(absent)}): {', '.join(absent)}")
    if r.converted_columns:
        out.append("unit conversions: " + "; ".join(f"{c}: {u}" for c, u in r.converted_columns.items()))
    refused = []
    if r.ignored_columns:
        refused.append(f"columns ignored: {', '.join(map(repr, r.ignored_columns))}")  # repr: no raw escapes
    if r.dropped_patients_missing_label:
        refused.append(f"patients dropped without a label: {r.dropped_patients_missing_label}")
    if r.declared_missing_cells:
        by = ", ".join(f"{c!r} {n}" for c, n in r.declared_missing_by_column.items())
        refused.append(f"cells read as missing ([policy] missing_values): {r.declared_missing_cells}"
                       + (f" (by column: {by})" if by else ""))
    if r.duplicate_observations_dropped:
        refused.append(f"exact duplicate observations dropped: {r.duplicate_observations_dropped}")
    return out + (["refused:", *(f"  {x}" for x in refused)] if refused else ["refused: nothing"])
