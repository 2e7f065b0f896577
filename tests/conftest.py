"""Suite-wide settings.

torch runs single-threaded in tests: on the 2-core CI machine the models here are small and
thread oversubscription (pytest + torch's intra-op pool) made them up to 50x slower.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

try:
    import torch
except ModuleNotFoundError:  # the server-only install has no torch
    torch = None

if torch is not None:
    torch.set_num_threads(1)


# -- Scheduling under pytest-xdist (`make test`: ``-n 3 --dist loadscope``) -------------------
# A test module is one unit of work, so its module-scoped fixtures (a trained task, a PostgreSQL
# cluster, a Chromium driver, seven harness federations) are built once, on one worker. The
# modules in SPLIT are the exception: their tests share nothing expensive (each starts its own
# processes or federation), so they go to the workers one by one, except the tests TOGETHER
# names (e.g. the two that share one demo run in test_cli.py). (xdist's own xdist_group marks
# are not used: xdist 3.8 sets ``item._nodeid``, which pytest 9 no longer reads.)
# Units start longest first (SECONDS: rough serial seconds on a quiet 2-core machine, from
# `--durations=0`; unlisted units count as short and keep their file order): a long unit that
# started last would end last, alone. Nothing here changes what a test runs or asserts; a
# serial `pytest` runs the same order.
# Side by side is safe: every server (SuperLink, SuperNode, PostgreSQL) takes a free port and
# its own temporary folder, and .venv-server is built under a file lock (tests/lean_env.py).
SPLIT = (
    "tests/clinograph/test_cli.py",
    "tests/examples/test_examples.py",
    "tests/integration/test_flower_deployment.py",
    "tests/integration/test_tasks_over_flower.py",
    "tests/integration/test_cli_run_flower.py",
)
TOGETHER = {"tests/clinograph/test_cli.py::test_demo_": "cli_demo"}
KILLED_SERVERAPP = "tests/integration/test_cli_run_flower.py::test_a_killed_serverapp_makes_clinograph_run_exit_4"  # test-id prefix -> unit
SECONDS = {  # a unit's (a module, a TOGETHER name, or a test of a SPLIT module)
    "tests/integration/test_flower_one_run.py": 120,
    "tests/integration/test_setup_over_flower.py": 65,
    "tests/integration/test_flower_deployment.py": 95,
    "tests/integration/test_cli_run_flower.py": 20,
    KILLED_SERVERAPP: 70,
    "tests/integration/test_flower_warm_executor.py": 80,
    "tests/examples/test_flower_loopback_guide.py": 75,
    "tests/integration/test_flower_resume.py": 30,
    "tests/integration/test_concepts_over_flower.py": 55,  # its real-process voted run: ~42 s
    "tests/secure/audit/test_report_scenarios.py": 60,
    "cli_demo": 45,
    "tests/examples/test_examples.py": 35,
    "tests/clinograph/test_cli.py": 20,
}
LONG, MAX_LONG = 60, 2  # seconds, units; see LongestFirst
#: Long units that mostly wait (idle processes, not CPU): they start early but do not count toward
#: MAX_LONG. The killed-ServerApp test waits about 60 s for Flower's SuperLink to miss the dead
#: ServerApp's heartbeats (2 x 30 s, Flower's constants) before `clinograph run` can report it lost.
IDLE = frozenset({KILLED_SERVERAPP})


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def unit(nodeid: str) -> str:
    """The unit of work a test belongs to: a TOGETHER name, the test itself, or its module."""
    for prefix, name in TOGETHER.items():
        if nodeid.startswith(prefix):
            return name
    return nodeid if _module(nodeid) in SPLIT else _module(nodeid)


def _seconds(scope: str) -> int:
    return SECONDS.get(scope, SECONDS.get(_module(scope), 0))


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: -_seconds(unit(item.nodeid)))  # stable: file order otherwise


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook; without xdist it is never called
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` with the units above, in the order above (see LongestFirst)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LongestFirst(LoadScopeScheduling):
        """Two changes to which unit a worker gets next (the head of the queue otherwise):
        a worker always holds the next unit it will run (it needs the next test to tear down
        fixtures), so one busy with a long unit gets a short one (the queue's tail), which would
        wait behind it; and at most MAX_LONG long units run at once (each real-process Flower
        run starts three ClientApp processes a message: more at once starve the two cores), an
        IDLE one (mostly waiting) beside them."""

        def _split_scope(self, nodeid: str) -> str:
            return unit(nodeid)

        def _busy_with_long(self, node, *, idle: bool = True) -> bool:
            return any(_seconds(scope) >= LONG and (idle or scope not in IDLE) and not all(tests.values())
                       for scope, tests in self.assigned_work.get(node, {}).items())

        def _assign_work_unit(self, node) -> None:
            queue = list(self.workqueue)
            pick = queue[0]
            if self._busy_with_long(node):
                pick = queue[-1]
            elif sum(self._busy_with_long(n, idle=False) for n in self.assigned_work if n is not node) >= MAX_LONG:
                pick = next((scope for scope in queue if _seconds(scope) < LONG), pick)
            self.workqueue.move_to_end(pick, last=False)
            super()._assign_work_unit(node)

    config.option.loadscopereorder = False  # keep the order above (not "most tests first")
    return LongestFirst(config, log)
