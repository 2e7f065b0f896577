"""The ServerApp's account to the operator: each progress event of the run as one log line
(:func:`progress_line`) and, with ``events-file``, as a JSON line (:class:`Events`). Names,
stages, reasons and numbers only -- no data. ``flwr-serverapp`` mirrors the lines into the run's
log (``flwr log``, ``flwr run --stream``)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clinograph.core.logging import printable

from ...runtime.progress import RoundClock, eta_line, stage_line

#: the ServerApp's logger (its lines go to stdout: serverapp._log_to_stdout)
_log = logging.getLogger("clinograph.secure.transport.flower.serverapp")


class Events:
    """The progress sink: JSON lines to ``events-file`` (if set) and one log line per event; each
    ``round_closed`` gets the round's seconds and the run's ETA (:class:`RoundClock`)."""

    def __init__(self, path: str, *, rounds: int):
        self.path = Path(path) if path else None
        self.nodes: dict[str, int] = {}  # hospital -> Flower node id, once greeted
        self.clock = RoundClock(rounds=rounds)
        self.failure_logged = False  # the run's failure has its log line already

    def __call__(self, kind: str, data: Mapping[str, object], *, log: bool = True) -> None:
        data = self.clock.observe(kind, data)
        if self.path is not None:
            with self.path.open("a") as fh:
                fh.write(json.dumps({"t": time.time(), "event": kind, **data}, sort_keys=True) + "\n")
        level, line = progress_line(kind, data, nodes=self.nodes)
        if line and log:
            _log.log(level, "%s", line)


def _who(name: object, nodes: Mapping[str, int]) -> str:
    return f"{name} (node {nodes[str(name)]})" if str(name) in nodes else str(name)


def _names(names: object, nodes: Mapping[str, int]) -> str:
    items = list(names) if isinstance(names, list | tuple) else []
    return ", ".join(_who(n, nodes) for n in items) or "none"


def progress_line(kind: str, data: Mapping[str, Any], *, nodes: Mapping[str, int]) -> tuple[int, str]:
    """The operator's one-line account of a progress event (level, text); text '' = not logged.
    One printable line (:func:`~clinograph.core.logging.printable`): reasons are hospitals' text."""
    level, line = _line(kind, data, nodes=nodes)
    return level, printable(line)


