"""``clinograph run APP SUPERLINK``: ``flwr run --stream`` with an exit status an operator can script.

``flwr run --stream`` exits 0 whatever became of the run. This command starts it, shows its
stream line by line, then decides the outcome from the ServerApp's progress events (when the
events file is readable here: ``--events-file``, passed to the run as its ``events-file``) and
from Flower's own status of the run (``flwr ls --run-id N``); the exit codes are in
:mod:`.run_outcome`. While the stream runs, Flower is asked every ``--check-every`` seconds;
once Flower reports the run finished the stream gets a short grace and is then closed, so a
ServerApp that died without a word does not leave the command waiting.
"""

from __future__ import annotations

import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Annotated

import typer

from .run_outcome import LOST, decide, flower_status, read_events, run_id_from, unfinished_runs

_END = object()
GRACE_S = 15.0  # seconds the stream gets to end by itself once Flower reports the run finished
#: a run of this app still going before a new one starts is asked about again this often, this many
#: seconds apart, before it is refused: one that just ended (the previous `clinograph run` returned
#: on the ServerApp's `finished` event) is marked finished by Flower a moment later
SETTLE_TRIES, SETTLE_PAUSE = 5, 2.0


def _flwr(explicit: Path | None) -> str:
    from clinograph.core.errors import ConfigError

    if explicit is not None:
        if not explicit.is_file():
            raise ConfigError(f"--flwr {explicit} is not a file; give the path of the `flwr` command.")
        return str(explicit.resolve())  # "./flwr" is "flwr" as a str: a search of PATH
    beside = Path(sys.executable).parent / "flwr"
    found = str(beside) if beside.is_file() else shutil.which("flwr")
    if found is None:
        raise ConfigError("The `flwr` command is not installed here (pip install 'clinograph[server]' installs "
                          "Flower), or pass its path with --flwr.")
    return found


