"""Hospitals in worker processes: the in-process transport with every hospital's work running
in parallel (a simulation on a machine with more than one core).

:class:`ProcessTransport` forks worker processes (start method ``fork``) after the hospitals
have been built in this process, so each worker inherits its hospitals as they are; hospitals
are spread over the workers round-robin in name order, and a worker answers its hospitals one
after another, all workers at once. Everything else is :class:`.transport.InProcessTransport`'s:
the drop schedule, and each hospital's answer, refusal or foreign exception
(:func:`.transport.answer`, the same function in the worker). Results are those of a serial run
as long as no hospital's work reads state another hospital's work changed (e.g. a process-wide
random generator); the simulation's tests check that they are identical.

A worker that dies (killed, a crash in native code) is seen as the end of its pipe: its
hospitals give no answer from then on, with that reason, and the round goes on without them
(or aborts, as audited) -- the parent never waits on a dead worker. With a ``reply_timeout``, a
worker silent that long on one request is stopped and counts as dead.

Between rounds the parent reads its hospitals' state with :meth:`ProcessTransport.call` (a
module-level function, run in the workers in parallel). At the end :meth:`ProcessTransport.members`
brings every hospital back: pickled by the worker and read by the parent that forked it, over
the pipe between the two (nothing is written to or read from a file). What the parent already
holds is not pickled but referred to: the objects given as ``anchors`` (the identities and the
hospitals' builders, which :class:`clinograph.core.identity.Identity` refuses to pickle anyway)
travel as their index, public identities and X25519 public keys as their raw bytes, and a DP sampler's
random stream (:class:`clinograph.secure.hazmat.discrete_noise.CsprngUniform`, whose cipher state
cannot be read out) comes back as a fresh stream under a new random key. An object that refuses to
be pickled because it holds a secret (a CKKS keyring or threshold share, a journal key: its class
defines ``__reduce__`` to raise), an X25519 private key (a masking round's key pair) and TenSEAL's
and SEAL's C++ objects do not travel: they stay in the worker,
which ends with the run, and the parent's hospital holds a :class:`Withheld` in their place, which
names the object and the fix if anything touches it (a finished run's hospitals predict without them).
Functions and classes defined inside a function (a task's loss closure) cannot be pickled by name:
those the hospitals hold before the fork are found by a pickling dry run and become anchors; one
made in a worker comes back as a :class:`Withheld`.
:meth:`ProcessTransport.close` (also on leaving a ``with`` block) stops every worker.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import io
import logging
import math
import multiprocessing
import os
import pickle
import signal
import sys
import time
import traceback
import types
from collections.abc import Callable, Iterable, Mapping
from multiprocessing.connection import Connection, wait
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from clinograph.core.errors import ClinographError, ConfigError
from clinograph.core.identity import PublicIdentity

from ..hazmat.discrete_noise import CsprngUniform
from .participant import RoundParticipant
from .transport import Answer, InProcessTransport, answer

_log = logging.getLogger(__name__)

#: seconds to wait for a worker to end after it was asked to, before it is terminated
STOP_SECONDS = 5.0
#: the time constant of Linux's 1-minute load average (an exponential mean, sampled every 5 s)
LOAD_TAU = 60.0
#: this process's worker sets, as (started, stopped, workers) on the monotonic clock
_RAN: list[tuple[float, float, int]] = []


def runnable_now(path: str = "/proc/loadavg") -> float:
    """Tasks runnable on this machine at this moment, this process included (Linux: the 4th field of
    ``/proc/loadavg``, "running/total"); 0.0 where there is no such file. The 1-minute load average
    lags: a test suite's other workers that started seconds ago are busy now but barely in it."""
    try:
        with open(path, encoding="ascii") as f:
            return float(f.read().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return 0.0


def own_recent_load(now: float | None = None) -> float:
    """What this process's own stopped workers still add to the 1-minute load average: n workers busy
    for D seconds raised it by n·(1 − e^(−D/τ)), which decays as e^(−t/τ) t seconds after they stopped
    (τ = :data:`LOAD_TAU`). ``"auto"`` subtracts it: without that, a simulation right after another
    (the demo's DP federation after its first) read its predecessor's workers as other work."""
    now = time.monotonic() if now is None else now
    return sum(n * (1.0 - math.exp(-(stop - start) / LOAD_TAU)) * math.exp(-max(0.0, now - stop) / LOAD_TAU)
               for start, stop, n in _RAN)


def busy_cores() -> float:
    """How busy this machine is, for ``[simulation] workers = "auto"``: the larger of the 1-minute
    load average less this process's own stopped workers (:func:`own_recent_load`) and the tasks
    runnable now (:func:`runnable_now`); both count this process itself. 0.0 where neither is known."""
    average = max(0.0, os.getloadavg()[0] - own_recent_load()) if hasattr(os, "getloadavg") else 0.0
    return max(average, runnable_now())


class WorkerError(ClinographError):
    """A worker process failed at a query (not at a round's message, which is a dropout)."""


class Withheld:
    """In a hospital brought back from a worker, the place of an object that stayed there (a secret
    key holder, a TenSEAL object: module docstring). Any use raises :class:`WorkerError` naming it."""

    __slots__ = ("_what",)

    def __init__(self, what: str):
        object.__setattr__(self, "_what", what)

    def __getattr__(self, name: str) -> Any:
        what = object.__getattribute__(self, "_what")
        raise WorkerError(f"This hospital's {what} stayed in its simulation worker process (a secret key or a "
                          f"TenSEAL object is never sent between processes), so .{name} cannot be read here; "
                          "run the simulation with [simulation] workers = 1 to keep it in this process.")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__getattr__("__call__")

    def __repr__(self) -> str:
        return f"Withheld({object.__getattribute__(self, '_what')})"


#: the modules of TenSEAL's and SEAL's C++ objects (pybind11: they cannot be pickled)
_NATIVE = frozenset({"tenseal", "_tenseal_cpp", "_sealapi_cpp"})


def _stays(obj: Any) -> bool:
    """True for an object that must not leave its worker (module docstring). Decided once a class:
    pickling calls this for every object it meets."""
    return _class_stays(type(obj))


@functools.cache
def _native_module(cls: type) -> bool:
    """A TenSEAL/SEAL class (a metaclass's ``__module__`` may be a descriptor: not one of those)."""
    module = cls.__dict__.get("__module__")
    return isinstance(module, str) and module.split(".", 1)[0] in _NATIVE


@functools.cache
def _class_stays(cls: type) -> bool:
    """A TenSEAL/SEAL native class, or a Clinograph class whose own ``__reduce__`` refuses (a secret
    holder: it raises TypeError without reading the instance)."""
    if _native_module(cls):
        return True
    reduce = cls.__dict__.get("__reduce__")
    if reduce is None or not cls.__module__.startswith("clinograph."):
        return False
    try:
        probe = object.__new__(cls)  # an empty instance: never a hospital's real secret
    except TypeError:  # a builtin-derived class: not one of ours that refuses
        return False
    try:
        reduce(probe)
    except TypeError:
        return True
    return False


class ProcessTransport(InProcessTransport):
    """:class:`.transport.InProcessTransport` over ``workers`` forked worker processes.

    ``after_fork()`` runs first in every worker (the SDK sets torch to one thread there: forking
    after OpenMP was used is only safe that way, and the workers share the cores). ``anchors``:
    objects this process holds that the hospitals refer to and that never change in a worker
    (see the module docstring). ``reply_timeout``: seconds a worker may take to answer one request
    (an exchange: all its hospitals' answers); a worker that takes longer is stopped, and its
    hospitals are gone as if it had died. None: no limit (as a serial run waits on a hospital)."""

    def __init__(self, participants: Mapping[str, RoundParticipant], *, workers: int,
                 after_fork: Callable[[], None] | None = None, anchors: Iterable[Any] = (),
                 reply_timeout: float | None = None):
        super().__init__(participants)
        self._timeout = reply_timeout  # seconds for a worker's answer to one request; None: no limit
        if workers < 2:
            raise ConfigError(f"A process transport needs at least 2 workers, not {workers}; use the "
                              "in-process transport for one.")
        if "fork" not in multiprocessing.get_all_start_methods():
            raise ConfigError("Worker processes need the 'fork' start method, which this platform lacks; "
                              "set [simulation] workers = 1.")
        self._anchors = list(anchors)
        self._anchors += _local_objects(self.participants, self._anchors)  # before the fork: the same in every worker
        names = self.hospitals()
        count = min(workers, len(names))
        self._groups = [names[i::count] for i in range(count)]
        self._where = {name: i for i, group in enumerate(self._groups) for name in group}
        self._ended: dict[int, str] = {}  # worker -> why it is gone
        context = multiprocessing.get_context("fork")
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        self._started = time.monotonic()
        collecting = gc.isenabled()
        try:
            for group in self._groups:
                parent, child = context.Pipe()
                proc = context.Process(target=_serve, args=(child, {n: self.participants[n] for n in group},
                                                            after_fork, self._anchors, list(self._conns), collecting),
                                       daemon=True)
                gc.disable()  # no collection in the child before it freezes what it inherited (_serve)
                try:
                    proc.start()
                finally:
                    if collecting:
                        gc.enable()
                child.close()
                self._conns.append(parent)
                self._procs.append(proc)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> ProcessTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pids(self) -> tuple[int, ...]:
        """The workers' process ids (tests)."""
        return tuple(p.pid for p in self._procs)

    def _answer_all(self, stage: str, due: Mapping[str, Mapping[str, bytes]], *, round_: int) -> dict[str, Answer]:
        by_worker: dict[int, dict[str, Mapping[str, bytes]]] = {}
        for name, parts in due.items():
            by_worker.setdefault(self._where[name], {})[name] = parts
        replies = self._ask({w: ("exchange", stage, {n: dict(p) for n, p in parts.items()}, round_)
                             for w, parts in by_worker.items()})
        out: dict[str, Answer] = {}
        for w, names in by_worker.items():
            got = replies.get(w)
            for name in names:
                if got is None:
                    out[name] = (None, f"its worker process ended ({self._ended.get(w, 'no reply')})", None)
                else:
                    out[name] = got[name]
        return out

    def call(self, fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
        """``fn(participant, *args)`` for every hospital, run in its worker (all workers at once)."""
        replies = self._ask({w: ("call", fn, args) for w in range(len(self._groups))})
        out: dict[str, Any] = {}
        for w, group in enumerate(self._groups):
            if w not in replies:
                raise WorkerError(f"The worker process of hospitals {list(group)} ended "
                                  f"({self._ended.get(w, 'no reply')}); their state cannot be read.")
            out.update(replies[w])
        return dict(sorted(out.items()))

    def members(self) -> dict[str, Any]:
        """Every hospital as its worker holds it now, brought back into this process (by pickle,
        over the pipe to the worker it forked; see the module docstring)."""
        try:
            replies = self._ask({w: ("members",) for w in range(len(self._groups))})
        except WorkerError as exc:
            raise WorkerError(f"The hospitals cannot be brought back from their worker processes ({exc}): one holds "
                              "an object that cannot be pickled. The run itself ended and its audit is written; set "
                              "[simulation] workers = 1 to keep the hospitals in this process.") from None
        out: dict[str, Any] = {}
        for w, group in enumerate(self._groups):
            if w not in replies:
                raise WorkerError(f"The worker process of hospitals {list(group)} ended "
                                  f"({self._ended.get(w, 'no reply')}); they cannot be brought back.")
            out.update(_Unpickler(io.BytesIO(replies[w]), self._anchors).load())
        return dict(sorted(out.items()))

    def close(self) -> None:
        """Stop every worker (asked first, then terminated); safe to call twice."""
        for w, conn in enumerate(self._conns):
            if w not in self._ended:
                try:
                    conn.send(("stop",))
                except (OSError, ValueError):
                    pass
        for w, proc in enumerate(self._procs):
            proc.join(STOP_SECONDS)
            if proc.is_alive():
                proc.terminate()
                proc.join(STOP_SECONDS)
            self._ended.setdefault(w, "stopped")
        for conn in self._conns:
            conn.close()
        if self._procs:
            _RAN.append((self._started, time.monotonic(), len(self._procs)))
            del _RAN[:-8]
        self._conns, self._procs = [], []

    def _ask(self, requests: Mapping[int, tuple]) -> dict[int, Any]:
        """Send each live worker its request, then wait for every answer; a worker whose pipe ends
        is recorded as gone (with its exit code) and has no entry in the result."""
        waiting: dict[Connection, int] = {}
        for w, request in requests.items():
            if w in self._ended:
                continue
            try:
                self._conns[w].send(request)
                waiting[self._conns[w]] = w
            except (OSError, ValueError):
                self._gone(w)
        replies: dict[int, Any] = {}
        errors: list[str] = []
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while waiting:
            ready = wait(list(waiting), None if deadline is None else max(0.0, deadline - time.monotonic()))
            if not ready:  # the reply timeout passed: the workers still silent are stopped
                for w in waiting.values():
                    self._stop_silent(w)
                break
            for conn in ready:
                w = waiting.pop(conn)  # type: ignore[call-overload]
                try:
                    status, value = conn.recv()  # type: ignore[union-attr]
                except (EOFError, OSError):
                    self._gone(w)
                    continue
                if status == "ok":
                    replies[w] = value
                else:
                    errors.append(f"{value} (hospitals {list(self._groups[w])})")
        if errors:
            raise WorkerError("A worker process failed at a query: " + "; ".join(errors))
        return replies

    def _stop_silent(self, w: int) -> None:
        proc = self._procs[w]
        proc.terminate()
        proc.join(STOP_SECONDS)
        self._ended[w] = f"no reply within {self._timeout:g} s"
        _log.warning("worker process %d (hospitals %s) stopped: %s", proc.pid, list(self._groups[w]), self._ended[w])

    def _gone(self, w: int) -> None:
        proc = self._procs[w]
        proc.join(1.0)
        code = proc.exitcode
        self._ended[w] = ("exit code unknown" if code is None else
                          f"killed by signal {-code}" if code < 0 else f"exit code {code}")
        _log.warning("worker process %d (hospitals %s) ended: %s", proc.pid, list(self._groups[w]), self._ended[w])


def _serve(conn: Connection, participants: dict[str, RoundParticipant], after_fork: Callable[[], None] | None,
           anchors: list[Any], inherited: list[Connection], collecting: bool = True) -> None:
    """A worker: answer requests until told to stop or the parent's end of the pipe closes."""
    # What the fork copied is never collected here: a TenSEAL/SEAL context's destructor joins its
    # thread pool, whose threads a fork does not copy (seen: a segfault when a hospital's inherited
    # CKKS objects in a reference cycle were collected in a worker). The parent forked with the
    # collector off, so nothing was collected before this line; objects made here are collected as usual.
    # Nor freed when a hospital drops its last reference: this worker keeps every inherited TenSEAL object.
    _kept = ([o for o in gc.get_objects() if _native_module(type(o))]
            if not _NATIVE.isdisjoint(sys.modules) else [])  # a local: alive until the worker returns
    gc.freeze()
    if collecting:
        gc.enable()
    for other in inherited:  # the parent's ends of earlier workers' pipes: theirs alone
        other.close()
    # The parent's sys.stdout/sys.stderr may be a display's proxy (rich's progress bar during `clinograph
    # simulate`) whose lock another thread held at the fork, never to be released here: a worker writes
    # (warnings, logs) to this process's own streams.
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    # Ctrl-C reaches the whole process group: the parent stops the run and then its workers
    # (close()); a worker interrupted mid-answer would only print a bare traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if after_fork is not None:
        after_fork()
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        kind = request[0]
        if kind == "stop":
            return
        try:
            if kind == "exchange":
                _, stage, due, round_ = request
                value: Any = {name: answer(participants[name], name, stage, parts, round_=round_)
                              for name, parts in due.items()}
            elif kind == "call":
                _, fn, args = request
                value = {name: fn(p, *args) for name, p in participants.items()}
            else:  # members
                buffer = io.BytesIO()
                _Pickler(buffer, anchors).dump(participants)
                value = buffer.getvalue()
            conn.send(("ok", value))
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
            _log.warning("worker request %r failed with %s; where:\n%s", kind, type(exc).__name__,
                         "".join(traceback.format_tb(exc.__traceback__)))
            conn.send(("error", f"{kind}: {type(exc).__name__}"))


class _Pickler(pickle.Pickler):
    """Pickles a worker's hospitals for its parent: anchors by index, public keys by their raw bytes,
    secrets withheld."""

    def __init__(self, file: io.BytesIO, anchors: list[Any]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._index = {id(a): i for i, a in enumerate(anchors)}
        self._anchors = anchors

    def persistent_id(self, obj: Any) -> Any:  # noqa: D102
        i = self._index.get(id(obj))
        if i is not None and self._anchors[i] is obj:
            return ("anchor", i)
        if isinstance(obj, PublicIdentity):
            return ("public", obj.name, obj.raw)
        if isinstance(obj, X25519PrivateKey):  # a round's masking key: never sent between processes
            return ("withheld", "X25519PrivateKey")
        if isinstance(obj, X25519PublicKey):
            return ("x25519_public", obj.public_bytes_raw())
        if isinstance(obj, Ed25519PublicKey):
            return ("ed25519_public", obj.public_bytes_raw())
        if isinstance(obj, CsprngUniform):  # a DP sampler's stream: its cipher state cannot be read out
            return ("csprng",)
        if _stays(obj):
            return ("withheld", type(obj).__name__)
        if _local(obj):  # made after the fork (those made before are anchors: _local_objects)
            return ("withheld", f"{type(obj).__name__} {obj.__qualname__}")
        return None


class _Finder(_Pickler):
    """A pickling dry run that collects the local functions and classes it reaches."""

    def __init__(self, anchors: list[Any]):
        super().__init__(_Discard(), anchors)  # type: ignore[arg-type]
        self.found: dict[int, Any] = {}

    def persistent_id(self, obj: Any) -> Any:  # noqa: D102
        if _local(obj) and id(obj) not in self._index:
            self.found[id(obj)] = obj
            return ("found",)
        return super().persistent_id(obj)


class _Discard:
    def write(self, data: bytes) -> int:
        return len(data)


def _local(obj: Any) -> bool:
    """A function or class defined inside a function (a closure, a lambda): pickle cannot name it."""
    return isinstance(obj, (types.FunctionType, type)) and "<" in getattr(obj, "__qualname__", "")


def _local_objects(participants: Mapping[str, Any], anchors: list[Any]) -> list[Any]:
    """The local functions and classes the hospitals reach before the fork (e.g. a task's loss closure).
    They become anchors: a worker refers to them by index and the parent, which holds the very same
    objects, resolves it (a closure is not changed by training)."""
    finder = _Finder(anchors)
    with contextlib.suppress(Exception):  # something no pickler carries: members() names it, if still there
        finder.dump(dict(participants))
    return list(finder.found.values())


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, anchors: list[Any]):
        super().__init__(file)
        self._anchors = anchors

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        kind, *rest = pid
        if kind == "anchor":
            return self._anchors[rest[0]]
        if kind == "public":
            return PublicIdentity(rest[0], rest[1])
        if kind == "x25519_public":
            return X25519PublicKey.from_public_bytes(rest[0])
        if kind == "ed25519_public":
            return Ed25519PublicKey.from_public_bytes(rest[0])
        if kind == "csprng":  # a fresh one-use random key: as unpredictable as the stream it replaces
            return CsprngUniform()
        if kind == "withheld":
            return Withheld(rest[0])
        raise pickle.UnpicklingError(f"unknown reference {kind!r}")
