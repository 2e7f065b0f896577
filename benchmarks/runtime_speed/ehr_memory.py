"""Peak memory (VmHWM) and CPU seconds of the EHR readers, each read in a fresh process.

MEDS at export sizes: ``--meds-events`` events (e.g. 1e5, 1e6, 4e6) in ``--shards`` shards, a fraction
``--unmapped`` of them under codes outside the dictionary (MEDS_BIRTH, GENDER//F, ~2 000 ``LAB//<id>//<unit>``
codes, as MIMIC-IV MEDS exports are mostly), 10 % of the subjects without a label, events spread over
20 days around the prediction time (a 7-day lookback: some before it, some after). The dictionary's labs are
written as ``LOINC/<code>//<unit>`` (the unit in the code, :func:`split_code`). OMOP (DuckDB) and FHIR
(NDJSON) from :mod:`.ehr_readers`' generator. Each reader runs in a child process (``--child``) that
reports its peak resident memory (``/proc/self/status`` VmHWM), the baseline before reading, CPU seconds
and a digest of the extract (table + report) so two checkouts can be compared for identical output.

    python -m benchmarks.runtime_speed.ehr_memory --meds-events 100000 1000000 4000000 --out ehr_memory_s53.json
    python -m benchmarks.runtime_speed.ehr_memory --code /path/to/older/checkout ...   # the same on older code

``--code``: the checkout whose ``sdk/`` (``clinograph.sdk``) the child imports (default: this one).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks.runtime_speed.checkout_child import extract_digest, use_checkout, vm_mib  # noqa: E402
from benchmarks.runtime_speed.ehr_readers import (  # noqa: E402
    FEATURES,
    ICU,
    SHUNT,
    T0,
    _events,
    write_fhir,
    write_omop,
)
from research._common import emit, machine  # noqa: E402

LOINC = ("8867-4", "8480-6", "2345-7", "8310-5", "2160-0", "3094-0", "718-7", "3150-0")


def write_meds_export(root: Path, n_events: int, *, unmapped: float, shards: int, seed: int = 0) -> Path:
    """A MEDS dataset of ``n_events`` events (~200 a subject), ``unmapped`` of them outside the dictionary."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    n_subjects = max(10, n_events // 200)
    (root / "data").mkdir(parents=True)
    sid = np.sort(rng.integers(1, n_subjects + 1, n_events))
    predict = T0 + pd.to_timedelta(np.arange(n_subjects + 1) % 1000, unit="h")
    hours = rng.uniform(-17 * 24, 3 * 24, n_events)
    when = (predict.to_numpy()[sid] + (hours * 3.6e9).astype("timedelta64[us]")).astype("datetime64[us]")
    outside = rng.random(n_events) < unmapped
    f = rng.integers(0, len(FEATURES), n_events)
    mapped_codes = np.array([f"LOINC/{c}//{FEATURES[i][1]}" for i, c in enumerate(LOINC)], dtype=object)
    other = np.array(["MEDS_BIRTH", "GENDER//F", "GENDER//M"] + [f"LAB//{50000 + i}//mg/dL" for i in range(2000)],
                     dtype=object)
    code = np.where(outside, other[rng.integers(0, len(other), n_events)], mapped_codes[f])
    mean = np.array([x[3] for x in FEATURES])[f]
    value = np.where(outside & (rng.random(n_events) < 0.5), np.nan, rng.normal(mean, 0.1 * mean)).astype(np.float32)
    bounds = np.linspace(0, n_events, shards + 1).astype(int)
    for k in range(shards):
        s = slice(bounds[k], bounds[k + 1])
        pq.write_table(pa.table({"subject_id": pa.array(sid[s].astype(np.int64)),
                                 "time": pa.array(when[s]), "code": pa.array(code[s].tolist(), pa.string()),
                                 "numeric_value": pa.array(value[s], pa.float32(), from_pandas=True)}),
                       root / "data" / f"{k}.parquet")
    labelled = np.arange(1, n_subjects + 1)[rng.random(n_subjects) < 0.9]
    pq.write_table(pa.table({"subject_id": pa.array(labelled.astype(np.int64)),
                             "prediction_time": pa.array(predict.to_numpy()[labelled].astype("datetime64[us]")),
                             "boolean_value": pa.array(labelled % 3 == 1)}), root / "labels.parquet")
    return root / "labels.parquet"