def ask_flower(flwr: str, superlink: str, run_id: int) -> str | None:
    """Flower's status of ``run_id`` (``flwr ls --run-id N --format json``), None if it cannot say."""
    try:
        done = subprocess.run([flwr, "ls", superlink, "--run-id", str(run_id), "--format", "json"],  # noqa: S603
                              capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = done.stdout
    return flower_status(out[out.find("{"):] if "{" in out else out, run_id=run_id)


def settled_status(flwr: str, superlink: str, run_id: int, *, wait: bool, tries: int = 6,
                   pause: float = 2.0) -> str | None:
    """Flower's status once the stream ended; with ``wait``, asked again for a few seconds while it
    still says the run is going (Flower marks a run finished a moment after its log ends)."""
    status = ask_flower(flwr, superlink, run_id)
    for _ in range(tries if wait else 0):
        if status is None or status.startswith("finished"):
            break
        time.sleep(pause)
        status = ask_flower(flwr, superlink, run_id)
    return status


def app_fab_id(app_dir: str) -> str | None:
    """``publisher/name`` of the Flower app folder ``app_dir`` (what ``flwr ls`` calls its fab-id),
    None if it is not a readable app folder (an app id, say)."""
    import tomllib

    try:
        with (Path(app_dir) / "pyproject.toml").open("rb") as fh:
            doc = tomllib.load(fh)
        return f"{doc['tool']['flwr']['app']['publisher']}/{doc['project']['name']}"
    except (OSError, ValueError, KeyError, TypeError):
        return None


def app_config_keys(app_dir: str) -> list[str] | None:
    """The run config keys the Flower app folder ``app_dir`` declares (``[tool.flwr.app.config]``,
    nested tables as ``a.b``), None if it is not a readable app folder (an app id, say)."""
    import tomllib

    try:
        with (Path(app_dir) / "pyproject.toml").open("rb") as fh:
            table = tomllib.load(fh)["tool"]["flwr"]["app"].get("config", {})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None

    def flat(t: dict, prefix: str = "") -> list[str]:
        return [k for key, v in t.items()
                for k in (flat(v, f"{prefix}{key}.") if isinstance(v, dict) else [f"{prefix}{key}"])]

    return flat(table) if isinstance(table, dict) else None


def unknown_keys(run_config: list[str], app_dir: str) -> list[str]:
    """The ``--run-config`` keys the app does not declare: Flower refuses such a run with only
    "Invalid run configuration." (flwr 1.41), naming no key. Empty when the app folder cannot be
    read or Flower cannot parse the values (``flwr run`` then says what is wrong)."""
    from flwr.common.config import parse_config_args

    declared = app_config_keys(app_dir)
    if declared is None:
        return []
    try:
        values = parse_config_args(list(run_config))
    except Exception:  # noqa: BLE001 -- flwr run parses it again and says what is wrong
        return []
    return [k for k in values if k not in declared]


def refuse_unknown_keys(unknown: list[str], app_dir: str) -> None:
    """A ConfigError naming each unknown key, its nearest declared key, and where keys are declared."""
    import difflib

    from clinograph.core.errors import ConfigError

    if not unknown:
        return
    declared = app_config_keys(app_dir) or []
    named = "; ".join(f"{k!r}" + (f" (did you mean {near[0]!r}?)" if (near := difflib.get_close_matches(
        k, declared, n=1)) else "") for k in unknown)
    raise ConfigError(f"--run-config {named}: not a run config key of the app {app_dir} (Flower would refuse the "
                      f"run as 'Invalid run configuration.'). Its keys ([tool.flwr.app.config] of "
                      f"{Path(app_dir) / 'pyproject.toml'}): {', '.join(declared)}. Settings of server.toml "
                      "(audit_dir, secure_mode, strategy ...) go in that file, passed as server-config.")


#: run config keys that are paths the ServerApp opens on the SuperLink machine
PATH_KEYS = ("server-config", "federation-file", "server-key", "journal", "events-file")


def relative_paths(run_config: list[str]) -> list[str]:
    """The ``--run-config`` path values (:data:`PATH_KEYS`) that are relative: the ServerApp opens
    them from its own working directory on the SuperLink machine, not this command's. Values
    Flower cannot parse are left to ``flwr run`` to refuse."""
    from flwr.common.config import parse_config_args

    try:
        values = parse_config_args(list(run_config))
    except Exception:  # noqa: BLE001 -- flwr run parses it again and says what is wrong
        return []
    return [f"{k}={values[k]!r}" for k in PATH_KEYS
            if isinstance(values.get(k), str) and values[k] and not Path(values[k]).is_absolute()]


def previous_runs(flwr: str, superlink: str, app_dir: str) -> list[tuple[int, str]]:
    """This app's runs the SuperLink still lists as not finished (``flwr ls --format json``);
    empty if Flower cannot be asked (the run itself then says what is wrong)."""
    try:
        done = subprocess.run([flwr, "ls", superlink, "--format", "json"],  # noqa: S603
                              capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    out = done.stdout
    return unfinished_runs(out[out.find("{"):] if "{" in out else out, fab_id=app_fab_id(app_dir))


def refuse_or_stop(previous: list[tuple[int, str]], *, flwr: str, superlink: str, stop: bool) -> None:
    """A run of this app still going at the SuperLink -- most often one whose ServerApp was killed
    and not stopped (``flwr stop``): the SuperLink keeps it ``running`` until it misses the dead
    ServerApp's heartbeats (about a minute), and a SuperNode fetching one of its messages keeps
    the new run's greeting waiting with it (docs/deployment.md, "Crash and resume"). Refused, by
    id, unless ``stop``: then each is stopped first."""
    from clinograph.core.errors import ConfigError

    if not previous:
        return
    named = ", ".join(f"run {rid} ({status})" for rid, status in previous)
    if not stop:
        stops = "; ".join(f"`flwr stop {rid} {superlink}`" for rid, _ in previous)
        raise ConfigError(
            f"{named} of this app is still going at the SuperLink {superlink}; a new run would compete with it "
            "(after a killed ServerApp, its hospitals' greetings wait about a minute for the dead run). If its "
            f"ServerApp was killed or you mean to restart it, stop it first: {stops}, or pass --stop-previous "
            "(docs/deployment.md, 'Crash and resume'); if it is alive, let it end.")
    for rid, status in previous:
        try:
            done = subprocess.run([flwr, "stop", str(rid), superlink],  # noqa: S603
                                  capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"`flwr stop {rid} {superlink}` could not run ({type(exc).__name__}); stop run "
                              f"{rid} by hand, then start again.") from None
        if done.returncode != 0:
            said = " ".join((done.stdout + done.stderr).split())[-300:]
            raise ConfigError(f"`flwr stop {rid} {superlink}` failed (exit {done.returncode}): {said}; stop run "
                              f"{rid} by hand, then start again.")
        typer.echo(f"stopped run {rid} ({status} at the SuperLink) before starting this one (--stop-previous)",
                   err=True)


class ErrorHint:
    """The stream's last error line, for the one-line reason: the ServerApp's own failure line
    outranks Flower's, and a Flower error box (``╭─ Error ─╮``, ``│ text │``, ``╰─╯``) gives
    its text, not its top border. The box itself is not shown (:meth:`feed` says so): its text
    is the reason's, or is shown once as one line before it (``boxes``)."""

    def __init__(self) -> None:
        self.text = ""
        self.boxes: list[str] = []  # each Flower error box's text, one line each
        self._box: list[str] | None = None

    def feed(self, line: str) -> bool:
        """Read one line of the stream; False for a line of a Flower error box (not to be shown)."""
        s = line.strip()
        if self._box is not None:
            if s.startswith("│"):
                self._box.append(s.strip("│").strip())
                return False
            box, self._box = " ".join(" ".join(self._box).split()), None
            if box:
                self.boxes.append(box)
                self._take(box)
            if s.startswith("╰"):
                return False
        if s.startswith("╭") and "Error" in s:
            self._box = []
            return False
        if "clinograph: run failed" in line:
            self.text = s[-300:]
        elif "Error" in line or "ERROR" in line:
            self._take(s)
        return True

    def close(self) -> None:
        """The stream ended: a box it left open still counts."""
        if self._box is not None:
            self.feed("╰")

    def _take(self, s: str) -> None:
        if "clinograph:" not in self.text:
            self.text = s[-300:]


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(_END)


def run(app_dir: Annotated[str, typer.Argument(metavar="APP", help="The Flower app (folder or app id), as for "
                                                "`flwr run`.")],
        superlink: Annotated[str, typer.Argument(metavar="SUPERLINK", help="The SuperLink connection named in "
                                                 "Flower's config.toml, as for `flwr run`.")],
        run_config: Annotated[list[str] | None, typer.Option(
            "--run-config", "-c", help="Passed to `flwr run --run-config` (repeatable).")] = None,
        events_file: Annotated[Path | None, typer.Option(
            help="The run's events file (JSON lines); set as the run's events-file. Give it when this "
                 "machine runs the SuperLink (or shares its disk): the outcome then names the reason.")] = None,
        check_every: Annotated[float, typer.Option(min=1.0, help="Seconds between asking Flower for the run's "
                                                   "status while the stream runs.")] = 30.0,
        flwr: Annotated[Path | None, typer.Option(help="Path of the `flwr` command (default: the one "
                                                  "installed with Clinograph).")] = None,
        stop_previous: Annotated[bool, typer.Option(
            "--stop-previous", help="Stop this app's runs still going at the SuperLink (`flwr stop`) before "
                                    "starting: restarting a killed run. Without it such a run is refused.")] = False,
        ) -> None:
    """Start a federation run on a SuperLink, stream its log, and exit 0 only if it completed or
    ended as planned (1: failed or stopped; 4: lost -- no outcome), with a one-line reason."""
    from clinograph.core.errors import ConfigError

    exe = _flwr(flwr)
    relative = relative_paths(run_config or [])
    if relative:
        raise ConfigError(f"--run-config {', '.join(relative)}: relative path(s). The ServerApp opens them on the "
                          "SuperLink machine from its own working directory, not this command's; give absolute "
                          "paths (e.g. server-config='/srv/clinograph/server/server.toml').")
    refuse_unknown_keys(unknown_keys(run_config or [], app_dir), app_dir)
    cmd = [exe, "run", app_dir, superlink, "--stream"]
    for rc in run_config or []:
        cmd += ["--run-config", rc]
    offset = 0
    if events_file is not None:
        events_file = events_file.resolve()
        if "'" in str(events_file):
            raise ConfigError(f"--events-file {events_file} contains a single quote, which the run config "
                              "(TOML) cannot carry here; choose a path without one.")
        offset = events_file.stat().st_size if events_file.is_file() else 0
        cmd += ["--run-config", f"events-file='{events_file}'"]
    previous = previous_runs(exe, superlink, app_dir)
    for _ in range(SETTLE_TRIES if previous and not stop_previous else 0):
        time.sleep(SETTLE_PAUSE)
        still = dict(previous_runs(exe, superlink, app_dir))
        previous = [(rid, still[rid]) for rid, _ in previous if rid in still]
        if not previous:
            break
    refuse_or_stop(previous, flwr=exe, superlink=superlink, stop=stop_previous)
    run_id, hint, status = None, ErrorHint(), None
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,  # noqa: S603
                                errors="replace", bufsize=1)
    except OSError as exc:
        raise ConfigError(f"Cannot start {exe}: {exc.strerror or type(exc).__name__}. Give the path of a working "
                          "`flwr` command with --flwr.") from None
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    try:
        last_check, finished_at = time.monotonic(), None
        while True:
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                line = None
            if line is _END:
                break
            if isinstance(line, str):
                if hint.feed(line):
                    typer.echo(line)
                run_id = run_id if run_id is not None else run_id_from(line)
            now = time.monotonic()
            if finished_at is not None and now - finished_at > GRACE_S:
                break
            if run_id is not None and finished_at is None and now - last_check >= check_every:
                last_check = now
                status = ask_flower(exe, superlink, run_id)
                if status is not None and status.startswith("finished"):
                    finished_at = now
    except KeyboardInterrupt:
        if run_id is not None:
            typer.echo(f"interrupted: run {run_id} goes on at the SuperLink; stop it with `flwr stop {run_id} "
                       f"{superlink}`", err=True)
        raise
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    hint.close()
    events = read_events(events_file, offset=offset) if events_file is not None else []
    if run_id is not None:
        status = settled_status(exe, superlink, run_id, wait=not any(e["event"] in ("finished", "failed")
                                                                      for e in events))
    reason = hint.text
    if run_id is None and proc.returncode not in (0, None):
        reason = reason or f"flwr run exited with {proc.returncode}"
    outcome = decide(events=events, status=status, run_id=run_id, hint=reason)
    for box in hint.boxes:  # Flower's error boxes, not shown in the stream: one line each, unless the reason says it
        if " ".join(box.split()) not in " ".join(outcome.reason.split()):
            typer.echo(f"flwr: {box}", err=True)
    color = "green" if outcome.code == 0 else ("yellow" if outcome.code == LOST else "red")
    typer.secho(outcome.reason, err=True, fg=color)
    raise typer.Exit(outcome.code)
