"""Timestamps from inside every Flower process of a benchmark run: where an exchange's time goes.

Benchmark-only. :func:`install` (called by ``trace_site/sitecustomize.py`` in every Python
process started with ``trace_site`` on ``PYTHONPATH`` and ``CLINOGRAPH_FLOWER_TRACE`` naming a
folder) wraps, as each module is first imported, the calls below and appends one JSON line a
call -- ``{"name", "t0", "t1"}`` (wall clock) -- to ``<folder>/<pid>.jsonl``; the first line of
each file names the process (pid, parent pid, its role). Nothing of Flower or Clinograph is
changed on disk and no message content is written, only names and times.

=====================================  ============================================================
``rpc <path>``                         one Flower protobuf-over-HTTP call (``ProtobufClient``),
                                       serialisation and retries included: Fleet (SuperNode ↔
                                       SuperLink), Runtime API (ClientApp/SuperExec ↔ SuperNode,
                                       ServerApp ↔ SuperLink)
``http_client``                        building an ``httpx.Client`` (its TLS context)
``supernode_pull``                     the SuperNode's pull of one message (only those that found one)
``supernode_push``                     the SuperNode waiting for the ClientApp's reply and sending it
``launch``                             the warm executor forking a ClientApp
``clientapp``                          the forked ClientApp, entry to exit (``run_task``)
``pull_task_input`` / ``install_fab``  the ClientApp's input pull, its FAB unpacking,
``push_reply``                         pushing its reply
``relay``                              the hospital's work as the ClientApp sees it (IPC to the worker)
``serialise`` / ``deserialise``        Clinograph's parts to and from Flower records (both sides)
``send_and_receive``                   the ServerApp's exchange (push, then pull until all replied)
=====================================  ============================================================

:func:`breakdown` turns the files and the ServerApp's ``stage_progress`` events into, per
exchange, the slowest hospital's critical path (see its docstring).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV = "CLINOGRAPH_FLOWER_TRACE"
_state: dict[str, Any] = {"pid": None, "fh": None}


def _write(row: dict | None) -> None:
    pid = os.getpid()
    if _state["pid"] != pid:  # first line of this process (or of a forked child)
        _state["pid"], folder = pid, Path(os.environ[ENV])
        _state["fh"] = (folder / f"{pid}.jsonl").open("a", buffering=1)
        argv = " ".join(sys.argv)[:600]
        hospital = re.search(r"hospital='([^']+)'", argv)
        _state["fh"].write(json.dumps({"process": pid, "ppid": os.getppid(), "argv0": Path(sys.argv[0]).name,
                                       "hospital": hospital.group(1) if hospital else None}) + "\n")
    if row is not None:
        _state["fh"].write(json.dumps(row) + "\n")


def span(name: str | Callable[..., str], fn: Callable, *, keep: Callable[[Any], bool] | None = None,
         prefix: str | None = None) -> Callable:
    """``fn`` wrapped to record its wall-clock span (``keep(result)`` false: not recorded, or, with
    ``prefix``, recorded with ``prefix`` in front of its name)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.time()
        result, ok = None, False
        try:
            result = fn(*args, **kwargs)
            ok = True
            return result
        finally:
            kept = keep is None or not ok or keep(result)
            if kept or prefix is not None:
                label = name(*args, **kwargs) if callable(name) else name
                _write({"name": label if kept else prefix + label, "t0": t0, "t1": time.time(), "ok": ok})

    return wrapper


def _rpc_name(self: Any, *, path: str, **_: Any) -> str:
    return f"rpc {path.rsplit('/', 1)[-1]}"


#: The name of a Runtime/Fleet poll that found nothing begins with this (``idle rpc pull-messages``):
#: counted apart (:func:`idle_polls`), never part of an exchange's path.
IDLE = "idle "


def _idle(result: Any) -> bool:
    """False for a Runtime/Fleet poll that found nothing (recorded as :data:`IDLE`)."""
    name = type(result).__name__
    if name == "AcquireTaskResponse":
        return bool(result.HasField("task"))
    if name in ("PullMessagesResponse", "PullAppMessagesResponse"):
        return bool(len(result.messages_list))
    return True


def _patch_protobuf_client(mod: Any) -> None:
    inner = mod.ProtobufClient._unary_unary
    mod.ProtobufClient._unary_unary = span(_rpc_name, inner, keep=_idle, prefix=IDLE)


def _patch_httpx(mod: Any) -> None:
    mod.Client.__init__ = span("http_client", mod.Client.__init__)


