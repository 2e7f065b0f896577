"""A simulation refused before round 1: its audit log is kept, set aside, and the rerun is free.

When every hospital refuses the run before any round closes (an ε budget the first round would
exceed, a plan their settings refuse), nothing was released: no aggregate, no model, no set-up sum.
The audit log still holds the signed plan and the hospitals' signed refusals, and each hospital
anchored its head in its state (``audit_anchor.json``): it is evidence, so it is not deleted. It is
moved to ``<output>/audit-refused-<UTC time>``, where ``clinograph audit verify`` checks it, and
``<output>/audit`` is free for the same command to run again (it refuses a directory holding a run).
"""

from __future__ import annotations

import time
from pathlib import Path

from clinograph.core.errors import IntegrityError, ProtocolError

#: entries a run refused before round 1 writes; any other kind (an aggregate, a release, a set-up sum,
#: metrics, a model choice) means something was released, and the audit directory stays where it is
_REFUSAL_KINDS = frozenset({"audit_open", "audit_reopen", "manifest", "resolved_default", "insecure_option",
                            "round_plan", "hospital_refused", "round_aborted", "round_participation", "run_ended",
                            "unattributed_refusals", "update_rejected", "hospital_suspended", "hospital_retired"})
#: what an artefact or envelope entry of such a run may be: the signed plan, the signed refusals
_REFUSAL_FILES = {"artefact": frozenset({"round_plan"}), "envelope": frozenset({"hospital_refusal"})}


def _refused_before_release(audit_dir: Path) -> tuple[list[dict], int] | None:
    """The run's refusal entries and its entry count if the log at ``audit_dir`` verifies and shows
    runs that all ended with no round completed and nothing released; else None."""
    from clinograph.secure.audit import verify_audit_dir
    from clinograph.secure.audit.read import entries as read_entries

    try:
        entries = read_entries(audit_dir)
    except (OSError, ValueError, IntegrityError):  # not this run's readable log: left where it is
        return None
    if not entries:
        return None
    for e in entries:
        kind, payload = e.get("kind"), e.get("payload") or {}
        allowed = _REFUSAL_FILES.get(kind)
        if (kind not in _REFUSAL_KINDS and allowed is None) or (allowed is not None and payload.get("kind") not in allowed):
            return None
    ended = [e["payload"] for e in entries if e.get("kind") == "run_ended"]
    if not ended or any(p.get("rounds_completed") != 0 for p in ended) or not verify_audit_dir(audit_dir).ok:
        return None  # verified last: a run that released something is not read twice
    return [e["payload"] for e in entries if e.get("kind") in ("hospital_refused", "run_ended")], len(entries)


class RunRefused(ProtocolError):
    """A run every hospital refused before round 1 (see the module): the refusal, and what
    :func:`set_aside_refused_run` needs to move the log without reading it again."""

    def __init__(self, message: str, *, payloads: list[dict], count: int):
        super().__init__(message)
        self.payloads, self.count = payloads, count


def refusal(audit_dir: Path) -> RunRefused | None:
    """The error to raise if the run logged at ``audit_dir`` was refused before round 1 with nothing
    released (its log left where it is); else None."""
    found = _refused_before_release(Path(audit_dir))
    return None if found is None else _error(*found, kept=Path(audit_dir), moved_from=None)


def set_aside_refused_run(audit_dir: Path, refused: RunRefused) -> RunRefused:
    """Move the audit directory of the run ``refused`` (:func:`refusal`'s, read and verified there)
    aside (see the module) and return the refusal to raise, naming where it went."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    kept = audit_dir.with_name(f"audit-refused-{stamp}")
    n = 1
    while kept.exists():
        n += 1
        kept = audit_dir.with_name(f"audit-refused-{stamp}-{n}")
    audit_dir.rename(kept)
    return _error(refused.payloads, refused.count, kept=kept, moved_from=audit_dir)


def _error(payloads: list[dict], count: int, *, kept: Path, moved_from: Path | None) -> RunRefused:
    ended = next((p for p in reversed(payloads) if "rounds_completed" in p), {})
    why = str(ended.get("reason") or "").rstrip(". ")  # the run's end names each hospital's refusal
    if not why:
        why = "; ".join(f"{p['client']}: {p['reason']}" for p in payloads if "client" in p and "reason" in p)
    then = (f"{moved_from} is free: fix the cause and run the same command again." if moved_from is not None else
            "Fix the cause and run again with another audit directory (a run is refused where one is logged).")
    return RunRefused(
        f"The run was refused before round 1: {why or 'no hospital took part'}. No round closed and nothing was "
        f"released. Its audit log ({count} entries: the plan and the hospitals' signed refusals, which they "
        f"anchored) is kept in {kept}; `clinograph audit verify {kept}` checks it. {then}", payloads=payloads,
        count=count)
