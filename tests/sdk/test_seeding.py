"""sdk/seeding.py: torch's and numpy's process-wide generators borrowed and given back."""

from __future__ import annotations

import os
import threading

import numpy as np
import torch
from clinograph.sdk import seeding
from clinograph.sdk.seeding import numpy_seeded, torch_seeded


def test_a_seeded_block_draws_what_manual_seed_draws_and_gives_the_hosts_state_back():
    torch.manual_seed(5)
    want = torch.rand(4)
    torch.manual_seed(3)
    reference = torch.rand(6)  # what a bare torch.manual_seed(3) gave the old code
    torch.manual_seed(5)
    with torch_seeded(3):
        got = torch.rand(6)
    assert torch.equal(got, reference)
    assert torch.equal(torch.rand(4), want)  # the host's next draws, as if nothing ran
    np.random.seed(8)
    host = np.random.random_sample(2)
    np.random.seed(8)
    with numpy_seeded():
        np.random.seed(1)
        np.random.random_sample(5)
    assert np.array_equal(np.random.random_sample(2), host)


def test_a_forked_child_is_not_stuck_on_a_lock_another_thread_held_at_the_fork():
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with seeding._LOCK:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: only this thread; the holder did not come along
        ok = seeding._LOCK.acquire(timeout=5)
        os._exit(0 if ok else 1)
    release.set()
    thread.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
