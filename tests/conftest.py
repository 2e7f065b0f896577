"""Suite-wide settings.

torch runs single-threaded in tests: on the 2-core CI machine the models here are small and
thread oversubscription (pytest + torch's intra-op pool) made them up to 50x slower.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

try:
    import torch
except ModuleNotFoundError:  # the server-only install has no torch
    torch = None

if torch is not None:
    torch.set_num_threads(1)
