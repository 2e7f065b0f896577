"""Where a masked round's wall time goes over real Flower processes: compute, and the rest.

    python -m benchmarks.flower_scale.round_time                 # 3 SuperNodes, 5 rounds, the polls before and now, twice
    python -m benchmarks.flower_scale.round_time --quick         # 3 rounds, the polls before and now
    python -m benchmarks.flower_scale.round_time --arms flower,warm

One SuperLink (TLS), n SuperNodes (``python -m clinograph.secure.transport.flower.supernode``,
tests/secure/transport/flower_helpers.py's light participant: a fixed small update, no
training) and ``flwr run`` of examples/flower_deployment/app, masked, started through
tests/integration/flower_processes.py -- once per executor, in the same benchmark process.
Every hospital's participant is wrapped to append the wall-clock time it was entered and left
for each relayed message to ``calls.jsonl`` in its state directory. With the server's progress
events (``stage_progress``: when each exchange ended and how long its slowest reply took), each
exchange splits, for its slowest hospital, into

* ``to_hospital``: the server pushed, until the hospital's participant was entered (the
  SuperNode's idle poll of the SuperLink, the SuperExec's task poll, the ClientApp's process
  start, its Runtime API calls and FAB install);
* ``hospital``: the participant's own work;
* ``back``: until the server had the reply (the ClientApp's push, the SuperNode's reply poll,
  its push to the SuperLink, the ServerApp's pull);

and between exchanges the server's own work (``server``). "The rest" of a round is its wall time
less the slowest hospital's work and the server's. Alongside: the cold start of one
``flwr-clientapp`` process (``flwr-clientapp --help``: its imports alone) and the in-process round
(the same server and participants over ``InProcessTransport``: compute with no transport).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "secure" / "transport"), str(ROOT / "tests" / "integration")]
sys.path.append(str(ROOT / "tests"))  # listen_port (last: tests/clinograph must not shadow the package)
from benchmarks.flower_scale import flower_trace  # noqa: E402
from research._common import add_convention, emit, machine, median, out_path  # noqa: E402

#: name -> (executor, SuperExec poll s or None for the executor's default, SuperNode idle poll s (3 = Flower's;
#: None: the launcher's default), SuperNode launcher module or None for the launcher, ServerApp ``reply-poll`` s
#: or None for the app's (examples/flower_deployment/app/pyproject.toml))
ARMS = {
    "flower": ("subprocess", None, 3.0, None, None),                      # Flower 1.41's executor and waits
    "warm_previous": ("warm", None, 0.2, "benchmarks.flower_scale.previous_launcher", 0.2),  # the launcher before
    "warm": ("warm", None, None, None, None),                             # the launcher's defaults now
    "warm_supernode_poll_0.1": ("warm", None, 0.1, None, None),           # and a SuperNode idle poll from 0.1 s
    "warm_polls_0.05": ("warm", 0.02, 0.05, None, 0.02),                  # every poll near its floor
    "polls_previous": ("warm", None, 0.2, None, 0.05),                    # the polls before the third pass
    "calls_previous": ("warm", None, None, None, None),                   # no quiet after a reply, no late first pull
    "warm_supernode_poll_0.05": ("warm", None, 0.05, None, None),         # the idle poll's floor from 0.05 s
}
#: Arms whose processes poll as before the third pass of issue 35 (flower_trace.PREVIOUS_POLLS).
PREVIOUS_POLL_ARMS = frozenset({"polls_previous"})
#: Arms whose processes make the SuperLink calls of before the fourth pass (flower_trace.PREVIOUS_CALLS).
PREVIOUS_CALL_ARMS = frozenset({"calls_previous"})
DEFAULT_ARMS = ("calls_previous", "warm", "calls_previous", "warm")
QUICK_ARMS = ("calls_previous", "warm")


class _Timed:
    """A participant whose every call appends {stage, t0, t1} to ``calls.jsonl``."""

    def __init__(self, inner, log: Path):
        self._c, self.name, self._log = inner, inner.name, log

    def _timed(self, stage: str, fn, *args):
        t0 = time.time()
        try:
            return fn(*args)
        finally:
            with self._log.open("a") as fh:
                fh.write(json.dumps({"stage": stage, "t0": t0, "t1": time.time()}) + "\n")

    def on_setup(self, step, parts):
        return self._timed("setup", self._c.on_setup, step, parts)

    def on_plan(self, plan):
        return self._timed("plan", self._c.on_plan, plan)

    def on_stage(self, data):
        return self._timed("stage", self._c.on_stage, data)

    def decrypted_result(self):
        return self._c.decrypted_result()

    def on_round_end(self, global_model):
        return self._timed("end", self._c.on_round_end, global_model)


def make_timed_participant(*, node_config, run_config, run_id, identity):
    """Participant factory: flower_helpers' light participant, timed."""
    import flower_helpers

    inner = flower_helpers.make_participant(node_config=node_config, run_config=run_config, run_id=run_id,
                                            identity=identity)
    return _Timed(inner, Path(str(node_config["state-dir"])) / "calls.jsonl")


