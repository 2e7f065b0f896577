"""``clinograph predict``: per-patient risks for new patients from an exported model, without
the federation.

A hospital exports its selected, calibrated model (``NSFLTask.export``: TorchScript of the
star path plus a sidecar JSON with the dictionary hash and feature list). This command maps a
new table through the hospital's own site schema onto the dictionary the model names, refuses
another dictionary, and writes ``patient_id,risk``. The label column may be absent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def predict(
    model: Annotated[Path, typer.Option("--model", help="The exported model (.pt); its sidecar <model>.json beside it.")],
    table: Annotated[Path, typer.Option("--table", help="New patients: CSV or Parquet in the hospital's own columns.")],
    schema: Annotated[Path, typer.Option("--schema", help="The hospital's site schema (TOML).")],
    dictionary: Annotated[Path, typer.Option("--dictionary", help="The feature dictionary (TOML) the model uses.")],
    out: Annotated[Path, typer.Option("--out", help="Where to write patient_id,risk (CSV).")],
) -> None:
    """Write each patient's risk from an exported model."""
    from ..cli import guarded

    guarded(_predict)(model, table, schema, dictionary, out)


def _predict(model: Path, table: Path, schema: Path, dictionary: Path, out: Path) -> None:
    import csv

    from clinograph.sdk.ingest import ingest, read_table
    from clinograph.sdk.model.export import load_exported, predict_exported
    from clinograph.sdk.ontology import FeatureDictionary, SiteSchema
    from clinograph.secure.errors import ConfigError, SchemaError

    if not model.is_file():
        raise ConfigError(f"--model {model} is not a file; give the .pt written by NSFLTask.export.")
    module, info = load_exported(model)
    d = FeatureDictionary.from_toml(dictionary)
    if d.digest() != info["dictionary_hash"]:
        raise SchemaError([f"--dictionary {dictionary} has hash {d.digest()[:12]}…, the model was trained on "
                           f"{str(info['dictionary_hash'])[:12]}…. Use the federation's dictionary file."],
                          title="Dictionary mismatch")
    s = SiteSchema.from_toml(schema)
    df = read_table(table)
    if s.label is not None and s.label not in df.columns:  # new patients: no outcome yet
        s = s.model_copy(update={"label": None, "unlabeled": True})
    pt = ingest(df, schema=s, dictionary=d)
    risk = predict_exported(module, info, pt)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["patient_id", "risk"])
        writer.writerows(zip(pt.patient_ids, (float(r) for r in risk), strict=True))
    typer.echo(f"{len(risk)} risks written to {out} (model {model.name}, calibration "
               f"{info.get('calibration', {}).get('method', 'none')})")
