"""The demo data's ALARM sampler leaves numpy's global generator as the caller left it
(sdk/datasets/alarm.py: pgmpy's forward_sample(seed=) calls np.random.seed)."""

from __future__ import annotations

import numpy as np
from clinograph.sdk.datasets.alarm import sample_alarm


def test_sampling_alarm_keeps_the_hosts_numpy_global_state():
    np.random.seed(11)
    want = np.random.random_sample(3)  # the host's next draws without Clinograph
    np.random.seed(11)
    assert len(sample_alarm(4, seed=3)) == 4
    assert np.array_equal(np.random.random_sample(3), want)