def _calls(state: Path) -> list[dict]:
    path = state / "calls.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def split_rounds(events: list[dict], calls: dict[str, list[dict]]) -> list[dict]:
    """Per round: its wall time, and for each exchange the slowest hospital's to / work / back."""
    rounds: list[dict] = []
    current: dict | None = None
    for e in events:
        if e["event"] == "round_opened":
            current = {"round": e["round"], "opened": e["t"], "exchanges": []}
        elif e["event"] == "stage_progress" and current is not None:
            end = e["t"]
            start = end - float(e.get("slowest_s") or 0.0)
            slowest = e.get("slowest")
            inside = [c for c in calls.get(str(slowest), []) if start - 0.05 <= c["t0"] <= end]
            row = {"stage": e["stage"], "wall": end - start, "start": start, "end": end}
            if inside:
                c = inside[-1]
                row.update(to_hospital=c["t0"] - start, hospital=c["t1"] - c["t0"], back=end - c["t1"])
            current["exchanges"].append(row)
        elif e["event"] == "round_closed" and current is not None:
            current["wall"] = e["t"] - current["opened"]
            xs = current["exchanges"]
            gaps = [b["start"] - a["end"] for a, b in zip(xs, xs[1:], strict=False)]
            current["server"] = (xs[0]["start"] - current["opened"] if xs else 0.0) + sum(gaps) + \
                (e["t"] - xs[-1]["end"] if xs else 0.0)
            current["hospital"] = sum(x.get("hospital", 0.0) for x in xs)
            current["rest"] = current["wall"] - current["server"] - current["hospital"]
            for key in ("to_hospital", "back"):
                current[key] = sum(x.get(key, 0.0) for x in xs)
            for x in xs:
                for k in ("start", "end"):
                    x.pop(k)
            current.pop("opened")
            rounds.append(current)
            current = None
    return rounds


def trace_env(folder: Path | None) -> dict[str, str]:
    """The environment that makes every Flower process of a run write its spans to ``folder``
    (flower_trace.py, through trace_site/sitecustomize.py); {} for no trace."""
    if folder is None:
        return {}
    folder.mkdir(parents=True, exist_ok=True)
    return {flower_trace.ENV: str(folder), "_TRACE_SITE": str(HERE / "trace_site")}


