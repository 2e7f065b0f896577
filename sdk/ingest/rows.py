"""Row references in messages: 1-based data-row numbers, the first five, then a count."""

from __future__ import annotations

import numpy as np


def rows_text(mask: np.ndarray) -> str:
    """``"row 3"`` / ``"rows 1, 4, 9 (and 12 more)"`` for the True entries of ``mask``."""
    idx = np.flatnonzero(np.asarray(mask)) + 1
    shown = ", ".join(str(i) for i in idx[:5])
    more = f" (and {len(idx) - 5} more)" if len(idx) > 5 else ""
    return f"row{'s' if len(idx) > 1 else ''} {shown}{more}"
