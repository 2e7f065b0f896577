"""``clinograph predict``: per-patient risks for new patients from an exported model, without
the federation.

A hospital exports its selected, calibrated model (``NSFLTask.export``: TorchScript of the
star path plus a sidecar JSON with the dictionary hash and feature list). This command maps a
new table through the hospital's own site schema onto the dictionary the model names, refuses
another dictionary, and writes ``patient_id,risk``. The label column may be absent.

A survival export (``[target] kind = "survival"``) writes ``patient_id`` and one column a
horizon, named by it (``risk_12mo``: P(T ≤ 12 months) = 1 − S(12 mo)); the new table needs no
follow-up time or event columns (present ones are ignored, never used as features).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer


def predict(
    model: Annotated[Path, typer.Option("--model", help="The exported model (.pt); its sidecar <model>.json beside it.")],
    table: Annotated[Path, typer.Option("--table", help="New patients: CSV or Parquet in the hospital's own columns.")],
    schema: Annotated[Path, typer.Option("--schema", help="The hospital's site schema (TOML).")],
    dictionary: Annotated[Path, typer.Option("--dictionary", help="The feature dictionary (TOML) the model uses.")],
    out: Annotated[Path, typer.Option("--out", help="Where to write patient_id,risk (CSV); a survival model writes "
                                       "patient_id and one risk_<horizon> column a horizon.")],
) -> None:
    """Write each patient's risk from an exported model."""
    from ..cli import guarded

    guarded(_predict)(model, table, schema, dictionary, out)


def _predict(model: Path, table: Path, schema: Path, dictionary: Path, out: Path) -> None:
    import csv

    from clinograph.sdk.ingest import ingest, read_table
    from clinograph.sdk.model.export import (
        SURVIVAL_FORMAT,
        load_exported,
        predict_exported,
        predict_survival_exported,
    )
    from clinograph.sdk.ontology import FeatureDictionary, SiteSchema
    from clinograph.secure.errors import ConfigError, SchemaError

    problems = [f"--{what} {p} is not a file; {fix}" for what, p, fix in (
        ("model", model, "give the .pt written by NSFLTask.export."),
        ("table", table, "give the new patients' CSV or Parquet file."),
        ("schema", schema, "give the hospital's site schema (TOML)."),
        ("dictionary", dictionary, "give the federation's feature dictionary (TOML).")) if not p.is_file()]
    if problems:
        raise ConfigError(" ".join(problems))
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; give a file path such as {out / 'risks.csv'}.")
    clash = [what for what, p in (("table", table), ("schema", schema), ("dictionary", dictionary), ("model", model),
                                  ("model sidecar", model.with_suffix(".json")))
             if out.exists() and p.exists() and out.resolve() == p.resolve()]
    if clash:
        raise ConfigError(f"--out {out} is the {clash[0]} file: writing the risks would overwrite it. Give another "
                          "path for --out.")
    module, info = load_exported(model)
    d = FeatureDictionary.from_toml(dictionary)
    if d.digest() != info["dictionary_hash"]:
        raise SchemaError([f"--dictionary {dictionary} has hash {d.digest()[:12]}…, the model was trained on "
                           f"{str(info['dictionary_hash'])[:12]}…. Use the federation's dictionary file."],
                          title="Dictionary mismatch")
    s = SiteSchema.from_toml(schema)
    df = read_table(table)
    if s.survival is not None:  # new patients: no follow-up yet; time/event columns are never features
        seen = tuple(c for c in (s.survival.time, s.survival.event) if c in df.columns)
        s = s.model_copy(update={"survival": None, "label": None, "unlabeled": True, "ignore": tuple(s.ignore) + seen})
    elif s.label is not None and s.label not in df.columns:  # new patients: no outcome yet
        s = s.model_copy(update={"label": None, "unlabeled": True})
    pt = ingest(df, schema=s, dictionary=d)
    if info["format"] == SURVIVAL_FORMAT:
        header = ["patient_id", *info["risk_columns"]]
        risks = [list(r) for r in predict_survival_exported(module, info, pt)[2]]
        what = f"{len(header) - 1} horizons ({', '.join(header[1:])})"
    else:
        header, risks, what = ["patient_id", "risk"], [[r] for r in predict_exported(module, info, pt)], \
            f"calibration {info.get('calibration', {}).get('method', 'none')}"
    out.parent.mkdir(parents=True, exist_ok=True)
    ids = [spreadsheet_safe(pid) for pid in pt.patient_ids]
    with out.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows([pid, *(float(x) for x in r)] for pid, r in zip(ids, risks, strict=True))
    escaped = sum(a != b for a, b in zip(ids, pt.patient_ids, strict=True))
    note = (f"; {escaped} patient id(s) starting with = + - @ or a tab were written with a leading ' so that a "
            "spreadsheet shows them as text instead of running them as a formula") if escaped else ""
    typer.echo(f"{len(risks)} patients' risks written to {out} (model {model.name}, {what}){note}")


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"^[+-]?\d+(?:\.\d+)?$")


def spreadsheet_safe(cell: str) -> str:
    """``cell`` with a leading ``'`` if a spreadsheet would read it as a formula (CSV injection,
    OWASP "CSV Injection"): it starts with ``= + - @``, a tab or a carriage return and is not a
    plain number such as ``-12``."""
    if cell.startswith(_FORMULA_START) and not _PLAIN_NUMBER.match(cell):
        return "'" + cell
    return cell
