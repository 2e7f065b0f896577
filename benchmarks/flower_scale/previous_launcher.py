"""The SuperNode launcher as it was before the forkserver's HTTP warm-up and the task-poll
wake-up (round_time.py's ``warm_previous`` arm), so that both sides of the comparison run in one
benchmark process: ``python -m benchmarks.flower_scale.previous_launcher`` takes the launcher's
arguments. Benchmark-only."""

from __future__ import annotations

import sys

from clinograph.secure.transport.flower import superexec, supernode

PREVIOUS_PRELOAD = tuple(m for m in superexec.PRELOAD if not m.endswith(".warmup"))


def previous() -> None:
    """No warm-up module in the forkserver; the SuperExec thread polls on its timer only."""
    superexec.WarmExecutor.__init__.__kwdefaults__["preload"] = PREVIOUS_PRELOAD
    supernode.watch_message_pulls = lambda **_: None


if __name__ == "__main__":
    previous()
    sys.exit(supernode.main())