def child(args: argparse.Namespace) -> None:
    """Read one source in this (fresh) process; print one JSON line."""
    use_checkout(Path(args.code))
    from clinograph.sdk.datasets.alarm import load_dictionary
    from clinograph.sdk.ingest.fhir import read_fhir
    from clinograph.sdk.ingest.meds import read_meds
    from clinograph.sdk.ingest.omop import OmopCohort, OmopLabel, OmopSource, omop_engine, read_omop

    d = load_dictionary()
    src = Path(args.child)
    base = vm_mib("VmRSS")
    r0, c0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    if args.reader == "meds":
        ex = read_meds(src, dictionary=d, site="bench", labels=src / "labels.parquet", lookback_hours=24.0 * 7)
    elif args.reader == "omop":
        source = OmopSource(site="bench", cohort=OmopCohort(visit_concept_ids=(ICU,)),
                            label=OmopLabel(condition_concept_ids=(SHUNT,), window_days=2.0), lookback_days=1.0)
        ex = read_omop(omop_engine(src), source=source, dictionary=d)
    else:
        ex = read_fhir(src, dictionary=d, site="bench", label_code=None)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"peak_rss_mib": vm_mib("VmHWM"), "rss_before_read_mib": base,
                      "cpu_seconds": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
                      "wall_seconds": time.perf_counter() - c0, "table_rows": len(ex.table),
                      "events_read": ex.report.events_read, "digest": extract_digest(ex)}))


def _run(code: str, reader: str, path: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "benchmarks.runtime_speed.ehr_memory", "--child", str(path),
                          "--reader", reader, "--code", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)
    if out.returncode:
        return {"error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--meds-events", type=int, nargs="*", default=[100_000, 1_000_000])
    ap.add_argument("--unmapped", type=float, default=0.8)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--omop-patients", type=int, default=0, help="OMOP/FHIR: patients x 8 events (0: skip)")
    ap.add_argument("--fhir-patients", type=int, default=0)
    ap.add_argument("--code", default=str(ROOT), help="the checkout whose sdk/ the child imports")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--reader", default="meds", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    from clinograph.sdk.datasets.alarm import load_dictionary

    result = {"machine": machine(("pandas", "pyarrow")), "code": args.code, "unmapped": args.unmapped,
              "shards": args.shards, "meds": {}, "omop": {}, "fhir": {}}
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        for n in args.meds_events:
            root = Path(tmp) / f"meds{n}"
            write_meds_export(root, n, unmapped=args.unmapped, shards=args.shards)
            result["meds"][str(n)] = {"load_average": os.getloadavg(), **_run(args.code, "meds", root)}
            print("meds", n, result["meds"][str(n)], flush=True)
        if args.omop_patients:
            ev = _events(args.omop_patients, 8)
            write_omop(Path(tmp) / "omop.duckdb", ev, args.omop_patients, load_dictionary())
            result["omop"][str(len(ev))] = {"load_average": os.getloadavg(),
                                            **_run(args.code, "omop", Path(tmp) / "omop.duckdb")}
            print("omop", len(ev), result["omop"][str(len(ev))], flush=True)
        if args.fhir_patients:
            ev = _events(args.fhir_patients, 8)
            n = write_fhir(Path(tmp) / "fhir.ndjson", ev, args.fhir_patients)
            result["fhir"][str(n)] = {"load_average": os.getloadavg(),
                                      **_run(args.code, "fhir", Path(tmp) / "fhir.ndjson")}
            print("fhir", n, result["fhir"][str(n)], flush=True)
    if args.out:
        emit(result, out=Path(args.out) if "/" in args.out else Path(__file__).parent / "results" / args.out)


if __name__ == "__main__":
    main()