def trace_summary(folder: Path, events: list[dict]) -> dict:
    """The exchanges of rounds 1.. (round 0 also unpacks the app), their critical-path segments
    (flower_trace.exchange_path) as medians, and every exchange's path."""
    rows = flower_trace.breakdown(folder)
    opened = [e["t"] for e in events if e["event"] == "round_opened"]
    later = [r for r in rows if len(opened) > 1 and r["t0"] >= opened[1]]
    keys = sorted({k for r in later for k, v in r.get("path", {}).items() if isinstance(v, float | int)})
    medians = {k: round(median([r["path"][k] for r in later if k in r.get("path", {})]), 4) for k in keys}
    parts = sorted({k for r in later for k in r.get("path", {}).get("setup_parts", {})})
    calls = {role: median([r["path"]["calls"][role] for r in later if "calls" in r.get("path", {})])
             for role in ("server", "supernode", "clientapp")} if later else {}
    procs, spans = flower_trace.read_trace(folder)
    start = opened[1] if len(opened) > 1 else 0.0
    roles = {pid: p.get("argv0") for pid, p in procs.items()}
    by_call: dict[str, list[float]] = {}
    for sp in spans:
        if sp["name"].startswith("rpc ") and sp["t0"] >= start:
            role = {"flwr-serverapp": "serverapp", "-m": "supernode", "flower-supernode": "clientapp"}.get(
                str(roles.get(sp["pid"])), str(roles.get(sp["pid"])))
            by_call.setdefault(f"{role} {sp['name'][4:]}", []).append(sp["t1"] - sp["t0"])
    rpc = {k: {"calls": len(v), "median_s": round(median(v), 4)} for k, v in sorted(by_call.items())}
    return {"exchanges_measured": len(later), "rpc": rpc, "median_exchange_wall_s": round(median([r["wall"] for r in later]), 4)
            if later else None, "median_segment_s": medians,
            "median_setup_parts_s": {p: round(median([r["path"]["setup_parts"][p] for r in later
                                                      if "setup_parts" in r.get("path", {})]), 4) for p in parts},
            "median_http_calls": calls, "idle_polls": flower_trace.idle_polls(folder, start, float("inf")),
            "exchanges": rows}


def run_federation(tmp: Path, *, n: int, rounds: int, executor: str, poll: float | None, supernode_poll: float | None,
                   budget: float, more: tuple[str, ...] = (), trace: bool = True, launcher: str | None = None,
                   reply_poll: float | None = None, previous_polls: bool = False, previous_calls: bool = False) -> dict:
    """One federation over real processes with this executor; its rounds split as above."""
    import flower_helpers as fh
    from flower_processes import events as read_events
    from flower_processes import flower_processes

    hospitals = [f"h{i}" for i in range(n)]
    events_file = tmp / "events.jsonl"
    tenv = trace_env(tmp / "trace" if trace or launcher or previous_polls or previous_calls else None)  # the hook
    if launcher:
        tenv[flower_trace.PREVIOUS] = "1"
    if previous_polls:
        tenv[flower_trace.PREVIOUS_POLLS] = "1"
    if previous_calls:
        tenv[flower_trace.PREVIOUS_CALLS] = "1"
    env = {"PYTHONPATH": os.pathsep.join([*([tenv.pop("_TRACE_SITE")] if tenv else []),
                                          str(ROOT / "examples" / "flower_deployment" / "app"),
                                          str(ROOT / "tests" / "secure" / "transport"), str(ROOT)]), **tenv}
    result: dict = {"executor": executor, "superexec_poll_s": poll, "supernode_poll_s": supernode_poll, "n": n,
                    "launcher": launcher or "clinograph.secure.transport.flower.supernode", "reply_poll_s": reply_poll}
    with flower_processes(tmp, federation_id="fed-rounds", hospitals=hospitals, budget=budget,
                          pythonpath=[], env=env) as fp:
        try:
            server_toml = fh.write_server_files(tmp / "server", federation_id="fed-rounds", mode="masked")
            superlink = fp.superlink(node_auth=False)
            extra = ["--executor", executor, *(["--superexec-poll", str(poll)] if poll is not None else []),
                     *(["--supernode-poll", str(supernode_poll)] if supernode_poll is not None else []), *more]
            for h in hospitals:
                fp.supernode(h, node_config={"data-dir": tmp / h, "state-dir": tmp / "s" / h},
                             factory="benchmarks.flower_scale.round_time:make_timed_participant", node_auth=False,
                             # Flower's own executor runs the run's ClientApp: insecure_fab_clientapp, development only
                             environment="development" if executor == "subprocess" else None, extra=extra,
                             **({"launcher": launcher} if launcher else {}))
            link = fp.keys.superlink_dir
            fp.flwr_run({"server-config": server_toml, "federation-file": link / "federation.toml",
                         "server-key": link / "server.ed25519.pem", "events-file": events_file, "rounds": rounds,
                         "min-nodes": n, "wait-timeout": 120.0, "hello-timeout": 120.0, "plan-timeout": 60.0,
                         "stage-timeout": 60.0, "end-timeout": 60.0, "relay-timeout": 60.0, **({"reply-poll": reply_poll} if reply_poll else {})})
            over = lambda: any(e["event"] in ("finished", "failed") for e in read_events(events_file))  # noqa: E731
            fp.wait(lambda: over() or any(e["event"] == "round_opened" and e["round"] == 1
                                          for e in read_events(events_file)),
                    what="round 1 to open", procs=fp.named("superlink", "flwr-run"))
            cpu_window = [(time.time(), cpu_use(fp, superlink))]
            fp.wait(over, what="the federation to finish", procs=fp.named("superlink", "flwr-run"))
            cpu_window.append((time.time(), cpu_use(fp, superlink)))
            result["cpu_s"] = cpu_window[-1][1]
        except AssertionError as exc:
            result["error"] = str(exc)
            result["log_tail"] = {k: fp.log_tail(k, 1500) for k in ("flwr-run", "supernode-h0")}
        result["milestones"] = fp.milestones
    ev = read_events(events_file)
    result["rounds"] = split_rounds(ev, {h: _calls(tmp / "s" / h) for h in hospitals})
    result["completed"] = any(e["event"] == "finished" for e in ev)
    if trace:
        result["trace"] = trace_summary(tmp / "trace", ev)
        if "cpu_s" in result:
            result["superlink_cpu_per_call"] = superlink_cpu_per_call(tmp / "trace", cpu_window)
    later = result["rounds"][1:] or result["rounds"]  # round 0 also pays the first ClientApp's FAB unpacking
    for key in ("wall", "rest", "to_hospital", "back", "hospital", "server"):
        result[f"median_{key}_s"] = round(median([r[key] for r in later]), 3) if later else None
    return result


