"""Run every study script (research/) and speed benchmark (benchmarks/), one process each, write
their JSON, print a summary (``make bench``).

    python -m research.run_all                  # every script with --quick (minutes each on 2 cores)
    python -m research.run_all --full           # the real runs (hours: fcm_bnlearn alone ~1 h); they
                                                # overwrite the committed research/<study>/results/<script>.json
    python -m research.run_all --only timeseries spine_rounds   # studies or scripts by name
    python -m research.run_all --check          # each script's --help: imports and the convention, no run
    python -m research.run_all --list

A study script is a ``research/<study>/<name>.py`` that runs as ``__main__`` (the studies' shared
modules, such as ``fcm_federation.py``, are not). Each runs as ``python -m
research.<study>.<name>`` from the repository root with OMP_NUM_THREADS=1 unless set. The one
convention (research/_common.py): every script takes ``--quick`` and ``--out PATH`` and writes one
JSON file with the machine and its load before and after. Quick runs write
``research/<study>/results/<name>_quick.json`` (gitignored), never the committed numbers.
Scripts assert nothing and neither does this; a script that exits non-zero or writes no JSON is
reported as failed and makes the exit status 1. The summary (status, seconds, output per script)
goes to ``research/run_all_quick.json`` (``run_all.json`` with ``--full``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
from research._common import machine, save  # noqa: E402

#: where scripts live: the studies (research/) and the speed benchmarks of the deployed path
#: (benchmarks/, the project's rule: "benchmarks in benchmarks/ write JSON with medians")
ROOTS = (HERE, ROOT / "benchmarks")


def scripts() -> dict[str, Path]:
    """Every study and benchmark script, as ``study/name`` -> path."""
    return {f"{p.parent.name}/{p.stem}": p for root in ROOTS for p in sorted(root.glob("*/*.py"))
            if not p.stem.startswith("_") and 'if __name__ == "__main__"' in p.read_text()}


def _module(path: Path) -> str:
    """``research.<study>.<name>`` or ``benchmarks.<study>.<name>`` for a script's path."""
    return ".".join((path.parent.parent.name, path.parent.name, path.stem))


def run_one(key: str, path: Path, *, full: bool, timeout: float | None) -> dict:
    """Run one script; returns its summary row."""
    out = path.parent / "results" / f"{path.stem}{'' if full else '_quick'}.json"
    cmd = [sys.executable, "-m", _module(path)] + ([] if full else ["--quick", "--out", str(out)])
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    before = out.stat().st_mtime if out.exists() else None
    print(f"== {key}: {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"name": key, "status": f"timeout after {timeout:.0f} s", "seconds": time.perf_counter() - t0,
                "output": None}
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"name": key, "status": f"failed (exit {proc.returncode})", "seconds": seconds, "output": None}
    written = out.exists() and out.stat().st_mtime != before
    return {"name": key, "status": "ok" if written else "failed (no JSON written)", "seconds": seconds,
            "output": str(out.relative_to(ROOT)) if written else None}


def check_one(key: str, path: Path) -> dict:
    """``--help``: the script's imports and whether it takes the convention's arguments."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", _module(path), "--help"], cwd=ROOT, text=True, capture_output=True,
                          timeout=600)
    missing = [a for a in ("--quick", "--out") if a not in proc.stdout]
    ok = proc.returncode == 0 and not missing
    detail = proc.stderr.strip()[-1500:] if proc.returncode else f"does not take {', '.join(missing)}"
    return {"name": key, "status": "ok" if ok else "failed", "seconds": time.perf_counter() - t0,
            "detail": None if ok else detail, "output": "--quick and --out accepted" if ok else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="every script with --quick (the default)")
    group.add_argument("--full", action="store_true", help="the real runs; they overwrite results/<name>.json")
    group.add_argument("--check", action="store_true", help="only run each script's --help")
    group.add_argument("--list", action="store_true", help="list the scripts and exit")
    p.add_argument("--only", nargs="+", metavar="NAME", help="these studies or scripts only (study, name or study/name)")
    p.add_argument("--timeout", type=float, default=None, help="seconds allowed per script (default: none)")
    args = p.parse_args(argv)

    found = scripts()
    if args.only:
        chosen = {k: v for k, v in found.items() if {k, *k.split("/")} & set(args.only)}
        unknown = sorted(n for n in args.only if not any(n in {k, *k.split("/")} for k in found))
        if unknown:
            p.error(f"unknown study or script {', '.join(unknown)}; available: {', '.join(found)}")
        found = chosen
    if args.list:
        print("\n".join(found))
        return 0

    t0 = time.perf_counter()
    rows = [check_one(k, v) if args.check else run_one(k, v, full=args.full, timeout=args.timeout)
            for k, v in found.items()]
    kind = "check" if args.check else "full" if args.full else "quick"
    print(f"\n{'script':44s} {'status':24s} {'seconds':>8s}  output")
    for r in rows:
        print(f"{r['name']:44s} {r['status'][:24]:24s} {r['seconds']:8.1f}  {r['output'] or '-'}")
    failed = [r for r in rows if r["status"] != "ok"]
    for r in failed:
        if r.get("detail"):
            print(f"\n-- {r['name']} {r['status']}:\n{r['detail']}")
    print(f"{len(rows) - len(failed)}/{len(rows)} ok ({kind}) in {time.perf_counter() - t0:.0f} s")
    if not args.check:
        save({"kind": kind, "machine": machine(), "scripts": rows},
             HERE / ("run_all.json" if args.full else "run_all_quick.json"), sort_keys=False, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
