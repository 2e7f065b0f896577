"""A Flower run's outcome as an exit status (``clinograph run``): pure functions, no processes.

The evidence, strongest first: the ServerApp's progress events (``events-file``: ``run_ended``
per candidate model, ``failed``, ``finished``), then Flower's own status of the run
(``flwr ls --run-id N --format json``: ``finished:completed``, ``finished:failed``,
``finished:stopped``, ``running``...), then whether ``flwr run`` started a run at all.

=====  ================================================================================
exit   meaning
=====  ================================================================================
0      the run completed, or ended as planned (``run_ended`` status ``completed`` or
       ``too_few_hospitals``: the hospitals' privacy budgets are spent)
1      the run failed (a ``failed`` event, a ``run_ended`` of another status, Flower's
       ``finished:failed``) or was stopped (``finished:stopped``), or no run started
4      the run was lost: the ServerApp wrote progress but no outcome and Flower reports
       ``finished:failed`` (it was killed or died), or the log stream ended with no outcome
       while Flower still reports the run going or cannot be asked (a killed ``flwr run``)
=====  ================================================================================

(2 stays the CLI's "bad input or config" and 3 its "internal error", as for every command.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OK, FAILED, LOST = 0, 1, 4
PLANNED_ENDS = ("completed", "too_few_hospitals")
_RUN_ID = re.compile(r"Successfully started run (\d+)")


@dataclass(frozen=True)
class Outcome:
    """The exit status and the one-line reason printed with it."""

    code: int
    reason: str


#: what a lost run's reason adds: how to go on (docs/deployment.md, "Crash and resume")
RESUME = ("to go on, start the same run again with the same run config (with a `journal` it resumes from "
          "its last closed round: docs/deployment.md, 'Crash and resume')")


def run_id_from(line: str) -> int | None:
    """The run id in ``flwr run``'s "Successfully started run N" line, else None."""
    m = _RUN_ID.search(line)
    return int(m.group(1)) if m else None


def read_events(path: Path, *, offset: int = 0) -> list[dict[str, Any]]:
    """The JSON-line events written to ``path`` from byte ``offset`` on (the file is appended to by
    every run that names it); a missing file is no events; a torn or foreign line is skipped."""
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            raw = fh.read()
    except FileNotFoundError:
        return []
    out = []
    for line in raw.decode("utf-8", errors="replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and isinstance(item.get("event"), str):
            out.append(item)
    return out


def flower_status(ls_json: str, *, run_id: int) -> str | None:
    """Run ``run_id``'s status in ``flwr ls --run-id N --format json`` output, else None."""
    try:
        doc = json.loads(ls_json)
    except ValueError:
        return None
    for run in doc.get("runs", []) if isinstance(doc, dict) else []:
        if isinstance(run, dict) and str(run.get("run-id")) == str(run_id):
            status = run.get("status")
            return status if isinstance(status, str) else None
    return None


def unfinished_runs(ls_json: str, *, fab_id: str | None = None) -> list[tuple[int, str]]:
    """The runs ``flwr ls --format json`` lists as not finished (pending, starting, running), as
    (run id, status), oldest first; with ``fab_id`` (``publisher/name``) only that app's runs."""
    try:
        doc = json.loads(ls_json)
    except ValueError:
        return []
    out = []
    for run in doc.get("runs", []) if isinstance(doc, dict) else []:
        if not isinstance(run, dict) or not isinstance(run.get("status"), str):
            continue
        if run["status"].startswith("finished") or (fab_id is not None and run.get("fab-id") not in (fab_id, None)):
            continue
        try:
            out.append((int(run["run-id"]), run["status"]))
        except (KeyError, TypeError, ValueError):
            continue
    return sorted(out)


def decide(*, events: Sequence[Mapping[str, Any]], status: str | None, run_id: int | None,
           hint: str = "") -> Outcome:
    """The run's outcome from its ``events``, Flower's ``status`` and its ``run_id`` (None: ``flwr
    run`` started none). ``hint``: the stream's last error line, named when nothing better is known.
    The reason is one printable line (``clinograph.core.logging.printable``): it may quote a
    hospital's refusal."""
    from clinograph.core.logging import printable

    out = _decide(events=events, status=status, run_id=run_id, hint=hint)
    return Outcome(out.code, printable(out.reason))


def _decide(*, events: Sequence[Mapping[str, Any]], status: str | None, run_id: int | None, hint: str) -> Outcome:
    where = f"run {run_id}"
    see = f" (see `flwr log {run_id}`)" if run_id is not None else ""
    extra = f"; last error in the log: {hint}" if hint else ""
    if run_id is None:
        return Outcome(FAILED, "flwr run started no run" + (f": {hint}" if hint else " (see its output above)"))
    failed = [e for e in events if e.get("event") == "failed"]
    ended = [e for e in events if e.get("event") == "run_ended"]
    bad = [e for e in ended if e.get("status") not in PLANNED_ENDS]
    if failed:
        return Outcome(FAILED, f"{where} failed: {failed[-1].get('reason')}{see}")
    if bad:
        return Outcome(FAILED, f"{where} ended {bad[-1].get('status')}: {bad[-1].get('reason')}{see}")
    if status == "finished:failed" and events and not any(e.get("event") == "finished" for e in events):
        last = events[-1]
        at = f"{last.get('event')}" + (f", round {last['round']}" if "round" in last else "")
        return Outcome(LOST, f"{where} lost: the ServerApp stopped with no outcome after its last progress event "
                             f"({at}) and Flower reports finished:failed -- it was killed or died{extra}{see}; "
                             f"{RESUME}")
    if status == "finished:failed":
        return Outcome(FAILED, f"{where} failed (Flower: finished:failed){extra}{see}")
    if status == "finished:stopped":
        return Outcome(FAILED, f"{where} was stopped (Flower: finished:stopped){see}")
    if any(e.get("event") == "finished" for e in events):
        planned = [e for e in ended if e.get("status") == "too_few_hospitals"]
        if planned:
            return Outcome(OK, f"{where} ended as planned (too_few_hospitals) after "
                               f"{planned[-1].get('rounds_completed')} round(s): {planned[-1].get('reason')}")
        last = ended[-1] if ended else {}
        return Outcome(OK, f"{where} completed: {last.get('rounds_completed', '?')} of "
                           f"{last.get('rounds_planned', '?')} round(s)")
    if status == "finished:completed":
        return Outcome(OK, f"{where} completed (Flower: finished:completed; no progress events read)")
    if status is None:
        return Outcome(LOST, f"{where} lost: the log stream ended with no outcome in the events and Flower could "
                             f"not be asked (check `flwr ls --run-id {run_id}`){extra}")
    return Outcome(LOST, f"{where} lost: the log stream ended while Flower reports it {status} and no progress "
                         f"says it ended -- the ServerApp or flwr run may have been killed (check `flwr ls --run-id "
                         f"{run_id}`; stop it with `flwr stop {run_id}`){extra}; if it was killed, stop it first, "
                         f"then {RESUME}")
