"""Audited artefacts: the signed, hash-chained audit log and the artefact store.

Everything the server publishes goes through :class:`AuditTrail` (``publish`` writes the
content-addressed file and its audit entry in one step); :func:`verify_audit_dir` checks a
directory byte for byte; :func:`render_report` turns it into one self-contained HTML page.
Payload schemas of each entry kind are in :mod:`clinograph.secure.audit.kinds`.
"""

from __future__ import annotations

from pathlib import Path

from clinograph.core.arguments import checked_arguments

from .entry import AuditEntry
from .trail import AuditTrail
from .verify import TrustedKey, VerifyReport, verify_audit_dir


@checked_arguments(unchecked=("trusted_server_key",))  # trusted_key_bytes names its forms
def render_report(directory: Path, *, out: Path, trusted_server_key: TrustedKey = None) -> Path:
    """Render the audit report (see :mod:`clinograph.secure.audit.report`), the signer checked
    against ``trusted_server_key`` if given (as :func:`verify_audit_dir` takes it); imports
    matplotlib lazily."""
    from .report import render_report as _render

    return _render(directory, out=out, trusted_server_key=trusted_server_key)


__all__ = ["AuditEntry", "AuditTrail", "VerifyReport", "render_report", "verify_audit_dir"]
