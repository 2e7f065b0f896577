"""Run every benchmark, one process each, write their JSON to benchmarks/results/, print a summary.

    python -m benchmarks.run_all               # every benchmark with --quick (minutes on 2 cores)
    python -m benchmarks.run_all --full        # the real runs (hours on 2 cores: fcm_bnlearn alone ~1 h)
    python -m benchmarks.run_all --only spine_rounds secure_aggregation_masked
    python -m benchmarks.run_all --check       # each benchmark's --help: imports and arguments, no run
    python -m benchmarks.run_all --list

(``make bench`` is the first; ``make bench ARGS=--full`` the second.) Every ``*.py`` in this
folder not starting with ``_`` is a benchmark, run as ``python benchmarks/<name>.py``
one after another, with OMP_NUM_THREADS=1 unless set. Benchmarks assert nothing and neither
does this; a benchmark that exits non-zero is reported as failed and makes the exit status 1.

Where the JSON goes:

- ``--full``: each benchmark writes ``results/<name>.json`` itself (the committed numbers).
- quick (default): never over the committed numbers, always ``results/<name>_quick.json``
  (gitignored). The scripts disagree on what ``--quick`` writes, so :data:`QUICK_OUTPUT` says
  per benchmark how to get it there: ``out`` passes ``--out results/<name>_quick.json``;
  ``stdout`` keeps the JSON the script prints (it writes nothing in quick mode); ``self``: the
  script writes ``<name>_quick.json`` itself. A benchmark missing from the table is run with
  ``--quick`` if its source mentions that flag, its stdout kept, and skipped otherwise.

The summary (status, seconds, output per benchmark, and the machine) is printed and written
to ``results/run_all.json`` (``results/run_all_quick.json`` in quick mode).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import RESULTS, machine  # noqa: E402

QUICK_OUTPUT = {
    "dp_overhead": "stdout",
    "dp_utility": "stdout",
    "fcm_bnlearn": "out",
    "fcm_calibration": "out",
    "pfgl_experiment": "stdout",  # prints the per-arm summary only
    "secure_aggregation_ckks": "out",
    "secure_aggregation_masked": "out",
    "spine_rounds": "self",
}


def benchmarks() -> list[str]:
    """Every benchmark script in this folder, by name."""
    return sorted(p.stem for p in HERE.glob("*.py") if not p.stem.startswith("_") and p.stem != "run_all")


def quick_mode(name: str) -> str | None:
    """How the quick JSON of ``name`` is obtained, or None if it has no ``--quick``."""
    if name in QUICK_OUTPUT:
        return QUICK_OUTPUT[name]
    return "stdout" if "--quick" in (HERE / f"{name}.py").read_text() else None


def _json_in(text: str) -> object | None:
    """The JSON document a benchmark printed (the whole output, or from its first '{' line on)."""
    lines = text.splitlines()
    for start in range(len(lines)):
        if start == 0 or lines[start].startswith(("{", "[")):
            try:
                return json.loads("\n".join(lines[start:]))
            except json.JSONDecodeError:
                continue
    return None


def run_one(name: str, *, full: bool, timeout: float | None) -> dict:
    """Run one benchmark; returns its summary row."""
    script = HERE / f"{name}.py"
    mode = "full" if full else quick_mode(name)
    if mode is None:
        return {"name": name, "status": "skipped (no --quick)", "seconds": 0.0, "output": None}
    quick_out = RESULTS / f"{name}_quick.json"
    cmd = [sys.executable, str(script)]
    output = RESULTS / f"{name}.json" if full else quick_out
    if not full:
        cmd.append("--quick")
        if mode == "out":
            cmd += ["--out", str(quick_out)]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    before = output.stat().st_mtime if output.exists() else None
    print(f"== {name}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=HERE.parent, env=env, timeout=timeout, text=True,
                              stdout=subprocess.PIPE if mode == "stdout" else None)
    except subprocess.TimeoutExpired:
        return {"name": name, "status": f"timeout after {timeout:.0f} s", "seconds": time.perf_counter() - t0,
                "output": None}
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        if proc.stdout:
            print(proc.stdout[-3000:], file=sys.stderr)
        return {"name": name, "status": f"failed (exit {proc.returncode})", "seconds": seconds, "output": None}
    if mode == "stdout":
        found = _json_in(proc.stdout)
        payload = found if found is not None else {"benchmark": name, "quick": True, "stdout": proc.stdout[-20000:]}
        RESULTS.mkdir(exist_ok=True)
        output.write_text(json.dumps(payload, indent=1) + "\n")
    written = output.exists() and output.stat().st_mtime != before
    return {"name": name, "status": "ok" if written else "ok (no JSON written)", "seconds": seconds,
            "output": str(output.relative_to(HERE.parent)) if written else None}


def check_one(name: str) -> dict:
    """``python <name>.py --help``: the benchmark's imports and arguments, without running it."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(HERE / f"{name}.py"), "--help"], cwd=HERE.parent, text=True,
                          capture_output=True, timeout=600)
    quick = "--quick" in proc.stdout
    ok = proc.returncode == 0
    return {"name": name, "status": "ok" if ok else f"failed (exit {proc.returncode})",
            "seconds": time.perf_counter() - t0, "detail": None if ok else proc.stderr.strip()[-1500:],
            "output": f"--quick {'accepted' if quick else 'NOT accepted'}; quick JSON via {quick_mode(name)}"
            if ok else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="every benchmark with --quick (the default)")
    group.add_argument("--full", action="store_true", help="the real runs; they overwrite results/<name>.json")
    group.add_argument("--check", action="store_true", help="only run each benchmark's --help")
    group.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run these benchmarks only")
    p.add_argument("--timeout", type=float, default=None, help="seconds allowed per benchmark (default: none)")
    args = p.parse_args(argv)

    names = benchmarks()
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            p.error(f"unknown benchmark(s) {', '.join(unknown)}; available: {', '.join(names)}")
        names = [n for n in names if n in args.only]
    if args.list:
        for n in names:
            print(f"{n:28s} quick JSON via {quick_mode(n)}")
        return 0

    t0 = time.perf_counter()
    rows = [check_one(n) if args.check else run_one(n, full=args.full, timeout=args.timeout) for n in names]
    kind = "check" if args.check else "full" if args.full else "quick"
    print(f"\n{'benchmark':28s} {'status':24s} {'seconds':>8s}  output")
    for r in rows:
        print(f"{r['name']:28s} {r['status'][:24]:24s} {r['seconds']:8.1f}  {r['output'] or '-'}")
    failed = [r for r in rows if not r["status"].startswith(("ok", "skipped"))]
    for r in failed:
        if r.get("detail"):
            print(f"\n-- {r['name']} {r['status']}:\n{r['detail']}")
    print(f"{len(rows) - len(failed)}/{len(rows)} ok ({kind}) in {time.perf_counter() - t0:.0f} s")
    if not args.check:
        summary = RESULTS / ("run_all.json" if args.full else "run_all_quick.json")
        RESULTS.mkdir(exist_ok=True)
        summary.write_text(json.dumps({"kind": kind, "machine": machine(), "benchmarks": rows}, indent=1) + "\n")
        print(f"summary: {summary.relative_to(HERE.parent)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
