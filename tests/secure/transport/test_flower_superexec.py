"""The launcher's executors and SuperNode waits (secure/transport/flower/superexec.py, polling.py).

The real-process check that the warm executor runs ClientApps through Flower's runtime, and that
a ClientApp that raises or is killed comes back to the server as an error reply, is
tests/integration/test_flower_warm_executor.py.
"""

import os
import types

import pytest

pytest.importorskip("flwr")

from clinograph.secure.transport.flower import polling  # noqa: E402
from clinograph.secure.transport.flower.superexec import SuperExecLoop, WarmExecutor  # noqa: E402
from clinograph.secure.transport.flower.supernode import executor_args, main, runtime_api  # noqa: E402
from flwr.supercore.constant import TaskType  # noqa: E402
from flwr.supercore.superexec.executor import ExecutionSpec, LaunchResult  # noqa: E402

from clinograph.core.errors import ConfigError  # noqa: E402


def test_warm_runs_the_supernode_in_process_isolation_and_refuses_an_explicit_isolation():
    assert executor_args(["--superlink", "x:1"], executor="warm", poll=None) == \
        ["--superlink", "x:1", "--isolation", "process"]
    with pytest.raises(ConfigError, match=r"--isolation is set by --executor.*--executor subprocess"):
        executor_args(["--isolation", "subprocess"], executor="warm", poll=None)
    with pytest.raises(ConfigError, match="--isolation is set by --executor"):
        executor_args(["--isolation=process"], executor="warm", poll=None)