def _patch_start_client_internal(mod: Any) -> None:
    mod._pull_and_store_message = span("supernode_pull", mod._pull_and_store_message, keep=lambda r: r is not None)
    mod._push_messages = span("supernode_push", mod._push_messages)


def _patch_run_clientapp(mod: Any) -> None:
    mod.pull_task_input = span("pull_task_input", mod.pull_task_input)
    mod.install_from_fab = span("install_fab", mod.install_from_fab)
    mod.push_message = span("push_reply", mod.push_message)


def _patch_superexec(mod: Any) -> None:
    mod.WarmExecutor.launch = span("launch", mod.WarmExecutor.launch)
    mod.run_task = span("clientapp", mod.run_task)


def _patch_records(mod: Any) -> None:
    mod.to_content = span("serialise", mod.to_content)
    mod.from_content = span("deserialise", mod.from_content)


def _patch_clientapp(mod: Any) -> None:
    mod.call = span("relay", mod.call)
    _patch_records(mod)


def _patch_driver(mod: Any) -> None:
    mod._send_and_receive = span("send_and_receive", mod._send_and_receive)
    _patch_records(mod)
    if os.environ.get(PREVIOUS_DRIVER):
        _previous_driver(mod)
    if os.environ.get(PREVIOUS_POLLS):
        mod.POLL_FRACTION = 0.02
    if os.environ.get(PREVIOUS_CALLS):
        mod.FIRST_PULL_SHARE, mod.PUSH_EACH_FROM = 0.0, 10**9


#: Set (to anything) in a run's environment: its ServerApp greets as before each node was greeted as
#: it connects (the ``server_previous`` arm of flower_scale.py): it waits until ``min-nodes`` are
#: connected (looking every 0.5 s), then greets them all in one exchange.
PREVIOUS_DRIVER = "CLINOGRAPH_FLOWER_PREVIOUS_DRIVER"


def _previous_driver(mod: Any) -> None:
    def greet_connected(grid: Any, *, federation_id: str, enrolled: Any, min_nodes: int, wait: float,
                        timeout: float, **_: Any) -> tuple[dict, dict, int]:
        deadline = time.monotonic() + wait
        node_ids = sorted(grid.get_node_ids())
        while len(node_ids) < min_nodes and time.monotonic() < deadline:
            time.sleep(0.5)
            node_ids = sorted(grid.get_node_ids())
        names, failed = mod.greet_nodes(grid, federation_id=federation_id, enrolled=enrolled, node_ids=node_ids,
                                        timeout=timeout)
        return names, failed, len(node_ids)

    mod.greet_connected = greet_connected


#: Set (to anything) in a run's environment: every process of it runs without the object pull backoff
#: (polling.set_object_pull_backoff), as before it existed -- the ServerApp included, which no
#: launcher option reaches (the ``warm_previous`` arms).
PREVIOUS = "CLINOGRAPH_FLOWER_PREVIOUS"


#: Set (to anything) in a run's environment: its processes poll as before issue 35's third pass
#: (the ``polls_previous`` arms): the object pull backoff from 0.05 s, the ServerApp's reply poll
#: growing at 2 % of the time waited (its floor, 0.05 s, is the run config ``reply-poll``; the
#: SuperNode's idle poll from 0.2 s and its reply wait of 0.05 s are ``--supernode-poll 0.2``).
PREVIOUS_POLLS = "CLINOGRAPH_FLOWER_PREVIOUS_POLLS"


#: Set (to anything) in a run's environment: its processes make the SuperLink calls of before issue
#: 35's fourth pass (the ``calls_previous`` arms): no quiet wait after a SuperNode's reply
#: (``polling.QUIET_SHARE``), the ServerApp's first pull of replies at once (``driver.FIRST_PULL_SHARE``)
#: and all of an exchange's messages pushed in one call before their objects (``driver.PUSH_EACH_FROM``).
PREVIOUS_CALLS = "CLINOGRAPH_FLOWER_PREVIOUS_CALLS"


def _patch_polling(mod: Any) -> None:
    if os.environ.get(PREVIOUS):
        mod.set_object_pull_backoff = lambda *args, **kwargs: None
    elif os.environ.get(PREVIOUS_POLLS):
        mod.set_object_pull_backoff.__kwdefaults__["initial"] = 0.05
    if os.environ.get(PREVIOUS_CALLS):
        mod.QUIET_SHARE = 0.0


