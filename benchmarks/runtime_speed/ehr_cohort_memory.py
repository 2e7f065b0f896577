"""Peak memory (VmHWM) and CPU seconds of the three EHR readers on one cohort written as OMOP, MEDS and FHIR.

The cohort of ``tests/sdk/ingest/cohort_exports.py`` at ``--patients`` patients x ``--labs`` labs each (glucose,
creatinine, heart rate in several units, a censored value, values without a unit; the source files of
:func:`cohort_exports.source_files`: age, sex, declared units, censoring), written as an OMOP CSV folder, a
MEDS dataset and a FHIR bulk NDJSON export, each read (``read_source``, not ingested) in a fresh process.
This is the measurement docs/ehr_formats.md ("Speed") quotes; ``--code`` runs the same on another checkout.

    python -m benchmarks.runtime_speed.ehr_cohort_memory --patients 20000 --labs 40 --out ehr_cohort_memory_s53.json
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
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "sdk" / "ingest"))
from benchmarks.runtime_speed.checkout_child import extract_digest, use_checkout, vm_mib  # noqa: E402
from research._common import emit, machine  # noqa: E402

KINDS = ("omop", "meds", "fhir")


def cohort(patients: int, labs: int):  # noqa: ANN201 - a cohort_exports.Cohort
    """``patients`` copies of the example cohort's patients (ids renumbered), each with ``labs`` labs."""
    import dataclasses

    from cohort_exports import Cohort, Event, example_cohort

    base = example_cohort().patients
    kinds = (("glucose", 99.0, "mg/dL"), ("glucose", 6.1, "mmol/L"), ("creatinine", 1.1, "mg/dL"),
             ("creatinine", 80.0, "umol/L"), ("heart_rate", 88.0, None), ("heart_rate", 70.0, "/min"))
    out = []
    for i in range(patients):
        p = base[i % len(base)]
        events = tuple(Event(-0.5 - 40.0 * k / labs, *kinds[(i + k) % len(kinds)]) for k in range(labs))
        out.append(dataclasses.replace(p, pid=i + 1, index=p.index + timedelta(minutes=i % 997), events=events))
    return Cohort(patients=tuple(out))



def child(kind: str, folder: Path, code: Path) -> None:
    use_checkout(code)
    from clinograph.sdk.ingest.sources import EhrSourceConfig, read_source
    from cohort_exports import DICTIONARY, source_files

    config = EhrSourceConfig.model_validate({"site": "h", kind: source_files()[kind]})
    base = vm_mib("VmRSS")
    r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    ex = read_source(config, folder / kind, dictionary=DICTIONARY, base=folder / "meds")
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"peak_rss_mib": vm_mib("VmHWM"), "rss_before_read_mib": base,
                      "cpu_seconds": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
                      "wall_seconds": time.perf_counter() - w0, "table_rows": len(ex.table),
                      "events_read": ex.report.events_read, "digest": extract_digest(ex)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--patients", type=int, default=20_000)
    ap.add_argument("--labs", type=int, default=40)
    ap.add_argument("--code", nargs="+", default=[str(ROOT)], help="checkouts to measure, alternately")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", nargs=3, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], Path(args.child[1]), Path(args.child[2]).resolve())
    from cohort_exports import write_fhir, write_meds, write_omop

    result = {"machine": machine(("pandas", "pyarrow", "duckdb")), "patients": args.patients, "labs": args.labs,
              "source_rows": args.patients * args.labs, "runs": []}
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        folder = Path(tmp)
        c = cohort(args.patients, args.labs)
        write_omop(folder / "omop", c)
        write_meds(folder / "meds", c)
        write_fhir(folder / "fhir", c, form="ndjson")
        for kind in KINDS:
            for code in args.code:
                out = subprocess.run([sys.executable, "-m", "benchmarks.runtime_speed.ehr_cohort_memory", "--child",
                                      kind, str(folder), code], cwd=ROOT, capture_output=True, text=True, check=False,
                                     env={**os.environ, "OMP_NUM_THREADS": "1"})
                row = {"reader": kind, "code": code, "load_average": os.getloadavg(),
                       **(json.loads(out.stdout.splitlines()[-1]) if out.returncode == 0
                          else {"error": out.stderr.strip().splitlines()[-1:]})}
                result["runs"].append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        emit(result, out=Path(args.out) if "/" in args.out else Path(__file__).parent / "results" / args.out)


if __name__ == "__main__":
    main()
