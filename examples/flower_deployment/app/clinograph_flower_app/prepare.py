"""Write demo hospital folders, the server's config and the initial model, cut from ALARM.

    python -m clinograph_flower_app.prepare --out /tmp/clinograph-demo --federation-id ID --hospital h1 \
        --hospital h2 --patients 300 [--dp] [--secure-mode masked|ckks]

writes ``OUT/<h>/data/{table.csv,schema.toml,hospital.toml,dictionary.toml}`` per hospital, each
table in its own column names and units, and ``OUT/server/{server.toml,initial_model.json}``
for the server. Real hospitals export their own ``table.csv`` and write their own
``schema.toml``; every file here is configuration, not code.
"""

from __future__ import annotations

import argparse
import shutil
from dataclasses import replace
from pathlib import Path

import tomli_w
from clinograph.sdk.config import HospitalConfig
from clinograph.sdk.datasets.alarm import (
    DEFAULT_HOSPITALS,
    DICTIONARY_PATH,
    load_dictionary,
    make_hospital_tables,
)
from clinograph.sdk.federation.build import run_models

HOSPITAL = """\
# This hospital's own choices (clinograph.sdk.config.HospitalConfig).
dictionary = "dictionary.toml"   # the same file at every hospital and at `clinograph model init`

[model]
hidden = 16

[graph]
k_similar = {k_similar}          # DP refuses similar_to edges (they couple patients)

[training]
batch_size = 64

[privacy]
enabled = {dp}
epsilon_budget = 8.0
delta = 1e-5
clip_norm = 1.0
noise_multiplier = 1.1
batch_size = 64

[release]
metrics = "none"                 # nothing beyond the protocol's needs leaves this hospital
"""

SERVER = """\
# The server's choices (clinograph.secure.runtime.ServerConfig).
initial_model = "initial_model.json"   # `clinograph model init --config hospital.toml --out ...`
audit_dir = "{audit_dir}"

[federation]
id = "{federation_id}"
rounds = 2
secure_mode = "{secure_mode}"
strategy = "fedsgd"
min_clients = 2
local_epochs = 1
environment = "production"
{extra}{dp_policy}"""


def prepare(out: Path, *, hospitals: list[str], patients: int, dp: bool, seed: int = 0,
            federation_id: str = "fed-loopback", secure_mode: str = "masked", audit_dir: Path | None = None,
            tckks_threshold: int | None = None) -> None:
    """Write the demo folders (``tckks_threshold``: t-of-N under secure_mode = "ckks_threshold")."""
    specs = tuple(replace(DEFAULT_HOSPITALS[i % len(DEFAULT_HOSPITALS)], site=name, n_patients=patients)
                  for i, name in enumerate(hospitals))
    hospital_toml = HOSPITAL.format(dp="true" if dp else "false", k_similar=0 if dp else 5)
    # the mode every hospital agreed to join (unset: masked only; a plan under any other is refused)
    hospital_toml += f'secure_modes = ["{secure_mode}"]\n'
    if tckks_threshold:  # every hospital agrees to t-of-N (each holds this rule; unset: N-of-N only)
        hospital_toml += f"tckks_threshold = {tckks_threshold}        # ckks_threshold: the smallest t accepted\n"
    out.mkdir(parents=True, exist_ok=True)
    for (table, schema), name in zip(make_hospital_tables(seed=seed, hospitals=specs), hospitals, strict=True):
        data = out / name / "data"
        data.mkdir(parents=True, exist_ok=True)
        table.to_csv(data / "table.csv", index=False)
        (data / "schema.toml").write_text(tomli_w.dumps(schema.model_dump(mode="json", exclude_none=True)))
        (data / "hospital.toml").write_text(hospital_toml)
        shutil.copyfile(DICTIONARY_PATH, data / "dictionary.toml")
    server = out / "server"
    server.mkdir(parents=True, exist_ok=True)
    policy = "\n[dp_policy]\nmax_epsilon = 8.0\ndelta = 1e-5\nmax_clip_norm = 1.0\n" if dp else ""
    # server.toml's relative paths are read from its own folder: the default is "audit" there
    (server / "server.toml").write_text(SERVER.format(audit_dir=Path(audit_dir).resolve() if audit_dir else "audit",
                                                      federation_id=federation_id, secure_mode=secure_mode,
                                                      dp_policy=policy,
                                                      extra=f"tckks_threshold = {tckks_threshold}\n"
                                                      if tckks_threshold else ""))
    config = HospitalConfig.from_toml(out / hospitals[0] / "data" / "hospital.toml")
    (server / "initial_model.json").write_bytes(run_models(config, dictionary=load_dictionary()).to_bytes())


def main() -> None:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--hospital", action="append", required=True)
    p.add_argument("--patients", type=int, default=300)
    p.add_argument("--dp", action="store_true", help="patient-level DP-SGD at every hospital")
    p.add_argument("--secure-mode", default="masked", choices=["masked", "ckks", "ckks_threshold"])
    p.add_argument("--federation-id", required=True,
                   help="the federation id of `clinograph keys init --federation-id` (server.toml must match it)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    prepare(a.out, hospitals=a.hospital, patients=a.patients, dp=a.dp, seed=a.seed, federation_id=a.federation_id,
            secure_mode=a.secure_mode)
    for name in a.hospital:
        print(f"hospital {name}: {a.out / name / 'data'}/ (table.csv, schema.toml, hospital.toml, dictionary.toml) "
              f"-> its machine, the SuperNode's data-dir (e.g. /srv/{name}/data)")
    print(f"server: {a.out / 'server'}/ (server.toml, initial_model.json) -> the SuperLink machine, "
          "e.g. /srv/clinograph/server (its audit_dir 'audit' is read from that folder)")


if __name__ == "__main__":
    main()
