"""Twenty hospitals as real SuperNode processes over Flower on loopback, masked, with a dropout.

    python -m benchmarks.flower_scale.flower_scale              # 20 SuperNodes, 2 rounds; writes results/flower_scale.json
    python -m benchmarks.flower_scale.flower_scale --quick      # 4 SuperNodes; prints JSON, writes nothing

The real deployment path of tests/integration/test_flower_deployment.py (one SuperLink with
TLS, one ``python -m clinograph.secure.transport.flower.supernode`` process a hospital,
``flwr run`` of examples/flower_deployment/app: Clinograph's own ServerApp and ClientApp),
scaled to n hospitals. Each hospital is tests/secure/transport/flower_helpers.py's light
participant (a fixed small update, no training), so what is measured is the protocol and
Flower, not torch. No SuperNode authentication (the registration CLI costs seconds a node;
the deployment test covers it). The dropout: once round 0 has closed, one SuperNode is
SIGKILLed, so round 1 runs masked without it (it never answers round 1's plan) and must
complete with the other n - 1.

Not a test because it does not fit 90 s here (20 Python processes starting flwr on two shared
cores); the JSON records the measured wall time and each milestone. Asserts nothing; the JSON
says whether the rounds completed with the expected contributors.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "secure" / "transport"), str(ROOT / "tests" / "integration")]
sys.path.append(str(ROOT / "tests"))  # listen_port (last: tests/clinograph must not shadow the package)
from benchmarks.flower_scale import flower_trace  # noqa: E402
from benchmarks.flower_scale.round_time import cpu_use, superlink_cpu_per_call, trace_env  # noqa: E402
from research._common import add_convention, emit, machine, median, out_path  # noqa: E402

APP = ROOT / "examples" / "flower_deployment" / "app"


def startup_summary(folder: Path, events: list[dict]) -> dict:
    """Seconds from the first traced call of the run (``flwr run`` and the SuperExecs start at once)
    until: the ServerApp began (its ``started`` event), the last SuperNode was activated on the
    SuperLink, the hellos were all in (``greeted``)."""
    procs, spans = flower_trace.read_trace(folder)
    if not spans:
        return {}
    t0 = spans[0]["t0"]
    activated = [s["t1"] for s in spans if s["name"] == "rpc activate-node"]
    at = {e["event"]: e["t"] for e in reversed(events)}
    return {"serverapp_started_s": round(at.get("started", t0) - t0, 1),
            "last_node_activated_s": round(max(activated, default=t0) - t0, 1),
            "greeted_s": round(at.get("greeted", t0) - t0, 1)}


def server_calls(folder: Path, lo: float, hi: float) -> dict[str, float]:
    """The ServerApp's Flower calls by name, per exchange (send_and_receive) begun in [lo, hi]: medians."""
    procs, spans = flower_trace.read_trace(folder)
    server = [s for s in spans if procs.get(s["pid"], {}).get("argv0") == "flwr-serverapp"]
    exchanges = [s for s in server if s["name"] == "send_and_receive" and lo <= s["t0"] <= hi]
    names = sorted({s["name"] for x in exchanges for s in server
                    if s["name"].startswith("rpc ") and x["t0"] <= s["t0"] <= x["t1"]})
    return {n: median([sum(1 for s in server if s["name"] == n and x["t0"] <= s["t0"] <= x["t1"]) for x in exchanges])
            for n in names}


def exchange_summary(folder: Path, events: list[dict]) -> dict:
    """Per exchange of each round: its wall time and its slowest hospital's critical path
    (flower_trace.exchange_path), medians over each round's exchanges; the ServerApp's calls by name."""
    rows = flower_trace.breakdown(folder)
    opened = [e["t"] for e in events if e["event"] in ("round_opened", "round_closed")]
    out = {}
    for r, (a, b) in enumerate(zip(opened[::2], opened[1::2], strict=False)):
        xs = [x for x in rows if a <= x["t0"] <= b and "path" in x]
        keys = sorted({k for x in xs for k, v in x["path"].items() if isinstance(v, float | int)})
        out[f"round_{r}"] = {"exchanges": len(xs), "exchange_wall_s": [x["wall"] for x in xs],
                             "median_segment_s": {k: round(median([x["path"][k] for x in xs if k in x["path"]]), 4)
                                                  for k in keys},
                             "median_http_calls": {k: median([x["path"]["calls"][k] for x in xs])
                                                   for k in ("server", "supernode", "clientapp")} if xs else {},
                             "median_server_calls": server_calls(folder, a, b),
                             "idle_polls": flower_trace.idle_polls(folder, a, b),
                             "superlink_calls_per_exchange":
                                 superlink_cpu_per_call(folder, [(a, {}), (b, {})])["calls_per_exchange"]}
    return out