def cpu_use(fp, superlink) -> dict:
    """CPU seconds used so far by the SuperLink and by all SuperNode processes (their forkservers and
    ClientApps not included): what the polls cost, with everything else the run did."""
    nodes = [flower_trace.cpu_seconds(p.pid) for name, p in fp.procs if name.startswith("supernode-")]
    return {"superlink": flower_trace.cpu_seconds(superlink.pid),
            "supernodes": round(sum(c for c in nodes if c is not None), 2)}


#: Flower calls that go to the SuperLink, by the role of the caller (flower_trace): the ServerApp's all, the
#: SuperNode's all but its SuperExec thread's (to the node's own Runtime API); the ClientApps' none.
TO_SUPERLINK = {"serverapp": None, "supernode": ("acquire-task",)}


def superlink_cpu_per_call(folder: Path, window: list[tuple[float, dict]]) -> dict:
    """The SuperLink's CPU seconds between two reads (from round 1 to the end) over the calls it
    served in that time (the traced ones and the idle polls): its own cost of one call. Also the
    calls by caller and kind (``idle``: a poll that found nothing) over the ServerApp's exchanges
    begun in that time (``calls_per_exchange``; the run's end, e.g. ``run/finish``, included)."""
    (t0, c0), (t1, c1) = window
    procs, spans = flower_trace.read_trace(folder)
    calls, exchanges = 0, 0
    kinds: dict[str, int] = {}
    for sp in spans:
        idle = sp["name"].startswith(flower_trace.IDLE)
        name = sp["name"][len(flower_trace.IDLE):] if idle else sp["name"]
        if not t0 <= sp["t0"] <= t1:
            continue
        exchanges += name == "send_and_receive"
        if not name.startswith("rpc "):
            continue
        role = {"flwr-serverapp": "serverapp", "-m": "supernode"}.get(str(procs.get(sp["pid"], {}).get("argv0")))
        if role in TO_SUPERLINK and name[4:] not in (TO_SUPERLINK[role] or ()):
            calls += 1
            kind = f"{role} {'idle ' if idle else ''}{name[4:]}"
            kinds[kind] = kinds.get(kind, 0) + 1
    cpu = (c1.get("superlink") or 0.0) - (c0.get("superlink") or 0.0)
    return {"seconds": round(t1 - t0, 2), "cpu_s": round(cpu, 2), "calls": calls,
            "cpu_ms_per_call": round(1000 * cpu / calls, 2) if calls else None, "exchanges": exchanges,
            "calls_per_exchange": {"all": round(calls / exchanges, 1) if exchanges else None,
                                   **{k: round(v / exchanges, 2) for k, v in sorted(kinds.items()) if exchanges}}}


