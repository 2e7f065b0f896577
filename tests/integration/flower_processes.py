"""Real Flower processes on loopback for the tests and benchmarks: one start-up, one clean-up.

:func:`flower_processes` writes the federation's keys (``init_keyset``: CA, SuperLink TLS
certificate, each hospital's signing and node-auth keys), points ``FLWR_HOME`` at a SuperLink
called ``loopback`` and yields a :class:`FlowerProcesses` that starts, in the order a
deployment does: the SuperLink (TLS, optionally SuperNode authentication), ``flwr supernode
register`` of each hospital's node-auth key, one ``python -m clinograph.secure.transport.flower.
supernode`` a hospital, and ``flwr run`` of examples/flower_deployment/app. Every process gets
its own process group and a log in ``logs/``; on leaving, every process and everything below it
(the SuperLink's SuperExec runs detached, in a session of its own) is SIGKILLed and reaped.
Every wait is bounded and fails naming what it waited for and which process died.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "examples" / "flower_deployment" / "app"
BIN = Path(sys.executable).parent


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def events(path: Path) -> list[dict]:
    """The ServerApp's progress events (``events-file``), [] before the first."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait(cond: Callable[[], bool], *, timeout: float, what: str,
         procs: Iterable[tuple[str, subprocess.Popen]] = ()) -> None:
    """Poll ``cond`` until true; AssertionError after ``timeout`` s or when one of ``procs`` exits."""
    end = time.monotonic() + timeout
    procs = list(procs)
    while time.monotonic() < end:
        if cond():
            return
        for name, p in procs:
            if p.poll() is not None:
                raise AssertionError(f"{name} exited with {p.returncode} while waiting for {what}")
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (a process group does not reach the SuperLink's SuperExec)."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(proc.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def serverapp_pids(superlink: int) -> list[int]:
    """The ``flwr-serverapp`` processes the SuperLink started."""
    out = []
    for pid in descendants(superlink):
        try:
            if b"flwr-serverapp" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except OSError:
            continue
    return out


def run_config(values: Mapping[str, Any]) -> str:
    """``flwr run --run-config`` text: strings quoted, numbers as they are."""
    return " ".join(f"{k}='{v}'" if isinstance(v, str | Path) else f"{k}={v}" for k, v in values.items())


@dataclass
class FlowerProcesses:
    """One federation's processes on loopback (see the module docstring)."""

    tmp: Path
    keys: Any  # clinograph.secure.transport.flower.keyset.Keyset
    port: int
    env: dict[str, str]
    started: float = field(default_factory=time.monotonic)
    budget: float = 600.0
    procs: list[tuple[str, subprocess.Popen]] = field(default_factory=list)
    milestones: list[tuple[str, float]] = field(default_factory=list)

    @property
    def logs(self) -> Path:
        return self.tmp / "logs"

    def remaining(self) -> float:
        return self.budget - (time.monotonic() - self.started)

    def mark(self, what: str) -> None:
        self.milestones.append((what, round(time.monotonic() - self.started, 1)))
        print(f"[flower processes] {self.milestones[-1][1]:6.1f} s  {what}", file=sys.stderr, flush=True)

    def start(self, name: str, cmd: Sequence[str], *, env: Mapping[str, str] | None = None) -> subprocess.Popen:
        self.logs.mkdir(exist_ok=True)
        p = subprocess.Popen(list(cmd), env=dict(env or self.env), stdout=(self.logs / f"{name}.log").open("wb"),
                             stderr=subprocess.STDOUT, cwd=self.tmp, start_new_session=True)
        self.procs.append((name, p))
        return p

    def named(self, *names: str) -> list[tuple[str, subprocess.Popen]]:
        return [(n, p) for n, p in self.procs if n in names]

    def wait(self, cond: Callable[[], bool], *, what: str, spare: float = 5.0,
             procs: Iterable[tuple[str, subprocess.Popen]] | None = None, timeout: float | None = None) -> None:
        """:func:`wait` within the budget, keeping ``spare`` seconds for the clean-up."""
        limit = max(1.0, self.remaining() - spare) if timeout is None else min(timeout, max(1.0, self.remaining()))
        try:
            wait(cond, timeout=limit, what=what, procs=self.procs if procs is None else procs)
        except AssertionError as exc:  # the log of every process that has exited: why it did
            dead = [n for n, p in self.procs if p.poll() is not None]
            tails = "".join(f"\n--- {n}.log (exit {p.returncode}), last lines ---\n{self.log_tail(n, 3000)}"
                            for n, p in self.procs if n in dead)
            raise AssertionError(f"{exc}{tails}") from None

    def superlink(self, *, node_auth: bool = True, bin_dir: Path = BIN,
                  env: Mapping[str, str] | None = None) -> subprocess.Popen:
        """Start the SuperLink (TLS) and wait for its port."""
        link = self.keys.superlink_dir
        p = self.start("superlink", [
            str(bin_dir / "flower-superlink"), "--ssl-ca-certfile", str(link / "ca.pem"), "--ssl-certfile",
            str(link / "server.pem"), "--ssl-keyfile", str(link / "server.key"),
            *(["--enable-supernode-auth"] if node_auth else []), "--host", "127.0.0.1", "--port", str(self.port),
            "--disable-runtime-dependency-installation"], env=env)
        self.wait(lambda: port_open(self.port), what="the SuperLink", timeout=60)
        self.mark("SuperLink up")
        return p

    def register(self, hospitals: Iterable[str]) -> None:
        """``flwr supernode register`` of each hospital's node-auth public key, all at once."""
        running = [subprocess.Popen(
            [str(BIN / "flwr"), "supernode", "register", str(self.keys.hospital_dirs[h] / f"{h}.node-auth.pub"),
             "loopback", "--name", h], env=self.env, cwd=self.tmp, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True) for h in hospitals]
        for p in running:
            out, _ = p.communicate(timeout=max(1.0, min(60.0, self.remaining())))
            assert p.returncode == 0 and "registered successfully" in out, out[-2000:]
        self.mark("node keys registered")

    def supernode(self, hospital: str, *, node_config: Mapping[str, Any], factory: str | None = None,
                  node_auth: bool = True, environment: str | None = "production",
                  extra: Sequence[str] = (), launcher: str = "clinograph.secure.transport.flower.supernode"
                  ) -> subprocess.Popen:
        """Start ``hospital``'s SuperNode (our launcher, or the module ``launcher``) with ``key-file``
        and ``federation-file`` added."""
        # not port 0 (tests/listen_port.py); imported here: a SuperNode imports this module through a
        # test's participant factory, without tests/ on its path
        from listen_port import reserve_port

        d = self.keys.hospital_dirs[hospital]
        config = {"hospital": hospital, **node_config, "key-file": d / f"{hospital}.ed25519.pem",
                  "federation-file": d / "federation.toml"}
        return self.start(f"supernode-{hospital}", [
            sys.executable, "-m", launcher,
            *(["--participant-factory", factory] if factory else []),
            *(["--environment", environment] if environment else []), "--node-config", run_config(config),
            "--superlink", f"127.0.0.1:{self.port}", "--root-certificates", str(d / "ca.pem"),
            *(["--auth-supernode-private-key", str(d / f"{hospital}.node-auth")] if node_auth else []),
            "--port", str(reserve_port()), "--max-retries", "10", "--max-wait-time", "120", *extra])

    def flwr_run(self, values: Mapping[str, Any], *, name: str = "flwr-run", app: Path = APP) -> subprocess.Popen:
        """``flwr run`` of ``app`` on the loopback SuperLink with this run config, streaming its log."""
        p = self.start(name, [str(BIN / "flwr"), "run", str(app), "loopback", "--run-config", run_config(values),
                              "--stream"])
        self.mark(name)
        return p

    def flwr_stop(self, run_id: int) -> None:
        """``flwr stop RUN_ID`` on the loopback SuperLink (the run's status becomes stopped at once)."""
        out = subprocess.run([str(BIN / "flwr"), "stop", str(run_id), "loopback"], env=self.env, cwd=self.tmp,
                             capture_output=True, text=True, timeout=max(1.0, min(60.0, self.remaining())))
        assert out.returncode == 0, (out.stdout + out.stderr)[-2000:]
        self.mark(f"stopped run {run_id}")

    def federation(self, hospitals: Sequence[str], *, node_configs: Mapping[str, Mapping[str, Any]],
                   values: Mapping[str, Any], events_file: Path) -> str:
        """A whole run, as a deployment starts it: the SuperLink (TLS, node authentication), each
        hospital's node registered and its SuperNode started, ``flwr run`` with ``values``; waits
        until the ServerApp's ``events_file`` says finished or failed. Returns ``flwr run``'s log tail."""
        self.superlink()
        self.register(hospitals)
        for h in hospitals:
            self.supernode(h, node_config=node_configs[h])
        self.flwr_run(values)
        self.wait(lambda: any(e["event"] in ("finished", "failed") for e in events(events_file)),
                  what="the federation to finish", spare=60, procs=self.named("superlink", "flwr-run"))
        return self.log_tail("flwr-run")

    def log_tail(self, name: str, chars: int = 4000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def close(self) -> None:
        """SIGKILL every process and all below it (the SuperExec and its ServerApps first), then reap."""
        for _, p in self.procs:
            for pid in descendants(p.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for _, p in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        for _, p in self.procs:
            p.wait(timeout=10)


@contextlib.contextmanager
def flower_processes(tmp: Path, *, federation_id: str, hospitals: Sequence[str], budget: float,
                     pythonpath: Sequence[Path | str] = (APP,),
                     env: Mapping[str, str] | None = None) -> Iterator[FlowerProcesses]:
    """Keys, ``FLWR_HOME`` and the environment of one loopback federation; kills everything on exit.

    ``budget``: seconds every wait of the yielded :class:`FlowerProcesses` counts against.
    ``pythonpath``: what the SuperNodes import (the app, a test's participant factory).
    """
    from clinograph.secure.transport.flower.keyset import init_keyset

    shadowing = [str(p) for p in pythonpath if (Path(p) / "clinograph").is_dir() and Path(p) != APP]
    assert not shadowing, (f"pythonpath {shadowing} holds a clinograph/ folder (tests/ does: tests/clinograph/core): "
                           "it would shadow the package's modules in the SuperNodes, which then exit at import")
    from listen_port import reserve_port

    started = time.monotonic()
    port = reserve_port()
    keys = init_keyset(tmp / "keys", federation_id=federation_id, hospitals=list(hospitals),
                       superlink_hosts=["127.0.0.1", "localhost"], superlink_port=port)
    flwr_home = tmp / "flwr"
    flwr_home.mkdir()
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\naddress = "127.0.0.1:{port}"\n'
        f'root-certificates = "{keys.superlink_dir / "ca.pem"}"\n')
    environ = {**os.environ, "FLWR_HOME": str(flwr_home), "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
               "PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath), "FLWR_TELEMETRY_ENABLED": "0",
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(env or {})}  # hospitals train at once on 2 cores
    fp = FlowerProcesses(tmp=tmp, keys=keys, port=port, env=environ, started=started, budget=budget)
    try:
        yield fp
    finally:
        fp.close()


STAND_IN_PYPROJECT = """
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "stand-in-app"
version = "0.1.0"
license = "Apache-2.0"
dependencies = ["flwr>=1.41,<1.42"]

[tool.hatch.build.targets.wheel]
packages = ["stand_in"]

[tool.flwr.app]
publisher = "clinograph-tests"

[tool.flwr.app.components]
serverapp = "stand_in:app"
clientapp = "stand_in:client"

[tool.flwr.app.config]
"""


def stand_in_app(folder: Path, *, code: str, config: str) -> Path:
    """A small Flower app (package ``stand_in`` holding ``code``; ``config``: its
    ``[tool.flwr.app.config]`` lines) for tests that need a ServerApp/ClientApp of their own."""
    import textwrap

    (folder / "stand_in").mkdir(parents=True)
    (folder / "stand_in" / "__init__.py").write_text(textwrap.dedent(code))
    (folder / "pyproject.toml").write_text(STAND_IN_PYPROJECT + textwrap.dedent(config).lstrip("\n"))
    return folder