def _line(kind: str, data: Mapping[str, Any], *, nodes: Mapping[str, int]) -> tuple[int, str]:
    r = data.get("round")
    if kind == "started":
        return logging.INFO, f"federation {data.get('federation')!r}, secure mode {data.get('secure_mode')}: started"
    if kind == "greeted":
        mapped = ", ".join(f"{n} = node {i}" for n, i in sorted(dict(data.get("nodes") or {}).items()))
        refused = "; ".join(f"node {k} refused: {v}" for k, v in dict(data.get("refused") or {}).items())
        return logging.INFO, f"greeted hospitals: {mapped or 'none'}" + (f"; {refused}" if refused else "")
    if kind == "ckks_keys":
        return logging.INFO, f"CKKS key ceremony done; key holders: {_names(data.get('holders'), nodes)}"
    if kind == "round_opened":
        return logging.INFO, (f"round {r} ({data.get('secure_mode', '?')}): invited "
                              f"{_names(data.get('participants'), nodes)}")
    if kind == "dropped":
        return logging.WARNING, f"round {r}: {_who(data.get('hospital'), nodes)} dropped: {data.get('reason')}"
    if kind == "refused":
        final = " -- out of the run" if data.get("final") else ""
        return logging.WARNING, (f"round {r}: {_who(data.get('hospital'), nodes)} refused at {data.get('stage')}: "
                                 f"{data.get('reason')}{final}")
    if kind == "round_closed":
        eps = dict(data.get("epsilon") or {})
        eps_text = ", ".join(f"{n} {v['epsilon']:.3g}/{v['budget']:g}" for n, v in sorted(eps.items()))
        scoring = " (scoring round: the last model evaluated, no training)" if data.get("scoring") else ""
        return logging.INFO, (f"round {r} closed{scoring}: contributors {_names(data.get('contributors'), nodes)}; dropped "
                              f"{_names(data.get('dropped'), nodes)}; refused {_names(data.get('refused'), nodes)}"
                              + (f"; ε/budget {eps_text}" if eps_text else "") + eta_line(data))
    if kind == "stage_progress":
        return logging.INFO, stage_line(data)
    if kind == "run_started":
        return logging.INFO, (f"candidate model {data.get('candidate')!r} ({int(data.get('index', 0)) + 1} of "
                              f"{data.get('count')}): run started")
    if kind == "round_aborted":
        if data.get("planned_end"):  # the hospitals' final refusals (budgets spent): a planned end
            return logging.WARNING, f"round {r} not run: {data.get('reason')} (a planned end: see run ended)"
        if data.get("voided"):  # an input out of bounds or under another key: the run goes on and names it
            return logging.WARNING, (f"round {r} voided, nothing applied: {data.get('reason')} (the run goes on; "
                                     "test rounds find whose input voided it)")
        return logging.ERROR, f"round {r} aborted: {data.get('reason')}"
    if kind == "end_not_delivered":
        return logging.WARNING, (f"round {r}: global model not delivered to {_who(data.get('hospital'), nodes)}: "
                                 f"{data.get('reason')}")
    if kind == "model_caught_up":
        return logging.INFO, (f"round {r}: the current global model sent with the plan to "
                              f"{_names(data.get('hospitals'), nodes)} (missed the last round)")
    if kind in ("hospital_suspended", "hospital_rejoined"):
        return logging.WARNING, f"round {r}: {_who(data.get('hospital'), nodes)} {kind.split('_')[1]}"
    if kind == "resumed":
        return logging.WARNING, (f"resumed from the journal after a restart: {data.get('rounds_completed')} round(s) "
                                 f"completed, next round {r} (last boundary: {data.get('stage')})")
    if kind == "run_ended":
        level = logging.INFO if data.get("status") == "completed" else logging.WARNING
        return level, (f"run ended ({data.get('status')}) after {data.get('rounds_completed')} of "
                       f"{data.get('rounds_planned')} round(s): {data.get('reason')}")
    if kind == "setup_sum":
        return logging.INFO, (f"set-up sum {data.get('name')} (round {r}): {data.get('contributors')} contributor(s); "
                              f"the same result from {_names(data.get('hospitals'), nodes)}")
    if kind == "candidates_eliminated":
        return logging.INFO, (f"candidates after {data.get('rounds')} round(s) (rung {data.get('rung')}): kept "
                              f"{', '.join(map(str, data.get('kept') or [])) or 'none'}; eliminated "
                              f"{', '.join(map(str, data.get('eliminated') or [])) or 'none'}")
    if kind in ("run_paused", "run_resumed"):
        return logging.INFO, (f"candidate model {data.get('candidate')!r}: run {kind.split('_')[1]} (rung "
                              f"{data.get('rung')}, next round {data.get('next_round')})")
    if kind == "model_chosen":
        return logging.INFO, (f"model chosen: {data.get('chosen')!r} of "
                              f"{', '.join(map(str, data.get('candidates') or []))}")
    if kind == "attribution_step":
        return logging.INFO, (f"round {r}: attribution test {data.get('test')} {data.get('outcome')}; suspects "
                              f"{_names(data.get('suspects'), nodes)}" + (f" ({data.get('end')})" if data.get("end")
                                                                          else ""))
    if kind == "hospital_retired":
        return logging.WARNING, f"round {r}: {_who(data.get('client'), nodes)} retired: {data.get('reason')}"
    if kind == "model_derived":
        return logging.INFO, (f"round {r}: every hospital derived the same model from the voted DAG "
                              f"({_names(data.get('hospitals'), nodes)})")
    if kind == "finished":  # rounds: the kept candidate's rounds in this ServerApp run, a scoring round included
        kept = f"model {data.get('candidate')!r} kept; " if data.get("candidate") else ""
        return logging.INFO, f"finished: {kept}{data.get('rounds')} round(s) of it ran in this run"
    if kind == "failed":
        return logging.ERROR, f"run failed: {data.get('reason')}"
    return logging.DEBUG, f"{kind}: {dict(data)}"
