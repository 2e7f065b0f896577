"""Map my hospital's DataFrame onto the shared dictionary and join a federation.

Run:  python examples/map_and_join.py [--rounds N]

What an integrator does, step by step, with everything offline and in one process: the other
two hospitals and the server are simulated here; in a deployment they are other machines
(see examples/flower_deployment/README.md).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from clinograph.sdk.research.alarm_demo import (
    BLOOD_GAS,
    HospitalSpec,
    load_dictionary,
    make_hospital_tables,
)
from clinograph.sdk.federation.join import prepare_hospital
from clinograph.sdk.model import NSFLConfig
from clinograph.sdk.ontology import ColumnMap, SiteSchema
from clinograph.sdk.training import TrainConfig
from clinograph.secure.audit import AuditTrail, verify_audit_dir
from clinograph.secure.errors import SchemaError
from clinograph.secure.identity import Identity
from clinograph.secure.masking.params import masked_plan_options
from clinograph.secure.rounds import run_round
from clinograph.secure.server import FederationServer
from clinograph.secure.spec import ModuleKind
from clinograph.secure.strategies import create_strategy


def my_hospital_table() -> pd.DataFrame:
    """Stand-in for your EHR export: your own column names and units."""
    (df, _), = make_hospital_tables(seed=7, hospitals=(HospitalSpec("mine", 400),))
    return df.rename(columns={"heart_rate": "Pulse", "glucose": "Glucose (mg/dL)", "temperature": "Temp (F)"}).assign(
        **{"Glucose (mg/dL)": lambda d: d["Glucose (mg/dL)"] * 18.0156, "Temp (F)": lambda d: d["Temp (F)"] * 9 / 5 + 32})


def main(rounds: int) -> None:
    dictionary = load_dictionary()  # the federation's shared ontology (its hash travels in every message)
    df = my_hospital_table()

    # 1. Map your columns and units onto the dictionary. Unmapped columns that match a dictionary
    #    id or alias are taken as they are; anything else is an error that names it.
    schema = SiteSchema(site="mine", patient_id="patient_id", label="outcome", columns={
        "Pulse": ColumnMap(feature="heart_rate", unit="bpm"),
        "Glucose (mg/dL)": ColumnMap(feature="glucose", unit="mg/dL"),
        "Temp (F)": ColumnMap(feature="temperature", unit="degF"),
    })

    # 2. Bad input is refused with every problem listed at once (no cell values in the message).
    broken = df.copy()
    broken["Sodium"] = 140.0
    broken.loc[3, "Pulse"] = np.nan
    broken["Pulse"] = broken["Pulse"].astype(object)
    broken.loc[4, "Pulse"] = "88 bpm"
    try:
        prepare_hospital(broken, schema=schema, dictionary=dictionary, identity=Identity.generate("mine"),
                         server=Identity.generate("server").public, peers={}, model=NSFLConfig(), training=TrainConfig(),
                         k_similar=5, release_metrics=False, publish_feature_relevance=False)
    except SchemaError as exc:
        print(f"As expected, the broken export is refused:\n{exc}\n")

    # 3. Keys: each hospital has an Ed25519 identity (in a deployment: `clinograph keys init`).
    server_id = Identity.generate("server")
    others = make_hospital_tables(seed=8, hospitals=(HospitalSpec("st_anne", 500), HospitalSpec("riverside", 300,
                                                                                                  lacks=BLOOD_GAS)))
    ids = {n: Identity.generate(n) for n in ("mine", "st_anne", "riverside")}
    peers = {n: i.public for n, i in ids.items()}
    common = dict(dictionary=dictionary, server=server_id.public, peers=peers, model=NSFLConfig(hidden=16),
                  training=TrainConfig(lr=0.003), k_similar=5, release_metrics=True, publish_feature_relevance=True)

    # 4. Your hospital becomes a participant: validated table -> typed graph -> NS-FL model.
    hospitals = {"mine": prepare_hospital(df, schema=schema, identity=ids["mine"], **common)}
    for (odf, osch) in others:
        hospitals[osch.site] = prepare_hospital(odf, schema=osch, identity=ids[osch.site], **common)

    # 5. The federation server (run by the operator; here in process) with masked aggregation.
    mine = hospitals["mine"]
    with tempfile.TemporaryDirectory() as tmp:
        audit = AuditTrail(Path(tmp) / "audit", identity=server_id)
        server = FederationServer(
            federation_id="example", spec=mine.modules.spec(), initial_state=mine.modules.state(ModuleKind.SHARED),
            dictionary_hash=dictionary.digest(), identity=server_id, enrolled=peers, secure_mode="masked",
            strategy=create_strategy("fedavg"), min_clients=2, local_epochs=2, dp_policy=None, audit=audit,
            environment="development",
            mode_options=masked_plan_options(n_clients=3, threshold=2, clip=500.0 * 4.0, max_weight=500.0))
        for r in range(rounds):
            out = run_round(server, hospitals, participants=tuple(sorted(hospitals)))
            print(f"round {r}: contributors {out.result.contributors}, my AUROC {mine.local_metrics()['auroc']:.3f}")
        audit.close()
        print("audit verifies:", verify_audit_dir(Path(tmp) / "audit").ok)
    relevance = mine.feature_relevance()
    top = sorted(relevance.items(), key=lambda kv: -kv[1])[:5]
    print("my site's most relevant features (m_f):", ", ".join(f"{k} {v:.2f}" for k, v in top))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=5)
    main(p.parse_args().rounds)
