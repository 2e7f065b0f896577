"""Category codes as written in tables: one normal form, so "3", "3.0" and " 3 " are one code.

Binary and categorical cells, dictionary levels and the keys of a site schema's ``coding`` are
all compared in this form: surrounding whitespace dropped, numbers written canonically
(``"3.0"`` -> ``"3"``, ``"1e0"`` -> ``"1"``), text case-folded (``"F"`` == ``"f"``).
"""

from __future__ import annotations

import math

MAX_CODES_SHOWN = 10
MAX_CODE_CHARS = 20
MIN_CODE_COUNT = 2


def normalise_code(text: object) -> str:
    """The normal form of one code (see the module docstring)."""
    s = str(text).strip()
    try:
        f = float(s)
    except ValueError:
        return s.casefold()
    if not math.isfinite(f):
        return s.casefold()
    if f.is_integer() and abs(f) < 1e15:
        return str(int(f))
    return repr(f)


def shown_codes(counts: dict[str, int]) -> list[str]:
    """The codes of ``counts`` an error may show (see :func:`describe_codes`), most frequent first."""
    return sorted((c for c, n in counts.items() if n >= MIN_CODE_COUNT and len(c) <= MAX_CODE_CHARS),
                  key=lambda c: (-counts[c], c))[:MAX_CODES_SHOWN]


def describe_codes(counts: dict[str, int]) -> str:
    """The codes seen in a column, as an error may show them without leaking patient data.

    Codes are categories, not patient values, but a free-text cell is not a code: a code is
    shown only if it occurs in at least :data:`MIN_CODE_COUNT` rows and is at most
    :data:`MAX_CODE_CHARS` characters long; at most :data:`MAX_CODES_SHOWN` are shown. The
    rest are counted, never shown.
    """
    shown = shown_codes(counts)
    hidden = len(counts) - len(shown)
    parts = [", ".join(repr(c) for c in shown)] if shown else []
    if hidden:
        parts.append(f"{hidden} other code(s) not shown (seen in one row only, longer than {MAX_CODE_CHARS} "
                     f"characters, or beyond the first {MAX_CODES_SHOWN})")
    return "; ".join(parts)