def cold_start_seconds(reps: int = 3) -> float:
    """Median wall time of ``flwr-clientapp --help``: one ClientApp process's imports, nothing else."""
    exe = Path(sys.executable).parent / "flwr-clientapp"
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        subprocess.run([str(exe), "--help"], capture_output=True, check=True)
        times.append(time.perf_counter() - t)
    return round(median(times), 3)


def in_process_round_seconds(tmp: Path, *, n: int, rounds: int) -> float:
    """Median round of the same server and participants over InProcessTransport (compute only)."""
    import flower_helpers as fh
    from clinograph.secure.enrolment import load_federation
    from clinograph.secure.runtime import InProcessTransport, run_round
    from clinograph.secure.transport.flower.keyset import init_keyset

    from clinograph.core.identity import Identity

    hospitals = [f"h{i}" for i in range(n)]
    keys = init_keyset(tmp / "keys", federation_id="fed-rounds", hospitals=hospitals,
                       superlink_hosts=["127.0.0.1"], superlink_port=9)
    fed = load_federation(keys.federation_file)
    server = fh.make_server(federation=fed, audit_dir=tmp / "audit", server_key=keys.superlink_dir /
                            "server.ed25519.pem")
    parts = {h: fh.FakeHospital(identity=Identity.load(h, keys.hospital_dirs[h] / f"{h}.ed25519.pem"),
                                server=fed.server_public(), peers=fed.enrolled(), federation_id="fed-rounds")
             for h in hospitals}
    transport = InProcessTransport(parts)
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        run_round(server, transport, deliver=True)
        times.append(time.perf_counter() - t)
    return round(median(times), 4)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_convention(ap, quick_help="3 rounds")
    ap.add_argument("-n", type=int, default=3, help="SuperNodes (default 3)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default 5; 3 with --quick)")
    ap.add_argument("--arms", default=None,
                    help=f"comma-separated, of {', '.join(ARMS)} (default: {','.join(DEFAULT_ARMS)}; "
                         f"{','.join(QUICK_ARMS)} with --quick)")
    ap.add_argument("--no-trace", action="store_true", help="no per-process timestamps (flower_trace.py)")
    ap.add_argument("--keep", type=Path, default=None, help="work in this new folder and keep it (logs)")
    ap.add_argument("--supernode-extra", default="", help="more launcher arguments for every arm, e.g. '--log-level debug'")
    ap.add_argument("--budget", type=float, default=600.0, help="seconds a federation may take before giving up")
    args = ap.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 5)
    arms = args.arms.split(",") if args.arms else list(QUICK_ARMS if args.quick else DEFAULT_ARMS)
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        ap.error(f"unknown arm(s) {', '.join(unknown)}; known: {', '.join(ARMS)}")
    load_before = list(os.getloadavg())
    runs = []
    with TemporaryDirectory(prefix="rt_") as scratch:
        tmp = args.keep or scratch
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=False)
        compute = in_process_round_seconds(Path(tmp) / "inproc", n=args.n, rounds=rounds)
        for i, name in enumerate(arms):  # an arm named twice runs twice (interleaved: the load drifts)
            executor, poll, supernode_poll, launcher, reply_poll = ARMS[name]
            work = Path(tmp) / f"{i}_{name}"
            work.mkdir()
            load = list(os.getloadavg())
            runs.append({"arm": name, "load_average_at_start": load,
                         **run_federation(work, n=args.n, rounds=rounds, executor=executor, poll=poll,
                                          supernode_poll=supernode_poll, budget=args.budget,
                                          more=tuple(args.supernode_extra.split()), trace=not args.no_trace,
                                          launcher=launcher, reply_poll=reply_poll,
                                          previous_polls=name in PREVIOUS_POLL_ARMS,
                                          previous_calls=name in PREVIOUS_CALL_ARMS)})
    result = {"benchmark": "flower_round_time", "quick": args.quick, "machine": machine(), "rounds": rounds,
              "flwr_clientapp_cold_start_s": cold_start_seconds(), "in_process_round_s": compute, "runs": runs,
              "load_average_at_start": load_before, "load_average_at_end": list(os.getloadavg())}
    emit(result, out=out_path(__file__, args))
    return result


if __name__ == "__main__":
    main()
