"""Map my hospital's table onto the shared dictionary and join a federation, in one process.
Run: python examples/map_and_join.py [--rounds N]  (across machines: examples/flower_deployment/)"""

import argparse
import tempfile
from pathlib import Path

from clinograph.sdk.datasets import alarm  # synthetic hospital exports (the ALARM network)

import clinograph as cg


def main(rounds: int) -> None:
    dictionary = cg.FeatureDictionary.from_toml(alarm.DICTIONARY_PATH)  # the federation's shared ontology
    exports = alarm.make_hospital_tables(seed=7, hospitals=(alarm.HospitalSpec("mine", 400),
        alarm.HospitalSpec("st_anne", 500), alarm.HospitalSpec("riverside", 300, lacks=alarm.BLOOD_GAS)))
    df, _ = exports[0]  # my EHR export, in my own column names and units:
    df = df.rename(columns={"heart_rate": "Pulse", "glucose": "Glucose (mg/dL)"})
    df["Glucose (mg/dL)"] *= 18.0156
    schema = cg.SiteSchema(site="mine", patient_id="patient_id", label="outcome", columns={
        "Pulse": cg.ColumnMap(feature="heart_rate", unit="bpm"),
        "Glucose (mg/dL)": cg.ColumnMap(feature="glucose", unit="mg/dL")})
    try:  # bad input is refused with every problem listed at once, never a cell value
        cg.ingest(df.assign(Sodium=140.0, Pulse=df["Pulse"].astype(object).where(df.index != 4, "88 bpm")),
                  schema=schema, dictionary=dictionary)
    except cg.SchemaError as exc:
        print(f"As expected, the broken export is refused:\n{exc}\n")
    tables = [cg.ingest(d, schema=s, dictionary=dictionary) for d, s in [(df, schema), *exports[1:]]]
    config = cg.SimulationConfig.model_validate({"federation": {"id": "example", "rounds": rounds},
                                                 "model": {"hidden": 16}, "training": {"lr": 0.003}})
    with tempfile.TemporaryDirectory() as tmp:
        result = cg.simulate(tables, dictionary, config, audit_dir=Path(tmp) / "audit", on_round=lambda r, m: print(
            f"round {r}: " + ", ".join(f"{site} AUROC {v['auroc']:.3f}" for site, v in m.items())))
        print("audit verifies:", cg.verify_audit_dir(result.audit_dir).ok)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=5)
    main(p.parse_args().rounds)
