"""`clinograph run` against a real SuperLink (TLS + SuperNode authentication) on loopback.

* Clinograph's ServerApp raising (server.toml runs another federation than the federation file
  enrols: a ConfigError before any hospital is greeted, so no SuperNode is needed): exit 1 and
  the ServerApp's reason on one line -- where ``flwr run --stream`` alone exits 0.
* A completed run: a stand-in ServerApp (a Flower app written by the test, no hospitals) that
  writes the events of a completed run and returns; Flower reports it ``finished:completed``
  and the command exits 0.
* A killed ServerApp: the stand-in opens a round and waits; the test SIGKILLs its
  ``flwr-serverapp`` process; the command exits 4 (lost) and names the last event. (A real completed federation takes minutes on two cores:
  tests/integration/test_flower_deployment.py.)

Every wait is bounded; the SuperLink runs in its own process group and is killed in ``finally``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "secure" / "transport"))
from flower_helpers import write_server_files  # noqa: E402
from flower_processes import APP, BIN, flower_processes, serverapp_pids, stand_in_app, wait  # noqa: E402
from flower_processes import events as _events  # noqa: E402


@contextlib.contextmanager
def _superlink(tmp_path):
    """A SuperLink with TLS and node auth on a free loopback port; yields (env for flwr, keys, its process)."""
    with flower_processes(tmp_path, federation_id="fed-loopback", hospitals=["h1", "h2"], budget=300.0,
                          pythonpath=[]) as fp:
        yield fp.env, fp.keys, fp.superlink()


def _clinograph_run(env, tmp_path, app: Path, run_config: str, events: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "clinograph"), "run", str(app), "loopback", "--run-config", run_config,
                           "--events-file", str(events), "--check-every", "5"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=150)


@pytest.mark.slow
def test_a_serverapp_that_raises_makes_clinograph_run_exit_1_with_its_reason(tmp_path):
    server_toml = write_server_files(tmp_path / "server", federation_id="fed-elsewhere")
    events = tmp_path / "events.jsonl"
    with _superlink(tmp_path) as (env, keys, _):
        link = keys.superlink_dir
        run_config = " ".join([f"server-config='{server_toml}'", f"federation-file='{keys.federation_file}'",
                               f"server-key='{link / 'server.ed25519.pem'}'", "min-nodes=0", "wait-timeout=1.0"])
        done = _clinograph_run(env, tmp_path, APP, run_config, events)
    assert done.returncode == 1, (done.stdout + done.stderr)[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("run ") and " failed: ConfigError: server.toml runs federation 'fed-elsewhere'" in last
    assert "Traceback" not in done.stderr
    assert "ERROR clinograph: run failed: ConfigError" in done.stdout  # the stream is shown
    assert [e["event"] for e in _events(events)] == ["failed"]


STAND_IN = '''
    """A stand-in ServerApp: the events of a completed two-round run, no hospitals."""
    import json, time
    from flwr.app import Context
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp

    app = ServerApp()
    client = ClientApp()

    def _write(path, kind, **data):
        with open(path, "a") as fh:
            fh.write(json.dumps({"t": time.time(), "event": kind, **data}) + "\\n")

    @app.main()
    def _main(grid: Grid, context: Context) -> None:
        path = context.run_config["events-file"]
        _write(path, "started")
        if context.run_config["hang"]:  # a round opens, then the ServerApp waits to be killed
            _write(path, "round_opened", round=0, participants=[])
            time.sleep(300)
        _write(path, "run_ended", status="completed", reason="all 2 planned", rounds_completed=2, rounds_planned=2)
        _write(path, "finished", rounds=2)
        print("stand-in ServerApp: done", flush=True)
'''


APP_CONFIG = """
events-file = ""
hang = false
"""


def _stand_in_app(tmp_path) -> Path:
    return stand_in_app(tmp_path / "app", code=STAND_IN, config=APP_CONFIG)


@pytest.mark.slow
def test_a_completed_run_makes_clinograph_run_exit_0(tmp_path):
    app = _stand_in_app(tmp_path)
    events = tmp_path / "events.jsonl"
    with _superlink(tmp_path) as (env, _, _):
        done = _clinograph_run(env, tmp_path, app, "hang=false", events)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert done.stderr.strip().splitlines()[-1].endswith(" completed: 2 of 2 round(s)")
    assert "stand-in ServerApp: done" in done.stdout


@pytest.mark.slow
def test_a_killed_serverapp_makes_clinograph_run_exit_4(tmp_path):
    app = _stand_in_app(tmp_path)
    events = tmp_path / "events.jsonl"
    with _superlink(tmp_path) as (env, _, superlink):
        cmd = subprocess.Popen([str(BIN / "clinograph"), "run", str(app), "loopback", "--run-config", "hang=true",
                                "--events-file", str(events), "--check-every", "2"],
                               env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait(lambda: any(e["event"] == "round_opened" for e in _events(events)), timeout=90,
                 what="the stand-in ServerApp to open a round", procs=[("clinograph run", cmd)])
            pids = serverapp_pids(superlink.pid)
            assert pids, "no flwr-serverapp process below the SuperLink"
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            out, err = cmd.communicate(timeout=150)
        finally:
            if cmd.poll() is None:
                cmd.kill()
                cmd.wait()
    assert cmd.returncode == 4, (out + err)[-3000:]
    last = err.strip().splitlines()[-1]
    assert " lost: " in last and "(round_opened, round 0)" in last, last
