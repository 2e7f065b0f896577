"""Secure by default; insecure only by name.

Every option that weakens privacy or integrity is spelled ``insecure_*``. Using one goes
through :func:`require_allowed`: it warns every time, and refuses in production. The caller
records it in the audit log (the federation manifest lists every insecure option in use).
"""

from __future__ import annotations

import warnings
from typing import Literal

from clinograph.core.errors import SecurityPolicyError

Environment = Literal["development", "production"]


class InsecureOptionWarning(UserWarning):
    """Warned each time an ``insecure_*`` option is used."""


def require_allowed(option: str, *, environment: Environment, why: str,
                    fix: str = "Remove it from the config or use a secure mode.", audited: bool = True) -> None:
    """Warn about insecure ``option``; raise :class:`SecurityPolicyError` in production (``fix``:
    what to do instead, where the option is not a config key, e.g. a command-line flag;
    ``audited``: whether an audit log records the run, as it does a federation's -- not a model
    loaded for prediction)."""
    if not option.startswith("insecure_"):
        raise ValueError(f"{option!r} is not an insecure_* option")
    if environment == "production":
        raise SecurityPolicyError(f"{option!r} is refused because environment = \"production\" ({why}). {fix}")
    marked = " The audit log marks this run insecure." if audited else ""
    warnings.warn(f"{option} is in use: {why}.{marked}", InsecureOptionWarning, stacklevel=2)
