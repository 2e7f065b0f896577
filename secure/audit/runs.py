"""The runs in an audit directory, kept apart: one :class:`Run` per opening of the trail.

Each opening (``audit_open``, ``audit_reopen``) starts a run (entry.py: format 2 entries carry
its id). A directory may hold runs in different
secure modes, so everything the report shows is read per run: never "the last manifest" or
"the latest ε" across runs.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from .entry import AuditEntry
from .kinds import check_payload

OPENINGS = ("audit_open", "audit_reopen")


@dataclass
class Run:
    """The entries of one run, by kind (only payloads that fit their kind's schema)."""

    index: int
    run_id: str | None
    opened: float
    entries: list[AuditEntry] = field(default_factory=list)
    kinds: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))

    @property
    def manifest(self) -> dict[str, Any] | None:
        """The run's latest manifest (a run may re-record it when enrolment changes)."""
        return self.kinds["manifest"][-1] if self.kinds["manifest"] else None

    @property
    def ended(self) -> dict[str, Any] | None:
        """The ``run_ended`` payload, if the run recorded its end."""
        return self.kinds["run_ended"][-1] if self.kinds["run_ended"] else None

    @property
    def release(self) -> dict[str, Any] | None:
        """The ``release`` payload, if the run released a model."""
        return self.kinds["release"][-1] if self.kinds["release"] else None

    def secure_modes(self) -> list[str]:
        """The secure modes the run's rounds used (from the plans), else the manifest's."""
        modes = sorted({p["secure_mode"] for p in self.kinds["round_plan"]})
        if not modes and self.manifest:
            modes = [self.manifest["secure_mode"]]
        return modes

    def rounds(self) -> list[int]:
        """Every round number the run mentions in a plan, aggregate or participation entry."""
        return sorted({p["round"] for k in ("round_plan", "aggregate", "round_participation", "round_aborted")
                       for p in self.kinds[k]})


def split_runs(entries: list[AuditEntry]) -> list[Run]:
    """Cut the entries into runs at each opening (entries before any opening form run 0)."""
    runs: list[Run] = []
    for e in entries:
        if e.kind in OPENINGS or not runs:
            runs.append(Run(index=len(runs) + 1, run_id=e.run, opened=e.time))
        run = runs[-1]
        run.entries.append(e)
        if check_payload(e.kind, e.payload) is None:  # a broken log may hold malformed payloads
            run.kinds[e.kind].append(e.payload)
    return runs
