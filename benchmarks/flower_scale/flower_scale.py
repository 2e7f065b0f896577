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
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
sys.path.insert(0, str(ROOT / "tests" / "secure" / "transport"))
from research._common import add_convention, emit, machine, out_path  # noqa: E402

APP = ROOT / "examples" / "flower_deployment" / "app"
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _events(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _wait(cond, *, timeout: float, what: str, procs) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        for name, p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode} while waiting for {what}")
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")


def run(n: int, tmp: Path, budget: float, timeouts: tuple[float, float] = (240.0, 120.0)) -> dict:
    import flower_helpers as fh
    from clinograph.secure.transport.flower.keyset import init_keyset

    hospitals = [f"h{i:02d}" for i in range(n)]
    victim = hospitals[-1]
    started = time.monotonic()
    milestones: list[tuple[str, float]] = []

    def mark(what: str) -> None:
        milestones.append((what, round(time.monotonic() - started, 1)))
        print(f"[flower_scale n={n}] {milestones[-1][1]:7.1f} s  {what}", file=sys.stderr, flush=True)
        closed = [e for e in _events(events) if e["event"] == "round_closed"]
        print(f"[flower_scale n={n}] rounds closed so far: {[e.get('round') for e in closed]}", file=sys.stderr,
              flush=True)

    remaining = lambda: budget - (time.monotonic() - started)  # noqa: E731
    events = tmp / "events.jsonl"
    port = _free_port()
    keys = init_keyset(tmp / "keys", federation_id="fed-scale", hospitals=hospitals,
                       superlink_hosts=["127.0.0.1", "localhost"], superlink_port=port)
    server_toml = fh.write_server_files(tmp / "server", federation_id="fed-scale", mode="masked")
    flwr_home = tmp / "flwr"
    flwr_home.mkdir()
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\naddress = "127.0.0.1:{port}"\n'
        f'root-certificates = "{keys.superlink_dir / "ca.pem"}"\n')
    env = {**os.environ, "FLWR_HOME": str(flwr_home), "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join([str(APP), str(ROOT / "tests" / "secure" / "transport")]),
           "FLWR_TELEMETRY_ENABLED": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    logs = tmp / "logs"
    logs.mkdir()
    procs: list[tuple[str, subprocess.Popen]] = []

    def start(name: str, cmd: list[str]) -> subprocess.Popen:
        p = subprocess.Popen(cmd, env=env, stdout=(logs / f"{name}.log").open("wb"), stderr=subprocess.STDOUT,
                             cwd=tmp, start_new_session=True)
        procs.append((name, p))
        return p

    link = keys.superlink_dir
    result: dict = {"n": n, "victim": victim}
    try:
        start("superlink", [str(BIN / "flower-superlink"), "--ssl-ca-certfile", str(link / "ca.pem"),
                            "--ssl-certfile", str(link / "server.pem"), "--ssl-keyfile", str(link / "server.key"),
                            "--host", "127.0.0.1", "--port", str(port), "--disable-runtime-dependency-installation"])
        _wait(lambda: _port_open(port), timeout=min(90, remaining()), what="the SuperLink", procs=procs)
        mark("SuperLink up")
        nodes = {}
        for h in hospitals:
            d = keys.hospital_dirs[h]
            (tmp / h).mkdir()
            node_config = (f"hospital='{h}' data-dir='{tmp / h}' state-dir='{tmp / h / 'state'}' "
                           f"key-file='{d / f'{h}.ed25519.pem'}' federation-file='{d / 'federation.toml'}'")
            nodes[h] = start(f"supernode-{h}", [
                sys.executable, "-m", "clinograph.secure.transport.flower.supernode",
                "--participant-factory", "flower_helpers:make_participant", "--node-config", node_config,
                "--superlink", f"127.0.0.1:{port}", "--root-certificates", str(d / "ca.pem"),
                "--port", str(_free_port()), "--max-retries", "10", "--max-wait-time", "120"])
        mark(f"{n} SuperNodes started")
        run_config = " ".join([
            f"server-config='{server_toml}'", f"federation-file='{link / 'federation.toml'}'",
            f"server-key='{link / 'server.ed25519.pem'}'", f"events-file='{events}'", "rounds=2",
            f"min-nodes={n}", f"wait-timeout={timeouts[0]}", f"hello-timeout={timeouts[0]}",
            f"plan-timeout={timeouts[1]}", f"stage-timeout={timeouts[1]}", f"end-timeout={timeouts[1]}",
            f"relay-timeout={timeouts[0]}"])  # the dead node costs one plan-timeout
        start("flwr-run", [str(BIN / "flwr"), "run", str(APP), "loopback", "--run-config", run_config, "--stream"])
        mark("flwr run")
        _wait(lambda: any(e["event"] == "greeted" for e in _events(events)), timeout=max(1, remaining() - 60),
              what=f"all {n} hospitals to be greeted", procs=[p for p in procs if p[0] in ("superlink", "flwr-run")])
        mark("all hospitals greeted")
        _wait(lambda: any(e["event"] == "round_closed" for e in _events(events)), timeout=max(1, remaining() - 30),
              what="round 0 to close", procs=[p for p in procs if p[0] in ("superlink", "flwr-run")])
        mark("round 0 closed")
        os.killpg(nodes[victim].pid, signal.SIGKILL)
        mark(f"{victim} SIGKILLed")
        _wait(lambda: any(e["event"] == "finished" for e in _events(events)), timeout=max(1, remaining() - 5),
              what="the federation to finish", procs=[p for p in procs if p[0] in ("superlink", "flwr-run")])
        mark("federation finished")
    except RuntimeError as exc:
        result["error"] = str(exc)
    finally:
        for _, p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for _, p in procs:
            p.wait(timeout=30)
    ev = _events(events)
    closed = [e for e in ev if e["event"] == "round_closed"]
    result.update({
        "wall_seconds": round(time.monotonic() - started, 1), "milestones": milestones,
        "rounds": [{k: e.get(k) for k in ("round", "contributors", "dropped")} for e in closed],
    })
    at = dict(milestones)
    if {"all hospitals greeted", "round 0 closed"} <= set(at):
        result["round0_seconds"] = round(at["round 0 closed"] - at["all hospitals greeted"], 1)
    if {f"{victim} SIGKILLed", "federation finished"} <= set(at):
        result["round1_with_dropout_seconds"] = round(at["federation finished"] - at[f"{victim} SIGKILLed"], 1)
    result["completed_as_expected"] = (
        len(closed) == 2 and sorted(closed[0].get("contributors", [])) == hospitals
        and sorted(closed[1].get("contributors", [])) == hospitals[:-1])
    if not result["completed_as_expected"]:
        result["log_tail"] = {name: (logs / f"{name}.log").read_text(errors="replace")[-1500:]
                              for name in ("superlink", "flwr-run", f"supernode-{hospitals[0]}")
                              if (logs / f"{name}.log").exists()}
    return result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_convention(ap, quick_help="4 SuperNodes")
    ap.add_argument("-n", type=int, default=None, help="SuperNodes (default 20; 4 with --quick)")
    ap.add_argument("--budget", type=float, default=900.0, help="seconds before giving up")
    ap.add_argument("--keep", type=Path, default=None, help="work in this new folder and keep it (logs)")
    args = ap.parse_args(argv)
    n = args.n or (4 if args.quick else 20)
    timeouts = (max(240.0, 30.0 * n), max(120.0, 15.0 * n))  # every node starts a ClientApp process a message
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=False)
        row = run(n, args.keep, args.budget, timeouts)
    else:
        with TemporaryDirectory(prefix="flower_scale_") as tmp:
            row = run(n, Path(tmp), args.budget, timeouts)
    result = {"benchmark": "flower_scale", "quick": args.quick, "machine": machine(), **row}
    emit(result, out=out_path(__file__, args))
    return result


if __name__ == "__main__":
    main()