def idle_polls(folder: Path, lo: float, hi: float) -> dict[str, int]:
    """Polls that found nothing begun in [lo, hi], by role (the SuperNodes' PullMessages, the
    SuperExecs' AcquireTask, the ServerApp's PullMessages) and their median seconds."""
    procs, spans = read_trace(folder)
    out: dict[str, list[float]] = {}
    for sp in spans:
        if sp["name"].startswith(IDLE) and lo <= sp["t0"] <= hi:
            role = {"flwr-serverapp": "serverapp"}.get(str(procs.get(sp["pid"], {}).get("argv0")), "supernode")
            out.setdefault(f"{role} {sp['name'][len(IDLE) + 4:]}", []).append(sp["t1"] - sp["t0"])
    return {k: {"calls": len(v), "median_s": round(sorted(v)[len(v) // 2], 4)} for k, v in sorted(out.items())}


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system, seconds) process ``pid`` has used so far, its children not
    included; None if it is gone (Linux ``/proc``)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)


PATCHES: dict[str, Callable[[Any], None]] = {
    "clinograph.secure.transport.flower.polling": _patch_polling,
    "flwr.supercore.protobuf.client": _patch_protobuf_client,
    "httpx": _patch_httpx,
    "flwr.supernode.start_client_internal": _patch_start_client_internal,
    "flwr.supernode.runtime.run_clientapp": _patch_run_clientapp,
    "clinograph.secure.transport.flower.superexec": _patch_superexec,
    "clinograph.secure.transport.flower.clientapp": _patch_clientapp,
    "clinograph.secure.transport.flower.driver": _patch_driver,
}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Applies :data:`PATCHES` to a module right after it is first executed."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in PATCHES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader, patch = spec.loader, PATCHES[name]
        exec_module = loader.exec_module

        def traced_exec(module: Any) -> None:
            exec_module(module)
            patch(module)

        loader.exec_module = traced_exec  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Trace this process (and its forks) if ``CLINOGRAPH_FLOWER_TRACE`` names a folder."""
    if os.environ.get(ENV) and not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
        _write(None)  # name this process now: a forkserver writes no span, but its children name it as parent


# -- analysis --------------------------------------------------------------------------------

def read_trace(folder: Path) -> tuple[dict[int, dict], list[dict]]:
    """(pid -> its process line, every span with its pid)."""
    procs: dict[int, dict] = {}
    spans: list[dict] = []
    for path in folder.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            if "process" in row:
                procs[row["process"]] = row
            else:
                spans.append({**row, "pid": int(path.stem)})
    return procs, sorted(spans, key=lambda s: s["t0"])


def hospital_of(pid: int, procs: dict[int, dict]) -> str | None:
    """The hospital whose SuperNode ``pid`` is, or descends from (forkserver, ClientApp)."""
    seen = 0
    while pid in procs and seen < 5:
        if procs[pid].get("hospital"):
            return procs[pid]["hospital"]
        pid, seen = procs[pid]["ppid"], seen + 1
    return None


def _first(spans: list[dict], name: str, lo: float, hi: float) -> dict | None:
    return next((s for s in spans if s["name"] == name and lo <= s["t0"] <= hi), None)


def _last_end(spans: list[dict], name: str, lo: float, hi: float) -> dict | None:
    xs = [s for s in spans if s["name"] == name and lo <= s["t1"] <= hi]
    return xs[-1] if xs else None


def exchange_path(*, server: list[dict], node: list[dict], child: list[dict], lo: float, hi: float) -> dict:
    """One hospital's critical path through one exchange [lo, hi] (the ServerApp's send_and_receive).

    Segments, each from the end of the one before: ``server_push`` (its PushMessages/PushObject
    calls), ``node_poll_wait`` (until the SuperNode's pull that found the message began: its idle
    poll), ``node_pull`` (PullMessages, objects, confirm; GetRun/GetFab for a new run),
    ``task_wait`` (until the SuperExec forked the ClientApp: its task poll), ``fork`` (until the
    child ran), ``clientapp_setup`` (HTTP client, PullTaskInput, messages, FAB unpacking, app
    loading), ``hospital`` (the relayed call), ``clientapp_push`` (its reply pushed to the
    SuperNode), ``node_reply_wait`` (until the SuperNode saw it and began sending), ``node_send``
    (PushMessages/PushObject to the SuperLink), ``server_pull`` (until the ServerApp had it: its
    poll and pull). Missing marks leave the segment out."""
    marks: dict[str, float] = {"start": lo}
    push = [s for s in server if s["name"] in ("rpc push-messages", "rpc push-object") and lo <= s["t0"] <= hi]
    if push:
        marks["server_push"] = max(s["t1"] for s in push)
    pull = _last_end(node, "supernode_pull", lo, hi)
    if pull:
        marks["node_poll_wait"] = pull["t0"]
        marks["node_pull"] = pull["t1"]
    launch = _first(node, "launch", marks.get("node_pull", lo), hi)
    if launch:
        marks["task_wait"] = launch["t0"]
    app = next((s for s in child if s["name"] == "clientapp" and lo <= s["t0"] <= hi), None)
    if app:
        marks["fork"] = app["t0"]
        relay = _first(child, "relay", app["t0"], hi)
        if relay:
            marks["clientapp_setup"] = relay["t0"]
            marks["hospital"] = relay["t1"]
        reply = _first(child, "push_reply", app["t0"], hi)
        if reply:
            marks["clientapp_push"] = reply["t1"]
    sends = [s for s in node if s["name"] in ("rpc push-messages", "rpc push-object")
             and marks.get("clientapp_push", lo) <= s["t0"] <= hi]
    if sends:
        marks["node_reply_wait"] = sends[0]["t0"]
        marks["node_send"] = max(s["t1"] for s in sends)
    marks["server_pull"] = hi
    out = _segments(marks, lo)
    out["flower_http"] = round(_http_on_path(marks, lo=lo, hi=hi, server=server, node=node, child=child), 4)
    setup = [s for s in child if app and lo <= s["t0"] <= marks.get("clientapp_setup", hi)]
    out["setup_parts"] = {n: round(sum(s["t1"] - s["t0"] for s in setup if s["name"] == n), 4)
                          for n in ("http_client", "pull_task_input", "install_fab", "deserialise")}
    out["calls"] = {"server": sum(1 for s in server if s["name"].startswith("rpc ") and lo <= s["t0"] <= hi),
                    "supernode": sum(1 for s in node if s["name"].startswith("rpc ") and lo <= s["t0"] <= hi),
                    "clientapp": sum(1 for s in child if s["name"].startswith("rpc ") and lo <= s["t0"] <= hi)}
    return out


def _segments(marks: dict[str, float], lo: float) -> dict:
    out, prev = {}, lo
    for key, t in marks.items():
        if key != "start":
            out[key] = round(t - prev, 4)
            prev = t
    return out


def _http_on_path(marks: dict[str, float], *, lo: float, hi: float, server: list[dict], node: list[dict],
                  child: list[dict]) -> float:
    """Seconds of the critical path spent inside Flower HTTP calls (overlapping calls counted once):
    the server's push, the SuperNode's pull, the ClientApp's calls, the SuperNode's send, the
    server's last pull."""
    def rpcs(spans: list[dict], a: float | None, b: float | None) -> list[tuple[float, float]]:
        if a is None or b is None:
            return []
        return [(max(s["t0"], a), min(s["t1"], b)) for s in spans
                if s["name"].startswith("rpc ") and s["t1"] > a and s["t0"] < b]

    g = marks.get
    spans = [*rpcs(server, lo, g("server_push")), *rpcs(node, g("node_poll_wait"), g("node_pull")),
             *rpcs(child, g("fork"), g("clientapp_push")), *rpcs(node, g("node_reply_wait"), g("node_send")),
             *rpcs(server, g("node_send"), hi)]
    total, end = 0.0, -1.0
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def breakdown(folder: Path) -> list[dict]:
    """Per ServerApp exchange (in time order): its wall time and, for the hospital whose reply came
    last, :func:`exchange_path`."""
    procs, spans = read_trace(folder)
    by_hospital: dict[str, dict[str, list[dict]]] = {}
    server: list[dict] = []
    for s in spans:
        argv0 = procs.get(s["pid"], {}).get("argv0", "")
        if argv0 == "flwr-serverapp":
            server.append(s)
            continue
        h = hospital_of(s["pid"], procs)
        if h is None:
            continue
        role = "child" if procs.get(procs[s["pid"]]["ppid"], {}).get("argv0") == "-c" else "node"  # forkserver's
        by_hospital.setdefault(h, {"node": [], "child": []})[role].append(s)
    rows = []
    for ex in (s for s in server if s["name"] == "send_and_receive"):
        lo, hi = ex["t0"], ex["t1"]
        paths = {h: exchange_path(server=server, node=d["node"], child=d["child"], lo=lo, hi=hi)
                 for h, d in sorted(by_hospital.items())}
        # the slowest: the one whose reply was sent last (the smallest server_pull segment)
        slowest = min(paths, key=lambda h: paths[h].get("server_pull", 1e9)) if paths else None
        rows.append({"t0": lo, "wall": round(hi - lo, 4), "slowest": slowest,
                     **({"path": paths[slowest]} if slowest else {})})
    return rows
