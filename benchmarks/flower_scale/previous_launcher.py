"""The SuperNode launcher as it was before the forkserver's HTTP warm-up, the task-poll wake-up
and the growing idle poll (the ``warm_previous`` arm of round_time.py and flower_scale.py), so that both sides of the comparison run in one
benchmark process: ``python -m benchmarks.flower_scale.previous_launcher`` takes the launcher's
arguments. Benchmark-only."""

from __future__ import annotations

import sys

from clinograph.secure.transport.flower import superexec, supernode

PREVIOUS_PRELOAD = tuple(m for m in superexec.PRELOAD if not m.endswith(".warmup"))


def previous() -> None:
    """No warm-up module in the forkserver; the SuperExec thread polls on its timer only, every 0.1 s;
    the SuperNode's idle poll a fixed 0.2 s. (Flower's 1 s object pull backoff is kept in every process
    of the arm by flower_trace.PREVIOUS; the ServerApp's reply poll by run config ``reply-poll=0.2``.)"""
    superexec.WarmExecutor.__init__.__kwdefaults__["preload"] = PREVIOUS_PRELOAD
    supernode.watch_message_pulls = lambda **_: None
    supernode.DEFAULT_POLL_INTERVAL = 0.1
    supernode.DEFAULT_IDLE_POLL_MAX = supernode.DEFAULT_IDLE_POLL


if __name__ == "__main__":
    previous()
    sys.exit(supernode.main())
