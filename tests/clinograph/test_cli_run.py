"""`clinograph run APP SUPERLINK`: the run's outcome as an exit status (0 completed or a planned
end, 1 failed or stopped, 4 lost) with a one-line reason, never a traceback.

The outcome logic is tested on events alone; the command end to end against a stand-in `flwr`
(a script that plays `flwr run --stream` and `flwr ls --format json` from a scenario file).
The real-process test is tests/integration/test_cli_run_flower.py."""

from __future__ import annotations

import json
import sys
import textwrap

from typer.testing import CliRunner

from clinograph.cli import app
from clinograph.commands.run_outcome import (
    FAILED,
    LOST,
    OK,
    decide,
    flower_status,
    read_events,
    run_id_from,
)

ENDED = {"event": "run_ended", "status": "completed", "reason": "all 2 planned round(s) ran",
         "rounds_completed": 2, "rounds_planned": 2}
FINISHED = {"event": "finished", "rounds": 2}


def test_a_completed_run_exits_0():
    out = decide(events=[ENDED, FINISHED], status="finished:completed", run_id=7)
    assert out.code == OK and out.reason == "run 7 completed: 2 of 2 round(s)"


def test_a_planned_end_exits_0_with_its_reason():
    planned = {**ENDED, "status": "too_few_hospitals", "rounds_completed": 1, "reason": "budgets spent"}
    out = decide(events=[planned, FINISHED], status="finished:completed", run_id=3)
    assert out.code == OK
    assert out.reason == "run 3 ended as planned (too_few_hospitals) after 1 round(s): budgets spent"


def test_a_failed_event_wins_even_over_a_completed_flower_status():
    out = decide(events=[{"event": "failed", "reason": "ConfigError: server.toml runs federation 'a'"}],
                 status="finished:completed", run_id=9)
    assert out.code == FAILED
    assert out.reason == "run 9 failed: ConfigError: server.toml runs federation 'a' (see `flwr log 9`)"


def test_a_run_ended_of_another_status_is_a_failure():
    out = decide(events=[{**ENDED, "status": "failed", "reason": "round 1 aborted"}, FINISHED], status=None, run_id=2)
    assert out.code == FAILED and out.reason.startswith("run 2 ended failed: round 1 aborted")


def test_flower_alone_decides_when_no_events_are_readable():
    failed = decide(events=[], status="finished:failed", run_id=5, hint="ERROR clinograph: run failed: boom")
    assert failed.code == FAILED and "finished:failed" in failed.reason and "boom" in failed.reason
    assert decide(events=[], status="finished:stopped", run_id=5).code == FAILED
    assert decide(events=[], status="finished:completed", run_id=5).code == OK


def test_a_serverapp_that_died_mid_run_is_lost():
    progress = [{"event": "started"}, {"event": "round_opened", "round": 2}]
    out = decide(events=progress, status="finished:failed", run_id=6)
    assert out.code == LOST
    assert out.reason.startswith("run 6 lost: the ServerApp stopped with no outcome after its last progress event "
                                 "(round_opened, round 2) and Flower reports finished:failed -- it was killed")
    assert out.reason.endswith("start the same run again with the same run config (with a `journal` it resumes "
                               "from its last closed round: docs/deployment.md, 'Crash and resume')")


def test_a_run_with_no_outcome_is_lost():
    running = decide(events=[{"event": "round_opened", "round": 0}], status="running", run_id=4)
    assert running.code == LOST and "Flower reports it running" in running.reason and "flwr stop 4" in running.reason
    assert "stop it first, then to go on, start the same run again" in running.reason
    unknown = decide(events=[], status=None, run_id=4)
    assert unknown.code == LOST and "could not be asked" in unknown.reason


def test_no_run_started_is_a_failure():
    out = decide(events=[], status=None, run_id=None, hint="Connection refused")
    assert out.code == FAILED and out.reason == "flwr run started no run: Connection refused"


def test_parsers():
    assert run_id_from("\x1b[32mSuccessfully started run 8123 in federation x\x1b[0m") == 8123
    assert run_id_from("Loading project configuration...") is None
    ls = json.dumps({"success": True, "runs": [{"run-id": "8123", "status": "finished:failed"}]})
    assert flower_status(ls, run_id=8123) == "finished:failed"
    assert flower_status(ls, run_id=1) is None and flower_status("not json", run_id=1) is None


def test_read_events_from_an_offset_skips_torn_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps({"event": "old"}) + "\n")
    offset = path.stat().st_size
    with path.open("a") as fh:
        fh.write(json.dumps({"event": "started"}) + "\n" + '{"event": "round_op' + "\n[1]\n")
    assert read_events(path, offset=offset) == [{"event": "started"}]
    assert read_events(tmp_path / "missing.jsonl") == []


# -- the command, against a stand-in flwr ---------------------------------------------------
FAKE_FLWR = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    scenario = json.loads(Path(__file__).with_name("scenario.json").read_text())
    args = sys.argv[1:]
    if args[0] == "ls":
        if scenario["status"] is None:
            sys.exit(1)
        print(json.dumps({"success": True, "runs": [{"run-id": "77", "status": scenario["status"]}]}))
        sys.exit(0)
    Path(__file__).with_name("argv.json").write_text(json.dumps(args))
    events = [a.split("=", 1)[1].strip("'") for a in args if a.startswith("events-file=")]
    print("Successfully started run 77")
    for line in scenario["lines"]:
        print(line, flush=True)
    if events:
        with open(events[0], "a") as fh:
            for e in scenario["events"]:
                fh.write(json.dumps(e) + "\\n")
    sys.exit(0)
