"""Row references in messages: 1-based data-row numbers, the first five, then a count."""

from __future__ import annotations

import numpy as np


def rows_text(mask: np.ndarray, at: np.ndarray | None = None) -> str:
    """``"row 3"`` / ``"rows 1, 4, 9 (and 12 more)"`` for the True entries of ``mask``.

    ``at``: the table's 0-based row of each entry of ``mask`` when ``mask`` covers some of its rows
    (a long table's rows of one feature code); None: entry i is row i.
    """
    idx = np.flatnonzero(np.asarray(mask))
    idx = (idx if at is None else np.asarray(at)[idx]) + 1
    shown = ", ".join(str(i) for i in idx[:5])
    more = f" (and {len(idx) - 5} more)" if len(idx) > 5 else ""
    return f"row{'s' if len(idx) > 1 else ''} {shown}{more}"