class Arm(NamedTuple):
    launcher: str | None = None  # SuperNode launcher module (None: the launcher)
    run_values: dict | None = None  # ServerApp run config added
    previous_driver: bool = False  # the ServerApp greets and polls as before (flower_trace.PREVIOUS_DRIVER)
    server_first: bool = False  # flwr run, and the ServerApp up, before the SuperNodes start
    previous_polls: bool = False  # every process polls as before the third pass (flower_trace.PREVIOUS_POLLS)
    node_args: tuple[str, ...] = ()  # launcher arguments added
    previous_calls: bool = False  # the SuperLink calls of before the fourth pass (flower_trace.PREVIOUS_CALLS)


ARMS = {"warm": Arm(), "warm_previous": Arm("benchmarks.flower_scale.previous_launcher", {"reply-poll": 0.2}),
        "server_previous": Arm(previous_driver=True), "warm_server_first": Arm(server_first=True),
        "server_previous_first": Arm(previous_driver=True, server_first=True),
        "polls_previous": Arm(run_values={"reply-poll": 0.05}, previous_polls=True, node_args=("--supernode-poll", "0.2")),
        "calls_previous": Arm(previous_calls=True)}


def run(n: int, tmp: Path, budget: float, timeouts: tuple[float, float] = (240.0, 120.0),
        supernode_args: tuple[str, ...] = (), trace: bool = True, arm: str = "warm") -> dict:
    import flower_helpers as fh
    from flower_processes import events as read_events
    from flower_processes import flower_processes

    hospitals = [f"h{i:02d}" for i in range(n)]
    victim = hospitals[-1]
    events = tmp / "events.jsonl"
    closed_so_far = lambda: [e.get("round") for e in read_events(events) if e["event"] == "round_closed"]  # noqa: E731
    server_toml = fh.write_server_files(tmp / "server", federation_id="fed-scale", mode="masked")
    launcher, run_values, previous_driver, server_first, previous_polls, node_args, previous_calls = ARMS[arm]
    result: dict = {"arm": arm, "n": n, "victim": victim, "supernode_args": list(supernode_args),
                    "load_average_at_start": list(os.getloadavg())}
    hooked = bool(launcher or previous_driver or previous_polls or previous_calls)  # the previous arms need the hook
    tenv = trace_env(tmp / "trace" if trace or hooked else None)
    if launcher:
        tenv[flower_trace.PREVIOUS] = "1"
    if previous_driver:
        tenv[flower_trace.PREVIOUS_DRIVER] = "1"
    if previous_polls:
        tenv[flower_trace.PREVIOUS_POLLS] = "1"
    if previous_calls:
        tenv[flower_trace.PREVIOUS_CALLS] = "1"
    pythonpath = [*([tenv.pop("_TRACE_SITE")] if tenv else []), APP, ROOT / "tests" / "secure" / "transport", ROOT]
    with flower_processes(tmp, federation_id="fed-scale", hospitals=hospitals, budget=budget,
                          pythonpath=pythonpath, env=tenv) as fp:
        try:
            link = fp.keys.superlink_dir
            superlink = fp.superlink(node_auth=False)

            def start_nodes() -> dict:
                started = {h: fp.supernode(h, node_config={"data-dir": tmp / h, "state-dir": tmp / "s" / h},
                                           factory="flower_helpers:make_participant", node_auth=False,
                                           environment=None, extra=(*supernode_args, *node_args),
                                           **({"launcher": launcher} if launcher else {})) for h in hospitals}
                fp.mark(f"{n} SuperNodes started")
                return started

            nodes = {} if server_first else start_nodes()
            fp.flwr_run({"server-config": server_toml, "federation-file": link / "federation.toml",
                         "server-key": link / "server.ed25519.pem", "events-file": events, "rounds": 2,
                         "min-nodes": n, "wait-timeout": timeouts[0], "hello-timeout": timeouts[0],
                         "plan-timeout": timeouts[1], "stage-timeout": timeouts[1], "end-timeout": timeouts[1],
                         "relay-timeout": timeouts[0], **(run_values or {})})  # the dead node costs one plan-timeout
            driver = fp.named("superlink", "flwr-run")
            if server_first:
                fp.wait(lambda: any(e["event"] == "started" for e in read_events(events)), spare=60, procs=driver,
                        what="the ServerApp to start")
                fp.mark("ServerApp started")
                nodes = start_nodes()
            fp.wait(lambda: any(e["event"] == "greeted" for e in read_events(events)), spare=60, procs=driver,
                    what=f"all {n} hospitals to be greeted")
            fp.mark("all hospitals greeted")
            fp.wait(lambda: bool(closed_so_far()), spare=30, procs=driver, what="round 0 to close")
            fp.mark("round 0 closed")
            os.killpg(nodes[victim].pid, signal.SIGKILL)
            fp.mark(f"{victim} SIGKILLed")
            fp.wait(lambda: any(e["event"] == "finished" for e in read_events(events)), procs=driver,
                    what="the federation to finish")
            fp.mark("federation finished")
            result["cpu_s"] = cpu_use(fp, superlink)
        except AssertionError as exc:
            result["error"] = str(exc)
        milestones, wall = fp.milestones, time.monotonic() - fp.started
        tails = {name: fp.log_tail(name, 1500) for name in ("superlink", "flwr-run", f"supernode-{hospitals[0]}")}
    closed = [e for e in read_events(events) if e["event"] == "round_closed"]
    result.update({
        "wall_seconds": round(wall, 1), "milestones": milestones,
        "rounds": [{k: e.get(k) for k in ("round", "contributors", "dropped")} for e in closed],
    })
    if trace:
        result["exchanges"] = exchange_summary(tmp / "trace", read_events(events))
        result["start_up"] = startup_summary(tmp / "trace", read_events(events))
    at = dict(milestones)
    if {"all hospitals greeted", "round 0 closed"} <= set(at):
        result["round0_seconds"] = round(at["round 0 closed"] - at["all hospitals greeted"], 1)
    if {f"{victim} SIGKILLed", "federation finished"} <= set(at):
        result["round1_with_dropout_seconds"] = round(at["federation finished"] - at[f"{victim} SIGKILLed"], 1)
    result["completed_as_expected"] = (
        len(closed) == 2 and sorted(closed[0].get("contributors", [])) == hospitals
        and sorted(closed[1].get("contributors", [])) == hospitals[:-1])
    if not result["completed_as_expected"]:
        result["log_tail"] = tails
    return result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_convention(ap, quick_help="4 SuperNodes")
    ap.add_argument("-n", type=int, default=None, help="SuperNodes (default 20; 4 with --quick)")
    ap.add_argument("--budget", type=float, default=900.0, help="seconds before giving up")
    ap.add_argument("--keep", type=Path, default=None, help="work in this new folder and keep it (logs)")
    ap.add_argument("--supernode-args", default="",
                    help="extra launcher arguments, e.g. '--executor subprocess --supernode-poll 3 --environment development' "
                         "(Flower's own executor: insecure_fab_clientapp, refused in production)")
    ap.add_argument("--stage-timeout", type=float, default=None,
                    help="seconds a stage may take, the dead node's cost in round 1 (default max(120, 15 n))")
    ap.add_argument("--no-trace", action="store_true", help="no per-process timestamps (flower_trace.py)")
    ap.add_argument("--arms", default="warm", help=f"comma-separated, run in this order, of {', '.join(ARMS)} "
                                                   "(default warm: the launcher's defaults)")
    args = ap.parse_args(argv)
    n = args.n or (4 if args.quick else 20)
    arms = args.arms.split(",")
    if any(a not in ARMS for a in arms):
        ap.error(f"--arms: each of {', '.join(ARMS)}")
    load_before = list(os.getloadavg())
    timeouts = (max(240.0, 30.0 * n), args.stage_timeout or max(120.0, 15.0 * n))  # generous by default
    extra = tuple(args.supernode_args.split())
    runs = []
    with TemporaryDirectory(prefix="fs_") as scratch:
        base = args.keep or Path(scratch)
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=False)
        for i, arm in enumerate(arms):
            (base / f"{i}_{arm}").mkdir()
            runs.append(run(n, base / f"{i}_{arm}", args.budget, timeouts, extra, trace=not args.no_trace, arm=arm))
    result = {"benchmark": "flower_scale", "quick": args.quick, "machine": machine(), "runs": runs,
              "load_average_at_start": load_before, "load_average_at_end": list(os.getloadavg())}
    emit(result, out=out_path(__file__, args))
    return result


if __name__ == "__main__":
    main()
