"""pytest plugin: every ``[simulation] workers = "auto"`` simulation runs on 2 worker processes.

``make test`` runs on a loaded 2-core machine, where ``"auto"`` mostly stays serial (other test
workers are busy), so the worker path would go untested by most of the suite. ``make test-workers``
runs the simulation-heavy tests again with this plugin (``-p tests.force_workers``; not through
PYTHONPATH=tests, which the CLI subprocesses would inherit: tests/clinograph would shadow the package): whatever the load
or the threads, ``"auto"`` means 2 workers (at most one a hospital). An explicit count is kept.
"""

from __future__ import annotations

import threading

from clinograph.sdk import config as _config

_worker_count = _config.SimulationSection.worker_count


def _forced(self, hospitals, *, load=None):  # noqa: ANN001, ANN202 - the patched method's signature
    if self.workers == "auto":
        return max(1, min(2, hospitals))
    return _worker_count(self, hospitals, load=load)


_config.SimulationSection.worker_count = _forced
threading.active_count = lambda: 1  # fork as an explicit count does (run it without xdist: Makefile)
