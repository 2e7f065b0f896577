"""Benchmark-only: trace this Python process if CLINOGRAPH_FLOWER_TRACE is set (see flower_trace.py)."""

import os

if os.environ.get("CLINOGRAPH_FLOWER_TRACE"):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import flower_trace

    flower_trace.install()