def test_subprocess_is_flowers_own_path_with_its_poll_interval_from_the_environment(monkeypatch):
    monkeypatch.setenv("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "1")
    assert executor_args(["--isolation", "subprocess"], executor="subprocess", poll=None) == \
        ["--isolation", "subprocess"]
    assert os.environ["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == "1"
    executor_args([], executor="subprocess", poll=0.1)
    assert os.environ["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == "0.1"


def test_the_runtime_api_is_read_with_flowers_own_defaults_and_tls_arguments(tmp_path):
    api = runtime_api(["--superlink", "x:1", "--root-certificates", "ca.pem"])
    assert (api.address, api.insecure, api.root_certificates_path, api.auth_secret) == \
        ("127.0.0.1:9094", True, None, None)
    api = runtime_api(["--host", "0.0.0.0", "--port", "5001", "--ssl-certfile", "c.pem", "--ssl-keyfile", "k.pem",
                       "--ssl-ca-certfile", str(tmp_path / "ca.pem")])
    assert (api.address, api.insecure, api.root_certificates_path) == ("127.0.0.1:5001", False,
                                                                       str(tmp_path / "ca.pem"))


def test_a_poll_interval_outside_flowers_range_is_refused():
    with pytest.raises(ConfigError, match=r"poll interval 0.001 s must be in \[0.01, 60\]"):
        SuperExecLoop(runtime_api([]), executor=WarmExecutor(), poll_interval=0.001)


def test_main_refuses_isolation_with_the_warm_executor(capsys):
    assert main(["--node-config", "hospital='h1' state-dir='/nonexistent/s' key-file='/nonexistent/k'",
                 "--superlink", "127.0.0.1:1", "--isolation", "subprocess"]) == 2
    assert "--isolation is set by --executor" in capsys.readouterr().err


def _spec(task_type: TaskType) -> ExecutionSpec:
    return ExecutionSpec(task_type=task_type, runtime_api_address="127.0.0.1:9094", token="t" * 8, insecure=True,
                         root_certificates_path=None, runtime_dependency_install=False, parent_pid=os.getpid(),
                         suppress_output=False, task_id=7)


def test_a_task_that_is_not_a_clientapp_goes_to_flowers_subprocess_executor():
    launched = []

    class Cold:
        def launch(self, spec):
            launched.append(spec.task_type)
            return LaunchResult.accepted()

    ex = WarmExecutor()
    ex._cold = Cold()
    assert ex.launch(_spec(TaskType.AGENT_APP)).status == "accepted"
    assert launched == [TaskType.AGENT_APP] and ex.running() == 0


def test_the_supernode_clock_shortens_only_flowers_two_fixed_waits():
    slept = []
    clock = polling.SupernodeClock(idle=0.2, reply=0.05, sleep=slept.append)
    for s in (3, 0.5, 1, 0.2):
        clock.sleep(s)
    assert slept == [0.2, 0.05, 1, 0.2]
    assert clock.monotonic is polling.time.monotonic  # everything else is the real time module
    with pytest.raises(ConfigError, match=r"idle wait \(--supernode-poll\) 0 s must be in \[0.01, 3\]"):
        polling.SupernodeClock(idle=0, reply=0.05)


def test_the_idle_poll_grows_while_no_message_comes_and_resets_on_one():
    now = [100.0]
    slept = []
    clock = polling.SupernodeClock(idle=0.2, reply=0.05, idle_max=1.0, sleep=slept.append, monotonic=lambda: now[0])
    waits = []
    for t in (100.0, 100.5, 102.0, 110.0):
        now[0] = t
        waits.append(clock.idle_wait())
    assert waits == [0.2, 0.2, 0.5, 1.0]  # a quarter of the idle time, between 0.2 and 1 s
    clock.message_seen()
    clock.sleep(3)
    assert slept == [0.2] and clock.idle_wait() == 0.2
    with pytest.raises(ConfigError, match=r"idle_max wait 0.1 s is below its idle wait 0.2 s"):
        polling.SupernodeClock(idle=0.2, reply=0.05, idle_max=0.1)


def test_the_idle_poll_floor_is_a_tenth_of_the_last_wait_for_a_message_between_20_and_200_ms():
    now = [0.0]
    clock = polling.SupernodeClock(idle=0.02, reply=polling.DEFAULT_REPLY_WAIT,  # --supernode-poll 0.02
                                   idle_max=polling.DEFAULT_IDLE_POLL_MAX, sleep=lambda s: now.__setitem__(0, now[0] + s),
                                   monotonic=lambda: now[0])
    assert clock.floor == polling.FLOOR_MAX == 0.2  # no wait seen yet
    clock.reply_sent()
    now[0] = 0.15
    clock.message_pulled()  # 3 hospitals: the next message 0.15 s after the reply
    assert clock.floor == 0.02 and polling.DEFAULT_IDLE_POLL == 0.05  # the default floor: module docstring
    clock.reply_sent()
    polls = []
    while now[0] < 8.15:  # then idle for 8 s
        clock.sleep(3)
        polls.append(now[0] - 0.15)
    # a message coming t s after the reply is seen within 0.02 s or a quarter of t, at most 1 s later
    assert max(b - a for a, b in zip(polls, polls[1:], strict=False)) == pytest.approx(1.0)
    assert all(b - a <= max(0.02, 0.25 * a) + 1e-9 for a, b in zip([0.0, *polls], polls, strict=False))
    # polls: 5 in the first 0.1 s, then about three a doubling of the wait: 15 in the first second
    assert sum(t <= 0.1 + 1e-9 for t in polls) == 5 and sum(t <= 1.0 for t in polls) == 15
    clock.message_pulled()  # 20 hospitals: the next message seconds after the reply
    assert clock.floor == 0.2
    now[0] += 1.0
    clock.reply_sent()
    now[0] += 0.5
    clock.message_pulled()
    assert clock.floor == pytest.approx(0.05)
    fixed = polling.SupernodeClock(idle=0.2, reply=0.05, idle_max=1.0)  # --supernode-poll 0.2: never below
    fixed.reply_sent()
    fixed.message_pulled()
    assert fixed.floor == 0.2


def test_after_a_reply_the_node_keeps_quiet_for_half_its_shortest_recent_wait_for_a_message():
    """Flower's loop pulls at once after a reply, and finds nothing: the server sends the next stage
    only once every hospital replied (benchmarks/flower_scale, fourth pass)."""
    now, slept = [0.0], []
    clock = polling.SupernodeClock(idle=0.05, reply=0.05, idle_max=1.0, monotonic=lambda: now[0], sleep=slept.append)
    clock.after_reply()
    assert slept == [] and clock.quiet() == 0.0  # no wait seen yet: Flower's immediate pull
    for gap in (0.3, 0.12, 0.4, 0.5, 0.6, 0.7):  # waits from the reply to the next message
        now[0] += gap
        clock.message_pulled()
        slept.clear()
        clock.after_reply()
    # the shortest of the last five waits (0.12 s, once this node was the last to answer), halved
    assert slept == [pytest.approx(0.06)]
    for _ in range(5):  # 20 hospitals: waits of seconds; never more than idle_max
        now[0] += 4.0
        clock.message_pulled()
        clock.after_reply()
    assert clock.quiet() == 1.0

def test_a_growing_idle_poll_hears_of_every_pulled_message_and_sent_reply(monkeypatch):
    module = types.ModuleType("fake_loop")
    module._pull_and_store_message = lambda found: 7 if found else None
    module._push_messages = lambda: None
    monkeypatch.setattr(polling.inspect, "getsource", lambda m: "time.sleep(3)\ntime.sleep(0.5)\n")
    clock = polling.set_supernode_waits(idle=0.2, reply=0.05, idle_max=1.0, module=module)
    seen = []
    clock.message_seen = lambda: seen.append("seen")
    module._pull_and_store_message(False)
    assert seen == []
    module._pull_and_store_message(True)
    module._push_messages()
    assert seen == ["seen", "seen"] and module.time is clock
    assert clock._replied is not None  # the reply was heard: the next pull learns the wait
    bare = types.ModuleType("bare_loop")  # a loop without the two functions: refused, nothing set
    with pytest.raises(ConfigError, match=r"no _pull_and_store_message\(\), _push_messages\(\)"):
        polling.set_supernode_waits(idle=0.2, reply=0.05, idle_max=1.0, module=bare)
    assert not hasattr(bare, "time")


def test_the_waits_are_set_only_on_a_loop_that_still_has_them(monkeypatch):
    polling.check_supernode_waits()  # the installed Flower 1.41 loop
    module = types.ModuleType("fake_loop")
    module.__file__ = __file__  # this file: it has neither sleep as code
    monkeypatch.setattr(polling.inspect, "getsource", lambda m: "while True:\n    time.sleep(5)\n")
    with pytest.raises(ConfigError, match=r"no longer calls time.sleep\(3\), time.sleep\(0.5\)"):
        polling.set_supernode_waits(idle=0.2, reply=0.05, module=module)
    assert not hasattr(module, "time")
    monkeypatch.setattr(polling.inspect, "getsource", lambda m: "time.sleep(3)\ntime.sleep(0.5)\n")
    polling.set_supernode_waits(idle=0.2, reply=0.05, module=module)
    assert isinstance(module.time, polling.SupernodeClock)


def test_code_a_run_could_bring_to_the_node_is_insecure_by_name():
    """Flower's own executor runs the ClientApp the run's FAB names, and dependency installation runs
    the FAB's packages: each is an insecure option, refused in production, warned in development."""
    from clinograph.secure.policy import InsecureOptionWarning
    from clinograph.secure.transport.flower.supernode import check_run_code

    from clinograph.core.errors import SecurityPolicyError

    check_run_code([], executor="warm", environment="production")  # the default: nothing to refuse
    with pytest.raises(SecurityPolicyError, match="insecure_fab_clientapp"):
        check_run_code([], executor="subprocess", environment="production")
    with pytest.raises(SecurityPolicyError, match="insecure_runtime_dependency_install"):
        check_run_code(["--allow-runtime-dependency-installation"], executor="warm", environment="production")
    with pytest.warns(InsecureOptionWarning, match="insecure_fab_clientapp"):
        check_run_code([], executor="subprocess", environment="development")


def test_the_task_poll_is_held_while_the_supernode_stores_a_message_and_woken_when_it_has():
    loop = SuperExecLoop(runtime_api([]), executor=WarmExecutor())
    assert loop.may_poll() and not loop._wake.is_set()
    loop.pull_started()
    assert not loop.may_poll()
    loop.pull_ended(False)  # an idle pull: nothing to wake for
    assert loop.may_poll() and not loop._wake.is_set()
    loop.pull_started()
    loop.pull_ended(True)
    assert loop.may_poll() and loop._wake.is_set()
    loop._idle_wait()  # returns at once (woken) and is ready for the next wake
    assert not loop._wake.is_set()


def test_pulls_are_watched_only_on_a_loop_that_still_has_its_pull_function():
    calls = []
    module = types.ModuleType("fake_loop")

    def pull(found):
        if found == "boom":
            raise RuntimeError("pull failed")
        return 7 if found else None

    module._pull_and_store_message = pull
    polling.watch_message_pulls(started=lambda: calls.append("start"), ended=calls.append, module=module)
    assert module._pull_and_store_message(True) == 7 and module._pull_and_store_message(False) is None
    with pytest.raises(RuntimeError, match="pull failed"):
        module._pull_and_store_message("boom")
    assert calls == ["start", True, "start", False, "start", False]
    with pytest.raises(ConfigError, match=r"no _pull_and_store_message\(\).*Install flwr 1.41"):
        polling.watch_message_pulls(started=list, ended=print, module=types.ModuleType("other_loop"))


def test_the_forkserver_loads_httpx_transport_before_any_clientapp_is_forked():
    """A forked ClientApp's first httpx.Client used to import httpcore and h11 (0.26-0.54 s a message)."""
    import subprocess
    import sys

    from clinograph.secure.transport.flower import warmup
    from clinograph.secure.transport.flower.superexec import PRELOAD

    assert "clinograph.secure.transport.flower.warmup" in PRELOAD
    # importing httpx or Flower's client module alone loads none of the three (checked); run only the module
    code = (f"import runpy, sys; runpy.run_path({warmup.__file__!r}); "
            "print(all(m in sys.modules for m in ('httpcore', 'h11', 'certifi')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_an_object_not_stored_yet_is_retried_after_50_ms_on_a_flower_that_still_waits_1_s():
    def pull_objects(object_ids, *, initial_backoff=1, backoff_cap=10):
        return initial_backoff

    polling.set_object_pull_backoff(function=pull_objects)
    assert pull_objects([]) == polling.DEFAULT_PULL_BACKOFF == 0.05
    polling.set_object_pull_backoff(function=pull_objects)  # again: already set, accepted

    def other(object_ids, *, initial_backoff=2):
        return initial_backoff

    with pytest.raises(ConfigError, match="no longer has initial_backoff=1"):
        polling.set_object_pull_backoff(function=other)
    assert other([]) == 2
    from flwr.supercore.inflatable.inflatable_utils import pull_objects as flowers

    assert flowers.__kwdefaults__["initial_backoff"] in (polling.FLOWER_PULL_BACKOFF, polling.DEFAULT_PULL_BACKOFF)  # 1.41


@pytest.mark.parametrize(("given", "message"), [
    (0.1, r"idle_max wait 0.1 s is below its idle wait 0.2 s: pass a --supernode-poll-max"),
    (0.0, r"idle_max wait \(--supernode-poll-max\) 0.0 s must be in \[0.01, 3\]"),
    (-1.0, r"idle_max wait \(--supernode-poll-max\) -1.0 s must be in"),
])
def test_a_bad_supernode_poll_max_is_refused_not_raised_to_the_idle_poll(given, message):
    """--supernode-poll-max below --supernode-poll or out of range was silently raised to it."""
    with pytest.raises(ConfigError, match=message):
        polling.SupernodeClock(idle=0.2, reply=0.05, idle_max=polling.idle_poll_max(0.2, given))
    assert polling.idle_poll_max(2.0, None) == 2.0 and polling.idle_poll_max(0.2, None) == polling.DEFAULT_IDLE_POLL_MAX


class _TokenState:
    """The parts of Flower 1.41's InMemoryNodeState that crash_report.expire_task uses."""

    def __init__(self, status: str):
        import threading
        from datetime import timedelta

        from flwr.supercore.date import now

        self.lock_task_store = threading.Lock()
        self.task_store = {7: types.SimpleNamespace(status=types.SimpleNamespace(status=status))}
        self.task_token_store = {7: types.SimpleNamespace(active_until=now() + timedelta(seconds=60))}
        self.cleaned: list[bool] = []

    def _cleanup_expired_task_tokens_locked(self) -> None:
        from flwr.supercore.date import now

        self.cleaned.append(self.task_token_store[7].active_until < now())


def test_a_clientapp_that_died_running_is_answered_at_once_and_only_then(monkeypatch):
    from clinograph.secure.transport.flower import crash_report, superexec
    from flwr.common.constant import Status

    running = _TokenState(Status.RUNNING)
    assert crash_report.expire_task(7, state=running) and running.cleaned == [True]  # Flower's clean-up, now
    starting = _TokenState(Status.STARTING)  # left to Flower: it would queue the task again
    assert not crash_report.expire_task(7, state=starting) and starting.cleaned == []
    assert not crash_report.expire_task(8, state=running)  # no such task
    assert not crash_report.expire_task(7, state=types.SimpleNamespace())  # another Flower's state: nothing
    factory = type("Factory", (), {"state": lambda self: running})
    monkeypatch.setitem(crash_report._node, "state", None)  # restored after the test
    crash_report.capture_node_state(factory)
    crash_report.capture_node_state(factory)  # once is enough
    assert factory().state() is running and crash_report._node["state"] is running
    expired = []
    monkeypatch.setattr(superexec, "expire_task", expired.append)
    ex = WarmExecutor()
    ex._children = {3: types.SimpleNamespace(is_alive=lambda: False, exitcode=0, close=lambda: None),
                    4: types.SimpleNamespace(is_alive=lambda: False, exitcode=-9, close=lambda: None),
                    5: types.SimpleNamespace(is_alive=lambda: True, exitcode=None, close=lambda: None)}
    ex.reconcile()
    assert expired == [4] and list(ex._children) == [5]  # a clean exit (it replied) is not expired


def test_a_forked_clientapp_logs_no_blank_line_at_its_exit_and_no_colours_off_a_terminal():
    """Flower's `flwr_exit` logs an empty INFO line when a ClientApp ends cleanly: one blank,
    coloured line a message in the hospital's log (seen on a loopback run of the deployment guide,
    traced to flwr/supercore/exit/exit.py); the text of every other record, and an empty ERROR, stay."""
    import logging

    from clinograph.secure.transport.flower.superexec import quiet_clientapp_logging
    from flwr.common.logger import console_handler

    flwr_logger = logging.getLogger("flwr")
    saved_filters, saved_colored = list(flwr_logger.filters), console_handler.colored
    flwr_logger.filters.clear()  # what other tests of this process installed is not under test here
    seen, tracebacks = [], []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append((record.levelno, record.getMessage()))
            tracebacks.append(record.exc_info)

    keep = Keep()
    flwr_logger.addHandler(keep)
    try:
        quiet_clientapp_logging()
        quiet_clientapp_logging()  # idempotent: one filter
        flwr_logger.info("")
        flwr_logger.info("  ")
        flwr_logger.info("ClientApp raised")
        flwr_logger.error("")
        assert seen == [(logging.INFO, "ClientApp raised"), (logging.ERROR, "")]
        assert console_handler.colored is False  # stderr is captured here, not a terminal
        assert len(flwr_logger.filters) == 2
        # a hospital's refusal raised in the ClientApp: one line naming it, not Flower's traceback
        from clinograph.core.errors import ProtocolError

        seen.clear()
        try:
            raise ProtocolError("Hospital 'h3' refused the 'hello' message: ConfigError: no hospital.toml")
        except ProtocolError as exc:
            flwr_logger.error("ClientApp raised an exception", exc_info=exc)
        assert seen == [(logging.ERROR, "ClientApp raised an exception: ProtocolError: Hospital 'h3' refused the "
                                        "'hello' message: ConfigError: no hospital.toml")]
        assert tracebacks[-1] is None
    finally:
        flwr_logger.removeHandler(keep)
        flwr_logger.filters[:] = saved_filters
        console_handler.colored = saved_colored


def test_the_superexec_loop_waits_for_the_runtime_api_to_listen_before_its_first_poll():
    """Every SuperNode start logged Flower's 'Connection attempt failed, retrying': our SuperExec
    polled the node's Runtime API before Flower's SuperNode served it."""
    import socket
    import threading
    import time

    from clinograph.secure.transport.flower.superexec import await_listening

    stop = threading.Event()
    from listen_port import reserve_port

    port = reserve_port()  # free, and nothing listens there
    started = time.monotonic()
    assert await_listening(f"127.0.0.1:{port}", stop=stop, limit=0.2) is False
    assert 0.15 < time.monotonic() - started < 2.0
    server = socket.socket()
    try:
        timer = threading.Timer(0.1, lambda: (server.bind(("127.0.0.1", port)), server.listen()))
        timer.start()
        assert await_listening(f"127.0.0.1:{port}", stop=stop, limit=5.0) is True  # once it listens
        timer.join()
    finally:
        server.close()
    stop.set()
    assert await_listening(f"127.0.0.1:{port}", stop=stop, limit=5.0) is False  # stopped: no wait
