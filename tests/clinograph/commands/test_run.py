"""`clinograph run` before anything starts: a run of this app still going at the SuperLink, relative
paths in the run config, a relative --flwr (stand-in `flwr` scripts, no Flower process)."""

from __future__ import annotations

import json
import sys
import textwrap

from typer.testing import CliRunner

from clinograph.cli import app

# -- a run of this app still going at the SuperLink (a killed ServerApp not stopped) -------------
STALE_FLWR = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    here = Path(__file__).parent
    args = sys.argv[1:]
    with open(here / "calls.jsonl", "a") as fh:
        fh.write(json.dumps(args) + "\\n")
    if args[0] == "ls" and "--run-id" not in args:
        stopped = (here / "stopped").exists()
        print("Listing all runs...")
        print(json.dumps({"success": True, "runs": [
            {"run-id": "5", "fab-id": "clinograph/clinograph-flower-app", "status": "finished:stopped" if stopped
             else "running"},
            {"run-id": "6", "fab-id": "someone/another-app", "status": "running"},
            {"run-id": "4", "fab-id": "clinograph/clinograph-flower-app", "status": "finished:completed"}]}))
        sys.exit(0)
    if args[0] == "stop":
        (here / "stopped").write_text("")
        sys.exit(0)
    if args[0] == "ls":
        print(json.dumps({"success": True, "runs": [{"run-id": "77", "status": "finished:completed"}]}))
        sys.exit(0)
    print("Successfully started run 77")
    sys.exit(0)
