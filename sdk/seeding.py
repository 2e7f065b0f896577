"""The process-wide generators, borrowed and given back: Clinograph embedded in a host's process
leaves torch's and numpy's global random state as it found it.

Code that needs a fixed draw passes its own ``torch.Generator`` / ``np.random.default_rng``.
Where a library draws from the process-wide generator and takes none -- ``nn.Linear``'s
initialisation (every model's ``init_seed``), dropout, pgmpy's ``forward_sample(seed=)``,
which calls ``np.random.seed`` -- the draw runs inside :func:`torch_seeded` or
:func:`numpy_seeded`: the generator is seeded for the block and its state is put back after it,
so the draws are those a bare ``torch.manual_seed(seed)`` gave (the same numbers) and the
host's next draw is the one it would have made without Clinograph.

The global generator is one per process, so two threads seeding it would interleave their
draws: the blocks hold one lock (:data:`_LOCK`), and two hospitals built in two threads get the
weights each gets alone. Host code that draws from the global generator *while* such a block
runs on another thread can still take a number from inside it; Clinograph's own code does not.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

#: One for both generators: a block may hold the other (re-entrant: a seeded block may call another).
_LOCK = threading.RLock()


def _new_lock_in_child() -> None:
    """A forked child (``[simulation] workers``) starts with a free lock: one held by another of the
    parent's threads at the fork would stay held in the child, which has no such thread to release it."""
    global _LOCK
    _LOCK = threading.RLock()


os.register_at_fork(after_in_child=_new_lock_in_child)


@contextmanager
def torch_seeded(seed: int) -> Iterator[None]:
    """torch's process-wide CPU generator seeded with ``seed`` inside the block, its state as the
    caller left it after (``torch.random.fork_rng``). Only the CPU generator: a host's CUDA
    generators are neither seeded nor touched (Clinograph builds and trains on the CPU)."""
    import torch

    with _LOCK, torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(int(seed))
        yield


@contextmanager
def numpy_seeded() -> Iterator[None]:
    """numpy's legacy global generator (``np.random.seed``, what pgmpy's samplers seed) put back
    after the block as the caller left it; the block seeds it itself."""
    with _LOCK:
        state = np.random.get_state()
        try:
            yield
        finally:
            np.random.set_state(state)
