"""The hospital's SuperExec: Flower's task loop, each ClientApp forked from a warm parent.

Flower 1.41's own SuperExec (``flower-superexec``, which ``flower-supernode --isolation
subprocess`` starts) asks the SuperNode's Runtime API for a task once a second and starts a new
``flwr-clientapp`` process for every message: about 1.5 s of imports each on a quiet 2-core
machine, several seconds under load, once per hospital per protocol stage. Flower's only other
executor is Kubernetes (whose warm pools are Kubernetes-only).

:class:`SuperExecLoop` is the same loop built from Flower's own parts
(:class:`~flwr.supercore.runtime.RuntimeHttpClient`, ``AcquireTaskRequest``,
:class:`~flwr.supercore.superexec.plugin.AutoExecPlugin`), run as a thread of the SuperNode
process with the SuperNode in ``--isolation process``. Its :class:`WarmExecutor` runs each
ClientApp task through Flower's own ``run_clientapp`` -- the same token, Runtime API address,
TLS root certificates, parent-pid monitor and dependency-install flag that Flower's
``SubprocessExecutor`` passes to ``flwr-clientapp`` -- in a process forked from a
``multiprocessing`` forkserver that has Flower's ClientApp runtime and Clinograph's ClientApp
imported already, and httpx's transport loaded (:mod:`.warmup`). What changes: the start of a
ClientApp process (a fork instead of an interpreter start and its imports) and the task poll
(:data:`DEFAULT_POLL_INTERVAL`, cut short when the SuperNode has just stored a message, and held
while it is storing one: :func:`.polling.watch_message_pulls`). What does not: the ClientApp,
its Runtime API calls, its token (which no longer shows in the process list:
it travels over the forkserver's pipe, not on a command line), the error reply Flower sends
when a ClientApp raises or dies. And one thing is added: the child runs only the ClientApp the
hospital's operator names (``--clientapp``, Clinograph's by default), never code from the run's
FAB (:mod:`.clientapp_pin`).

Fork safety: the forkserver is a fresh interpreter (multiprocessing starts it with exec, passing
it only its own pipes), so it holds no gRPC or live HTTP client (:mod:`.warmup` closes the one
it builds before any fork, and it never connected), no thread, and not the hospital worker's socket; a child is a fork of that one-threaded server. A task of any other type than a
ClientApp (Flower's AgentApp) goes to Flower's ``SubprocessExecutor`` unchanged.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

from flwr.supercore.constant import TaskType
from flwr.supercore.superexec.executor import ExecutionSpec, LaunchResult, SubprocessExecutor

from .clientapp_pin import CLINOGRAPH_CLIENTAPP, pin_clientapp
from .crash_report import expire_task
from .logfilters import NoBlankLines, OurErrorsOnOneLine, install, is_terminal

#: Seconds between two task polls of the Runtime API when no task was waiting (Flower's too). A
#: poll is one small local HTTP call; a message the SuperNode stores does not wait for it (the
#: loop is woken: :meth:`SuperExecLoop.pull_ended`), so the timer only catches other tasks. (It was
#: 0.1 s before the wake-up: ten calls a second a node, 200 a second for 20 SuperNodes on one machine.)
DEFAULT_POLL_INTERVAL = 1.0

#: What the forkserver imports once, so that a forked ClientApp starts with them loaded.
#: Not the launcher module itself: a child re-runs the parent's main module as ``__mp_main__``
#: (multiprocessing's rule), which is cheap once its imports (the last two) are loaded.
PRELOAD = ("flwr.supernode.runtime.run_clientapp", "clinograph.secure.transport.flower.clientapp",
           "clinograph.secure.transport.flower.superexec", "clinograph.secure.transport.flower.polling",
           "clinograph.secure.transport.flower.clientapp_pin", "clinograph.secure.transport.flower.warmup")

_log = logging.getLogger(__name__)


def quiet_clientapp_logging() -> None:
    """In the forked ClientApp: no blank line at its exit (one a message in the hospital's log:
    15 a round of 3 hospitals' masked exchanges, between the SuperNode's lines) and Flower's colours
    only on a terminal (a SuperNode's log file held ``\\x1b[92mINFO \\x1b[0m:``): :mod:`.logfilters`."""
    import sys

    from flwr.common.logger import update_console_handler

    install(NoBlankLines)
    install(OurErrorsOnOneLine)  # a hospital's refusal: one line, not Flower's traceback through the relay
    update_console_handler(colored=is_terminal(sys.stderr))


def await_listening(address: str, *, stop: threading.Event, limit: float = 60.0, every: float = 0.05) -> bool:
    """Wait until ``host:port`` accepts a TCP connection (True), ``stop`` is set or ``limit`` seconds
    passed (False; the caller's first call then says what is wrong)."""
    import socket
    import time

    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    deadline = time.monotonic() + limit
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return True
        except (OSError, ValueError):
            stop.wait(every)
    return False


def run_task(spec: ExecutionSpec, clientapp: str = CLINOGRAPH_CLIENTAPP) -> None:
    """In the forked child: what ``flwr-clientapp`` does with the arguments SubprocessExecutor gives it,
    running only the ClientApp ``clientapp`` whatever the run's FAB names (:mod:`.clientapp_pin`)."""
    from flwr.supercore.tls import validate_and_resolve_root_certificates
    from flwr.supernode.runtime.run_clientapp import run_clientapp

    quiet_clientapp_logging()
    pin_clientapp(clientapp)

    run_clientapp(runtime_api_address=spec.runtime_api_address, token=spec.token, insecure=spec.insecure,
                  certificates=validate_and_resolve_root_certificates(spec.root_certificates_path, spec.insecure),
                  parent_pid=spec.parent_pid, runtime_dependency_install=spec.runtime_dependency_install)


class WarmExecutor:
    """A Flower ``Executor`` that forks each ClientApp from a warm forkserver (see the module docstring).

    Like ``SubprocessExecutor`` it has no capacity gate; :meth:`reconcile` reaps finished children
    and logs any that did not exit cleanly. Flower's Runtime API turns a ClientApp that died
    without replying into an error reply once its task token expires, 60 s later, as with a
    subprocess; here the token of a child that exited with an error or a signal expires at once
    (:func:`.crash_report.expire_task`), so the server has that reply within a task poll.
    """

    def __init__(self, *, preload: Sequence[str] = PRELOAD, clientapp: str = CLINOGRAPH_CLIENTAPP):
        self.clientapp = clientapp  # the only ClientApp it runs (:mod:`.clientapp_pin`)
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(list(preload))
        self._cold = SubprocessExecutor()
        self._children: dict[int, BaseProcess] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the forkserver now (it imports :data:`PRELOAD`), not at the first task."""
        from multiprocessing import forkserver

        forkserver.ensure_running()

    def get_eligible_capacity(self, supported_task_types: set[TaskType], *, insecure: bool = False,
                              root_certificates_path: str | None = None) -> tuple[set[TaskType], set[str]]:
        del insecure, root_certificates_path
        return supported_task_types, set()

    def wait_for_capacity(self, task_type: TaskType | None = None, *, fab_hash: str | None = None,
                          insecure: bool = False, root_certificates_path: str | None = None) -> None:
        del task_type, fab_hash, insecure, root_certificates_path

    def launch(self, spec: ExecutionSpec) -> LaunchResult:
        """Fork the ClientApp of ``spec`` from the forkserver (other task types: a subprocess)."""
        if spec.task_type != TaskType.CLIENT_APP:
            return self._cold.launch(spec)
        child = self._ctx.Process(target=run_task, args=(spec, self.clientapp), name=f"flwr-clientapp-{spec.task_id}", daemon=True)
        _log.debug("forking the ClientApp of task %d", spec.task_id)
        try:
            child.start()
        except OSError as exc:
            return LaunchResult.failed(f"could not fork the ClientApp: {type(exc).__name__}: {exc}")
        with self._lock:
            self._children[spec.task_id] = child
        return LaunchResult.accepted()

    def running(self) -> int:
        """How many forked ClientApps have not been reaped yet."""
        with self._lock:
            return len(self._children)

    def reconcile(self) -> None:
        """Reap finished children; log those that exited with an error or a signal."""
        with self._lock:
            done = {tid: p for tid, p in self._children.items() if not p.is_alive()}
            for tid in done:
                del self._children[tid]
        for task_id, p in done.items():
            if p.exitcode:
                _log.warning("ClientApp of task %d exited with %s", task_id,
                             f"signal {-p.exitcode}" if p.exitcode < 0 else f"code {p.exitcode}")
                expire_task(task_id)
            p.close()

    def close(self) -> None:
        """Stop every child still running (the SuperNode is stopping)."""
        with self._lock:
            children, self._children = list(self._children.values()), {}
        for p in children:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)


@dataclass(frozen=True)
class RuntimeApi:
    """How a SuperExec reaches its SuperNode's Runtime API (what Flower passes to ``flower-superexec``)."""

    address: str
    insecure: bool
    root_certificates_path: str | None = None
    auth_secret: bytes | None = None
    runtime_dependency_install: bool = False


class SuperExecLoop:
    """Flower's SuperExec main loop (``run_superexec``) as a thread, over any Flower ``Executor``.

    Each pass: ``executor.reconcile()``, one ``AcquireTask``; a task is launched through
    ``AutoExecPlugin`` at once and the next poll follows without waiting (another may be
    queued), else the loop waits ``poll_interval`` seconds or until :meth:`pull_ended` says the
    SuperNode stored a message (its task is waiting). While the SuperNode is pulling a message
    (:meth:`pull_started`) the loop does not poll: Flower creates the task before the message's
    objects are stored. A failing poll is logged and retried; it never ends the thread.
    """

    def __init__(self, api: RuntimeApi, *, executor: WarmExecutor, poll_interval: float = DEFAULT_POLL_INTERVAL):
        if not 0.01 <= poll_interval <= 60:
            from clinograph.core.errors import ConfigError

            raise ConfigError(f"SuperExec poll interval {poll_interval} s must be in [0.01, 60] (Flower's own range).")
        self.api, self.executor, self.poll_interval = api, executor, poll_interval
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._pulling = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clinograph-superexec", daemon=True)

    def start(self) -> None:
        """Connect (a bad certificate path fails here, in the caller's thread) and start polling."""
        from flwr.supercore.superexec.plugin import AutoExecPlugin

        self._runtime = self._client()
        self._plugin = AutoExecPlugin(runtime_api_address=self.api.address, insecure=self.api.insecure,
                                      root_certificates_path=self.api.root_certificates_path,
                                      runtime_dependency_install=self.api.runtime_dependency_install,
                                      executor=self.executor)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=timeout)

    def pull_started(self) -> None:
        """The SuperNode began pulling a message: do not poll until :meth:`pull_ended`."""
        self._pulling.set()

    def pull_ended(self, stored: bool) -> None:
        """The SuperNode's pull is over; ``stored``: a message and its task are in place, poll now."""
        self._pulling.clear()
        if stored:
            self._wake.set()

    def _await_pull(self, limit: float = 30.0) -> None:
        """Until the SuperNode's current pull (if any) is over, at most ``limit`` seconds."""
        waited = 0.0
        while self._pulling.is_set() and waited < limit and not self._stop.is_set():
            self._stop.wait(0.01)
            waited += 0.01

    def may_poll(self) -> bool:
        """False while the SuperNode is pulling a message (its task may exist before its objects)."""
        return not self._pulling.is_set()

    def _idle_wait(self) -> None:
        self._wake.wait(self.poll_interval)
        self._wake.clear()

    def _client(self) -> Any:
        from flwr.supercore.interceptors import (
            RuntimeVersionHttpInterceptor,
            SuperExecAuthHttpInterceptor,
        )
        from flwr.supercore.retry import make_simple_http_retry_invoker
        from flwr.supercore.runtime import RuntimeHttpClient
        from flwr.supercore.tls import validate_and_resolve_root_certificates

        interceptors: list = [RuntimeVersionHttpInterceptor(component_name="SuperExec")]
        if self.api.auth_secret:
            interceptors.append(SuperExecAuthHttpInterceptor(master_secret=self.api.auth_secret,
                                                             protected_methods=frozenset(
                                                                 {"/flwr.proto.Runtime/AcquireTask"})))
        return RuntimeHttpClient.from_server_address(
            server_address=self.api.address, insecure=self.api.insecure,
            root_certificates=validate_and_resolve_root_certificates(self.api.root_certificates_path,
                                                                     self.api.insecure),
            interceptors=interceptors, retry_invoker=make_simple_http_retry_invoker())

    def _run(self) -> None:
        from flwr.proto.runtime_pb2 import AcquireTaskRequest

        client, plugin = self._runtime, self._plugin
        # the loop starts before Flower's SuperNode serves its Runtime API: its first poll met a closed
        # port and Flower's retry logged "Connection attempt failed" at every node's start
        await_listening(self.api.address, stop=self._stop)
        try:
            while not self._stop.is_set():
                if not self.may_poll():
                    self._idle_wait()
                    continue
                try:
                    self.executor.reconcile()
                    types, fabs = self.executor.get_eligible_capacity(set(plugin.supported_task_types))
                    res = client.AcquireTask(AcquireTaskRequest(supported_task_types=types,
                                                                agentapp_fab_hashes=fabs))
                    if res.HasField("task") and res.token:
                        self._await_pull()  # acquired while the SuperNode was storing its message
                        launched = plugin.launch_task(token=res.token, task=res.task)
                        if launched.status != "accepted":
                            _log.error("task %d not launched (%s): %s", res.task.task_id, launched.status,
                                       launched.message)
                        continue
                except Exception as exc:  # noqa: BLE001 -- a poll that fails is retried; the loop must not die
                    _log.warning("SuperExec poll failed: %s: %s", type(exc).__name__, str(exc)[:300])
                    self._stop.wait(1.0)
                    continue
                self._idle_wait()
        finally:
            client.close()