''')


def _command(tmp_path, *, status, events, lines=("INFO clinograph: round 0 plan: 3 of 3 hospital(s) answered",),
             with_events=True):
    flwr = tmp_path / "flwr"
    flwr.write_text(f"#!{sys.executable}\n" + FAKE_FLWR)
    flwr.chmod(0o755)
    (tmp_path / "scenario.json").write_text(json.dumps({"status": status, "events": events, "lines": list(lines)}))
    args = ["run", "app", "loopback", "--flwr", str(flwr), "--run-config", "rounds=2"]
    if with_events:
        args += ["--events-file", str(tmp_path / "events.jsonl")]
    return CliRunner().invoke(app, args)


def test_the_command_exits_0_on_a_completed_run_and_passes_the_events_file(tmp_path):
    (tmp_path / "events.jsonl").write_text(json.dumps({"event": "failed", "reason": "an earlier run"}) + "\n")
    res = _command(tmp_path, status="finished:completed", events=[{"event": "started"}, ENDED, FINISHED])
    assert res.exit_code == 0, res.output
    assert "round 0 plan: 3 of 3 hospital(s) answered" in res.output  # the stream is shown
    assert res.output.strip().splitlines()[-1] == "run 77 completed: 2 of 2 round(s)"
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[:4] == ["run", "app", "loopback", "--stream"] and "rounds=2" in argv
    assert f"events-file='{tmp_path / 'events.jsonl'}'" in argv


def test_the_command_exits_1_with_the_servers_reason_on_a_failed_run(tmp_path):
    res = _command(tmp_path, status="finished:failed",
                   events=[{"event": "failed", "reason": "ConfigError: server.toml runs federation 'x'"}])
    assert res.exit_code == 1, res.output
    assert res.output.strip().splitlines()[-1] == (
        "run 77 failed: ConfigError: server.toml runs federation 'x' (see `flwr log 77`)")
    assert "Traceback" not in res.output


def test_the_command_exits_4_when_the_run_is_lost(tmp_path):
    res = _command(tmp_path, status=None, events=[{"event": "round_opened", "round": 0}], lines=())
    assert res.exit_code == 4, res.output
    assert "run 77 lost" in res.output.strip().splitlines()[-1]


def test_without_an_events_file_flower_decides(tmp_path):
    res = _command(tmp_path, status="finished:failed", events=[], with_events=False,
                   lines=("ERROR clinograph: run failed: ConfigError: bad id",))
    assert res.exit_code == 1
    assert "finished:failed" in res.output and "ConfigError: bad id" in res.output.strip().splitlines()[-1]


def test_a_missing_flwr_is_a_clean_error(tmp_path):
    res = CliRunner().invoke(app, ["run", "app", "loopback", "--flwr", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "is not a file" in res.output and "Traceback" not in res.output


def test_an_events_file_path_with_a_quote_is_a_clean_error(tmp_path):
    flwr = tmp_path / "flwr"
    flwr.write_text("#!/bin/sh\nexit 0\n")
    res = CliRunner().invoke(app, ["run", "app", "loopback", "--flwr", str(flwr), "--events-file",
                                   str(tmp_path / "it's.jsonl")])
    assert res.exit_code == 2 and "contains a single quote" in res.output


def test_flowers_error_box_gives_the_reason_its_text_not_its_border(tmp_path):
    flwr = tmp_path / "flwr"  # `flwr run` of an app folder without pyproject.toml, as flwr 1.41 says it
    flwr.write_text("#!/bin/sh\nprintf '%s\\n' '╭─ Error ─────────╮' \"│ Failed to load Flower App configuration in │\" "
                    "\"│ '/nonexistent/pyproject.toml'.             │\" '╰─────────────────╯'\nexit 1\n")
    flwr.chmod(0o755)
    res = CliRunner().invoke(app, ["run", "/nonexistent", "loopback", "--flwr", str(flwr)])
    assert res.exit_code == 1, res.output
    assert res.output.strip().splitlines()[-1] == (
        "flwr run started no run: Failed to load Flower App configuration in '/nonexistent/pyproject.toml'.")
    # the operator sees one error, not Flower's box and then the same text again
    assert "╭" not in res.output and "│" not in res.output and res.output.count("Failed to load") == 1


def test_a_flower_error_box_the_reason_does_not_quote_is_shown_once_as_one_line(tmp_path):
    """A run that started, then a Flower error box, then the ServerApp's own failure: the reason is
    the ServerApp's, so the box's text is shown once, as one line, before it."""
    res = _command(tmp_path, status="finished:failed", events=[{"event": "failed", "reason": "ConfigError: x"}],
                   lines=("╭─ Error ───╮", "│ Connection to the  │", "│ SuperLink lost. │", "╰───────────╯"))
    assert res.exit_code == 1, res.output
    lines = res.output.strip().splitlines()
    assert lines[-2:] == ["flwr: Connection to the SuperLink lost.", "run 77 failed: ConfigError: x (see `flwr log 77`)"]
    assert "╭" not in res.output and "│" not in res.output


def test_the_outcome_line_is_one_printable_line_whatever_a_reason_holds():
    """A run's end reason can quote a hospital's refusal: read back from the events file, its ANSI
    escapes, newline or bidi override reached the operator's terminal in the outcome line."""
    ended = {**ENDED, "status": "too_few_hospitals", "reason": "h1: \x1b[32mOK\x1b[0m\nrun 9 completed\u202e"}
    for events in ([ended, FINISHED], [{"event": "failed", "reason": ended["reason"]}]):
        out = decide(events=events, status="finished:completed", run_id=3)
        assert out.reason.isprintable() and "h1: \\x1b[32mOK\\x1b[0m\\nrun 9 completed\\u202e" in out.reason
