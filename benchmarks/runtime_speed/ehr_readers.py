"""Throughput of the EHR readers (OMOP on DuckDB, MEDS, FHIR NDJSON): rows (or resources) a second.

Synthetic sources of ``--patients`` patients with ``--events`` numeric events each (eight lab
and vital-sign features, each row with its unit), written once into a temporary folder: an OMOP
CDM v5.4 DuckDB file (all the columns the reader needs, an observation period and an ICU visit a
person), a MEDS dataset with a label file, and a FHIR NDJSON bulk export for ``--fhir-patients``
patients. Each reader is timed ``--repeats`` times (the reader alone, then the reader plus
``ingest``); medians are reported with the load average before and after. Not a test: no
assertion on timings.

    python -m benchmarks.runtime_speed.ehr_readers                      # 100 000 patients, writes benchmarks/runtime_speed/results/ehr_readers.json
    python -m benchmarks.runtime_speed.ehr_readers --quick              # 2 000 patients, prints
    python -m benchmarks.runtime_speed.ehr_readers --out other.json     # e.g. the same script on an older checkout
    python -m benchmarks.runtime_speed.ehr_readers --only omop          # one reader (updates that reader in --out)

On a shared machine, compare two checkouts reader by reader, alternating (``--only``), and read
the load averages recorded with each reader.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, emit, machine, median, out_path  # noqa: E402

#: (feature id, unit written, OMOP unit concept, typical value, sd)
FEATURES = (("heart_rate", "/min", 8541, 80.0, 12.0), ("systolic_bp", "mm[Hg]", 8876, 120.0, 15.0),
            ("glucose", "mg/dL", 8840, 100.0, 20.0), ("temperature", "Cel", 0, 37.0, 0.5),
            ("creatinine", "umol/L", 8749, 80.0, 15.0), ("urea", "mg/dL", 8840, 30.0, 8.0),
            ("haemoglobin", "g/dL", 8713, 13.0, 1.5), ("fio2", "%", 8554, 50.0, 8.0))
ICU, SHUNT, T0 = 32037, 2_000_000_100, pd.Timestamp("2024-01-01")


def _events(n: int, k: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    pid = np.repeat(np.arange(1, n + 1), k)
    f = np.tile(np.arange(k) % len(FEATURES), n)
    mean = np.array([x[3] for x in FEATURES])[f]
    sd = np.array([x[4] for x in FEATURES])[f]
    return pd.DataFrame({"person_id": pid, "f": f, "value": np.round(np.clip(rng.normal(mean, sd), mean - 2.5 * sd, mean + 2.5 * sd), 2),
                         "t": T0 + pd.to_timedelta(pid % 1000, unit="h") - pd.to_timedelta(f * 10, unit="min")})


def write_omop(path: Path, ev: pd.DataFrame, n: int, dictionary) -> None:  # noqa: ANN001
    import duckdb

    pid = np.arange(1, n + 1)
    t0 = T0 + pd.to_timedelta(pid % 1000, unit="h")
    con = duckdb.connect(str(path))
    person = pd.DataFrame({"person_id": pid, "person_source_value": pid.astype(str), "gender_concept_id": 8507,
                           "year_of_birth": 1960, "month_of_birth": 1, "day_of_birth": 1,
                           "birth_datetime": pd.NaT})
    period = pd.DataFrame({"person_id": pid, "observation_period_start_date": (t0 - pd.Timedelta(days=365)).date,
                           "observation_period_end_date": (t0 + pd.Timedelta(days=365)).date})
    visit = pd.DataFrame({"person_id": pid, "visit_concept_id": ICU, "visit_start_date": t0.date,
                          "visit_start_datetime": t0})
    cond = pd.DataFrame({"person_id": pid[::3], "condition_concept_id": SHUNT,
                         "condition_start_date": (t0[::3] + pd.Timedelta(days=1)).date,
                         "condition_start_datetime": t0[::3] + pd.Timedelta(days=1)})
    concept = np.array([dictionary.get(x[0]).omop_concept_id for x in FEATURES])
    meas = pd.DataFrame({"measurement_id": np.arange(1, len(ev) + 1), "person_id": ev["person_id"],
                         "measurement_concept_id": concept[ev["f"]], "measurement_date": ev["t"].dt.date,
                         "measurement_datetime": ev["t"], "value_as_number": ev["value"],
                         "unit_source_value": np.array([x[1] for x in FEATURES], dtype=object)[ev["f"]],
                         "unit_concept_id": np.array([x[2] for x in FEATURES])[ev["f"]],
                         "operator_concept_id": pd.Series([None] * len(ev), dtype="Int64"),
                         "value_as_concept_id": pd.Series([None] * len(ev), dtype="Int64"),
                         "value_source_value": pd.Series([None] * len(ev), dtype=object)})
    obs = pd.DataFrame({"observation_id": [1], "person_id": [1], "observation_concept_id": [0],
                        "observation_date": [T0.date()], "observation_datetime": [T0], "value_as_number": [0.0],
                        "unit_source_value": [None], "unit_concept_id": [0], "value_as_concept_id": [0],
                        "value_as_string": [None]})
    death = pd.DataFrame({"person_id": pd.Series([], dtype=np.int64), "death_date": pd.Series([], dtype=object),
                          "death_datetime": pd.Series([], dtype="datetime64[ns]")})
    for name, df in (("person", person), ("observation_period", period), ("visit_occurrence", visit),
                     ("condition_occurrence", cond), ("measurement", meas), ("observation", obs), ("death", death)):
        con.register("df", df)
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM df")  # noqa: S608 (constant names)
        con.unregister("df")
    con.close()


def write_meds(root: Path, ev: pd.DataFrame, n: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "data").mkdir(parents=True)
    codes = np.array([f"LOINC/{c}" for c in ("8867-4", "8480-6", "2345-7", "8310-5", "2160-0", "3094-0", "718-7",
                                             "3150-0")], dtype=object)
    units = np.array([x[1] for x in FEATURES], dtype=object)
    pq.write_table(pa.table({"subject_id": pa.array(ev["person_id"].to_numpy(np.int64)),
                             "time": pa.array(ev["t"].to_numpy("datetime64[us]")),
                             "code": pa.array(codes[ev["f"]].tolist(), pa.string()),
                             "numeric_value": pa.array(ev["value"].to_numpy(np.float32)),
                             "unit": pa.array(units[ev["f"]].tolist(), pa.string())}), root / "data" / "0.parquet")
    pid = np.arange(1, n + 1)
    pq.write_table(pa.table({"subject_id": pa.array(pid.astype(np.int64)),
                             "prediction_time": pa.array((T0 + pd.to_timedelta(pid % 1000, unit="h"))
                                                         .to_numpy("datetime64[us]")),
                             "boolean_value": pa.array(pid % 3 == 1)}), root / "labels.parquet")
    return root / "labels.parquet"


def write_fhir(path: Path, ev: pd.DataFrame, n: int) -> int:
    codes = ("8867-4", "8480-6", "2345-7", "8310-5", "2160-0", "3094-0", "718-7", "3150-0")
    count = 0
    with open(path, "w") as fh:
        for p in range(1, n + 1):
            fh.write(json.dumps({"resourceType": "Patient", "id": f"p{p}", "gender": "female",
                                 "birthDate": "1960-01-01"}) + "\n")
            count += 1
        sub = ev[ev["person_id"] <= n]
        for i, (p, f, v, t) in enumerate(zip(sub["person_id"], sub["f"], sub["value"], sub["t"], strict=True)):
            fh.write(json.dumps({"resourceType": "Observation", "id": f"o{i}", "status": "final",
                                 "code": {"coding": [{"system": "http://loinc.org", "code": codes[f]}]},
                                 "subject": {"reference": f"Patient/p{p}"}, "effectiveDateTime": t.isoformat() + "Z",
                                 "valueQuantity": {"value": float(v), "system": "http://unitsofmeasure.org",
                                                   "code": FEATURES[f][1]}}) + "\n")
            count += 1
    return count


def _call(fn, **kw):  # noqa: ANN001 - the same script runs on a checkout without the newer keywords
    accepted = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in kw.items() if k in accepted})


def _time(fn, repeats: int) -> tuple[list[float], list[float], object]:  # noqa: ANN001
    reads, totals, out = [], [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        ex = fn()
        t1 = time.perf_counter()
        out = ex.ingest(ex_dictionary)
        totals.append(time.perf_counter() - t0)
        reads.append(t1 - t0)
    return reads, totals, out


def main() -> None:
    global ex_dictionary
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--patients", type=int, default=100_000)
    ap.add_argument("--events", type=int, default=8)
    ap.add_argument("--fhir-patients", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    add_convention(ap, quick_help="2 000 patients")
    ap.add_argument("--only", choices=("omop", "meds", "fhir"), action="append",
                    help="time only these readers (repeatable); default all")
    args = ap.parse_args()
    args.out = out_path(__file__, args)
    if args.quick:
        args.patients, args.fhir_patients, args.repeats = 2000, 500, 1
    from clinograph.sdk.datasets.alarm import load_dictionary
    from clinograph.sdk.ingest.fhir import read_fhir
    from clinograph.sdk.ingest.meds import read_meds
    from clinograph.sdk.ingest.omop import OmopCohort, OmopLabel, OmopSource, omop_engine, read_omop

    d = ex_dictionary = load_dictionary()
    result = {"machine": machine(("pandas", "duckdb", "pydantic", "fhir.resources")), "code": str(Path.cwd()),
              "patients": args.patients, "events_per_patient": args.events, "repeats": args.repeats}
    ev = _events(args.patients, args.events)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        want = set(args.only or ("omop", "meds", "fhir"))
        if "omop" in want:
            write_omop(tmp / "omop.duckdb", ev, args.patients, d)
        labels = write_meds(tmp / "meds", ev, args.patients) if "meds" in want else None
        n_resources = write_fhir(tmp / "fhir.ndjson", ev, args.fhir_patients) if "fhir" in want else 0
        source = OmopSource(site="bench", cohort=OmopCohort(visit_concept_ids=(ICU,)),
                            label=OmopLabel(condition_concept_ids=(SHUNT,), window_days=2.0), lookback_days=1.0)
        runs = {"omop": (lambda: read_omop(omop_engine(tmp / "omop.duckdb"), source=source, dictionary=d), len(ev)),
                "meds": (lambda: _call(read_meds, root=tmp / "meds", dictionary=d, site="bench", labels=labels,
                                       lookback_hours=24.0), len(ev)),
                "fhir": (lambda: _call(read_fhir, path=tmp / "fhir.ndjson", dictionary=d, site="bench",
                                       label_code=None), n_resources)}
        for name, (fn, rows) in runs.items():
            if args.only and name not in args.only:
                continue
            load = os.getloadavg()
            reads, totals, table = _time(fn, args.repeats)
            result[name] = {"load_average_before": load, "load_average_after": os.getloadavg(),"rows" if name != "fhir" else "resources": rows,
                            "read_seconds": reads, "read_and_ingest_seconds": totals,
                            "per_second_read": rows / median(reads), "per_second_read_and_ingest": rows / median(totals),
                            "observations": int(table.patient.size)}
            print(name, json.dumps({k: v for k, v in result[name].items() if "per_second" in k}), flush=True)
    result["load_average_at_end"] = os.getloadavg()
    if args.only and not args.quick and args.out.exists():  # --only: update those readers in an earlier result
        earlier = json.loads(args.out.read_text())
        result = {**earlier, **result, "patients": args.patients}
    emit(result, out=args.out)


ex_dictionary = None

if __name__ == "__main__":
    main()
