"""Settings for the tests of research code (research/<study>/tests), as tests/conftest.py: torch
single-threaded (the 2-core machine; thread oversubscription made small models much slower)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

try:
    import torch
except ModuleNotFoundError:  # the server-only install has no torch
    torch = None

if torch is not None:
    torch.set_num_threads(1)
