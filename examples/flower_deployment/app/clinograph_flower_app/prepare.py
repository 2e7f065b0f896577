"""Write demo hospital folders (and the server's deployment.toml) cut from the ALARM network.

    python -m clinograph_flower_app.prepare --out /tmp/clinograph-demo --hospital h1 --hospital h2 \
        --patients 300 [--dp]

writes ``OUT/<h>/data/{table.csv,schema.toml,clinograph.toml}`` per hospital, each in its own
column names and units, and ``OUT/deployment.toml`` for the server. Real hospitals write
their own ``schema.toml`` and export their own ``table.csv`` instead.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from clinograph.sdk.data.alarm_demo import DEFAULT_HOSPITALS, make_hospital_tables

SETTINGS = """\
# Settings (clinograph simulate format). On a hospital: its own model/training/privacy choices.
[federation]
secure_mode = "masked"
strategy = "fedsgd"
min_clients = 2
local_epochs = 1
environment = "development"
seed = {seed}

[model]
hidden = 16

[graph]
k_similar = {k_similar}  # DP refuses similar_to edges (they couple patients)

[training]
batch_size = 64

[privacy]
enabled = {dp}
epsilon_budget = 8.0
delta = 1e-5
clip_norm = 1.0
noise_multiplier = 1.1
batch_size = 64
"""


def _schema_toml(schema) -> str:
    lines = [f"site = {json.dumps(schema.site)}", f"patient_id = {json.dumps(schema.patient_id)}",
             f"label = {json.dumps(schema.label)}", "", "[columns]"]
    for col, cm in schema.columns.items():
        unit = f", unit = {json.dumps(cm.unit)}" if cm.unit else ""
        lines.append(f"{json.dumps(col)} = {{ feature = {json.dumps(cm.feature)}{unit} }}")
    return "\n".join(lines) + "\n"


def prepare(out: Path, *, hospitals: list[str], patients: int, dp: bool, seed: int = 0) -> None:
    """Write the demo folders."""
    specs = tuple(replace(DEFAULT_HOSPITALS[i % len(DEFAULT_HOSPITALS)], site=name, n_patients=patients)
                  for i, name in enumerate(hospitals))
    settings = SETTINGS.format(seed=seed, dp="true" if dp else "false", k_similar=0 if dp else 5)
    out.mkdir(parents=True, exist_ok=True)
    (out / "deployment.toml").write_text(settings)
    for (table, schema), name in zip(make_hospital_tables(seed=seed, hospitals=specs), hospitals, strict=True):
        data = out / name / "data"
        data.mkdir(parents=True, exist_ok=True)
        table.to_csv(data / "table.csv", index=False)
        (data / "schema.toml").write_text(_schema_toml(schema))
        (data / "clinograph.toml").write_text(settings)


def main() -> None:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--hospital", action="append", required=True)
    p.add_argument("--patients", type=int, default=300)
    p.add_argument("--dp", action="store_true", help="patient-level DP-SGD at every hospital")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    prepare(a.out, hospitals=a.hospital, patients=a.patients, dp=a.dp, seed=a.seed)


if __name__ == "__main__":
    main()
