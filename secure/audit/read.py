"""Reading an audit log's entries by kind, for the SDK's own summaries (the demo's privacy lines,
the support matrix, a refused run): the one reader of ``audit.jsonl`` outside the verifier.

It *reads*, it does not verify: the chain, signatures and payload schemas are
:func:`.verify.verify_audit_dir`'s. A caller that shows what it reads to an auditor verifies first;
the summaries a run prints about its own fresh log do not. The file is read as the verifier reads
it (a regular file, at most :data:`.verify.MAX_LOG_BYTES`); a line that is not a JSON object with a
``kind`` and an object ``payload`` is an :class:`~clinograph.core.errors.IntegrityError` naming
its line, not skipped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clinograph.core.errors import IntegrityError

from .verify import LOG, MAX_LOG_BYTES, read_regular_file


def entries(audit_dir: Path) -> list[dict[str, Any]]:
    """Every entry of ``audit_dir``'s log in order (``seq``, ``kind``, ``payload``, ...), parsed,
    not verified; [] when the directory holds no log yet."""
    path = Path(audit_dir) / LOG
    if not path.exists():
        return []
    out = []
    for number, line in enumerate(read_regular_file(path, limit=MAX_LOG_BYTES).decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if not (isinstance(entry, dict) and isinstance(entry.get("kind"), str) and isinstance(entry.get("payload"), dict)):
            raise IntegrityError(f"{path}, line {number}: not an audit entry (a JSON object with a kind and an object "
                                 "payload). `clinograph audit verify` on the folder says what is wrong with it.")
        out.append(entry)
    return out


def payloads(audit_dir: Path, kind: str) -> list[dict[str, Any]]:
    """The payloads of ``audit_dir``'s entries of ``kind``, in log order (not verified: see the module)."""
    return [e["payload"] for e in entries(audit_dir) if e["kind"] == kind]