''')


def _stale(tmp_path, *extra, monkeypatch=None):
    from clinograph.commands import run as run_module
    from clinograph.commands.run import app_fab_id

    if monkeypatch is not None:
        monkeypatch.setattr(run_module, "SETTLE_PAUSE", 0.0)

    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "pyproject.toml").write_text('[project]\nname = "clinograph-flower-app"\n\n[tool.flwr.app]\n'
                                            'publisher = "clinograph"\n')
    assert app_fab_id(str(app_dir)) == "clinograph/clinograph-flower-app" and app_fab_id(str(tmp_path)) is None
    flwr = tmp_path / "flwr"
    flwr.write_text(f"#!{sys.executable}\n" + STALE_FLWR)
    flwr.chmod(0o755)
    res = CliRunner().invoke(app, ["run", str(app_dir), "loopback", "--flwr", str(flwr), *extra])
    calls = [json.loads(x)[0] for x in (tmp_path / "calls.jsonl").read_text().splitlines()]
    return res, calls


def test_a_run_of_this_app_still_going_is_refused_by_id_with_the_fix(tmp_path, monkeypatch):
    """Restarting a killed run without `flwr stop`: the new run's greetings would wait ~1 min for
    the dead one (docs/deployment.md, 'Crash and resume'); refused before anything starts, after
    asking again (a run that just ended is marked finished a moment later)."""
    res, calls = _stale(tmp_path, monkeypatch=monkeypatch)
    said = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert "run 5 (running) of this app is still going at the SuperLink loopback" in said
    assert "`flwr stop 5 loopback`" in said and "--stop-previous" in said and "Traceback" not in said
    assert "run 6" not in said  # another app's run is not ours to judge
    assert calls == ["ls"] * 6  # asked again 5 times; nothing started, nothing stopped


def test_stop_previous_stops_it_then_starts_the_run(tmp_path):
    res, calls = _stale(tmp_path, "--stop-previous")
    assert res.exit_code == 0, res.output
    assert "stopped run 5 (running at the SuperLink) before starting this one" in res.output
    assert calls[:3] == ["ls", "stop", "run"]


def test_unfinished_runs_reads_flowers_list():
    from clinograph.commands.run_outcome import unfinished_runs

    doc = json.dumps({"runs": [{"run-id": "9", "status": "pending", "fab-id": "a/b"},
                               {"run-id": "3", "status": "starting", "fab-id": "a/b"},
                               {"run-id": "2", "status": "finished:failed", "fab-id": "a/b"},
                               {"run-id": "8", "status": "running", "fab-id": "c/d"}, {"run-id": "x", "status": "running"}]})
    assert unfinished_runs(doc, fab_id="a/b") == [(3, "starting"), (9, "pending")]
    assert unfinished_runs(doc) == [(3, "starting"), (8, "running"), (9, "pending")]
    assert unfinished_runs("not json") == [] == unfinished_runs(json.dumps([1]))


def test_relative_paths_in_the_run_config_are_refused_before_anything_starts(tmp_path):
    """A path relative to the operator's folder reached the ServerApp, which opens it from its
    own working directory on the SuperLink machine."""
    flwr = tmp_path / "flwr"
    flwr.write_text("#!/bin/sh\necho called >> \"$(dirname \"$0\")/called\"\nexit 0\n")
    flwr.chmod(0o755)
    res = CliRunner().invoke(app, ["run", "app", "loopback", "--flwr", str(flwr), "--run-config",
                                   "server-config='server/server.toml' rounds=2 journal=''",
                                   "--run-config", f"federation-file='{tmp_path}/federation.toml' server-key='k.pem'"])
    said = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert "server-config='server/server.toml', server-key='k.pem': relative path(s)" in said and "absolute" in said
    assert not (tmp_path / "called").exists()


def test_a_run_that_ends_while_asked_again_is_no_reason_to_refuse(tmp_path, monkeypatch):
    """The previous `clinograph run` returned on the ServerApp's `finished` event; Flower marks
    the run finished a moment later: the next run starts once it does."""
    (tmp_path / "app").mkdir()
    flwr = tmp_path / "flwr"  # lists run 5 running the first time it is asked, finished after
    flwr.write_text(f"#!{sys.executable}\n" + STALE_FLWR.replace('stopped = (here / "stopped").exists()',
                                                              'stopped = (here / "asked").exists()\n'
                                                              '    (here / "asked").write_text("")'))
    (tmp_path / "app" / "pyproject.toml").write_text('[project]\nname = "clinograph-flower-app"\n\n[tool.flwr.app]\n'
                                                     'publisher = "clinograph"\n')
    flwr.chmod(0o755)
    from clinograph.commands import run as run_module

    monkeypatch.setattr(run_module, "SETTLE_PAUSE", 0.0)
    res = CliRunner().invoke(app, ["run", str(tmp_path / "app"), "loopback", "--flwr", str(flwr)])
    assert res.exit_code == 0, res.output
    calls = [json.loads(x)[0] for x in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert calls[:3] == ["ls", "ls", "run"]


def test_a_relative_flwr_path_runs_that_file(tmp_path, monkeypatch):
    """`--flwr ./flwr` became "flwr" and was searched on PATH: 'internal error (FileNotFoundError)'."""
    flwr = tmp_path / "flwr"
    flwr.write_text("#!/bin/sh\nif [ \"$1\" = ls ]; then echo '{\"runs\": []}'; exit 0; fi\n"
                    "echo 'Successfully started run 77'\n")
    flwr.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    res = CliRunner().invoke(app, ["run", "app", "loopback", "--flwr", "./flwr"])
    assert "internal error" not in res.output and "run 77" in res.output, res.output
    (tmp_path / "flwr").chmod(0o644)  # a file it cannot execute: said, not an internal error
    res = CliRunner().invoke(app, ["run", "app", "loopback", "--flwr", "./flwr"])
    assert res.exit_code == 2 and f"Cannot start {flwr}" in " ".join(res.output.split()), res.output


def test_a_run_config_key_the_app_does_not_declare_is_refused_by_name(tmp_path):
    """`--run-config "audit-dir='/srv/...'"` (named by the app's own pyproject comment): Flower 1.41
    refused the run with only "Invalid run configuration.", naming no key."""
    flwr = tmp_path / "flwr"
    flwr.write_text("#!/bin/sh\necho called >> \"$(dirname \"$0\")/called\"\nexit 0\n")
    flwr.chmod(0o755)
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "pyproject.toml").write_text('[project]\nname = "a"\n[tool.flwr.app]\npublisher = "p"\n'
                                            '[tool.flwr.app.config]\nrounds = 0\njournal = ""\n'
                                            '[tool.flwr.app.config.nested]\nx = 1\n')
    res = CliRunner().invoke(app, ["run", str(app_dir), "loopback", "--flwr", str(flwr), "--run-config",
                                   "rounds=3 jurnal='/srv/j.sqlite' nested.x=2 audit-dir='/srv/audit'"])
    said = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert "--run-config 'jurnal' (did you mean 'journal'?); 'audit-dir': not a run config key" in said
    assert "Its keys ([tool.flwr.app.config] of" in said and "rounds, journal, nested.x" in said
    assert not (tmp_path / "called").exists()
    res = CliRunner().invoke(app, ["run", str(app_dir), "loopback", "--flwr", str(flwr), "--run-config",
                                   "rounds=3 nested.x=2"])
    assert (tmp_path / "called").exists(), res.output  # declared keys pass
