"""Liveness: a hospital that keeps missing rounds is suspended, and may come back.

A dead hospital left invited costs every round its stage timeouts and, in masked mode, a share
of the dropout budget. After ``suspend_after`` consecutive rounds in which a hospital did not
contribute (silent, refused, or dropped at any stage), it is no longer invited; every
``retry_every`` rounds after that it is invited once more, and if it contributes it is back.
Both transitions are audit entries (``hospital_suspended``, ``hospital_rejoined``), so the
auditor sees who was expected when. ``suspend_after = 0`` keeps every hospital invited.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from clinograph.core.errors import ConfigError


@dataclass
class Liveness:
    """Who is invited to the next round, from who contributed to the previous ones."""

    suspend_after: int
    retry_every: int
    missed: dict[str, int] = field(default_factory=dict)
    suspended: dict[str, int] = field(default_factory=dict)  # hospital -> round it was suspended in

    def __post_init__(self) -> None:
        if self.suspend_after < 0 or self.retry_every < 1:
            raise ConfigError(f"Liveness needs suspend_after >= 0 and retry_every >= 1, got {self.suspend_after} "
                              f"and {self.retry_every}.")

    def invited(self, round_: int, available: Iterable[str]) -> tuple[str, ...]:
        """The hospitals to invite to ``round_``: the live ones, plus suspended ones due a retry."""
        out = []
        for name in sorted(available):
            since = self.suspended.get(name)
            if since is None or (round_ - since) % self.retry_every == 0 and round_ > since:
                out.append(name)
        return tuple(out)

    def observe(self, round_: int, invited: Iterable[str], contributors: Iterable[str]) -> list[tuple[str, dict[str, Any]]]:
        """Update from a closed round; returns the audit records (kind, payload) it implies."""
        records: list[tuple[str, dict[str, Any]]] = []
        done = set(contributors)
        for name in sorted(invited):
            if name in done:
                self.missed[name] = 0
                if self.suspended.pop(name, None) is not None:
                    records.append(("hospital_rejoined", {"round": round_, "hospital": name}))
                continue
            self.missed[name] = self.missed.get(name, 0) + 1
            if self.suspend_after and name not in self.suspended and self.missed[name] >= self.suspend_after:
                self.suspended[name] = round_
                records.append(("hospital_suspended", {"round": round_, "hospital": name,
                                                       "missed_rounds": self.missed[name],
                                                       "retry_every": self.retry_every}))
        return records
