"""``clinograph audit``: verify an audit directory and render the auditor's report.

Mounted by the main CLI as ``app.add_typer(audit.app, name="audit")``. Both commands print
problems on stderr and exit 1; they never end in a traceback.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import Annotated

import typer

from clinograph.secure.errors import ClinographError

# clinograph.secure.audit (and matplotlib, for the report) is imported by the commands that
# use it, so that `clinograph --help` and the other commands start quickly.

app = typer.Typer(name="audit", help="Verify audit logs and render audit reports.", no_args_is_help=True,
                  pretty_exceptions_enable=False)


def _trusted_key(value: str | None) -> bytes | None:
    if value is None:
        return None
    text = Path(value).read_text().strip() if Path(value).is_file() else value.strip()
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        typer.echo(f"--trusted-key must be the server's Ed25519 public key as base64 (32 bytes), "
                   f"or a file holding it; got {len(raw)} byte(s).", err=True)
        raise typer.Exit(2)
    return raw


def _fail(message: str) -> None:
    typer.echo(message, err=True)
    raise typer.Exit(1)


@app.command()
def verify(
    directory: Annotated[Path, typer.Argument(help="The audit directory (audit.jsonl, head.json, artefacts/).")],
    trusted_key: Annotated[str | None, typer.Option(
        "--trusted-key", help="The server's public key (base64, or a file holding it), obtained "
        "out of band. Without it the log is checked against the key it names itself.")] = None,
) -> None:
    """Check chain, signatures, head and every artefact; exit 0 if all verify, 1 otherwise."""
    from clinograph.secure.audit import verify_audit_dir

    key = _trusted_key(trusted_key)
    try:
        report = verify_audit_dir(directory, trusted_server_key=key)
    except (ClinographError, OSError) as exc:
        _fail(f"Cannot verify {directory}: {exc}")
        return
    except Exception as exc:  # never a traceback at the CLI
        _fail(f"Internal error while verifying {directory} ({type(exc).__name__}); please report it.")
        return
    if not report.ok:
        lines = "\n".join(f"  - {p}" for p in report.problems)
        _fail(f"FAILED: {directory} does not verify (first bad entry: {report.first_bad}; "
              f"{len(report.problems)} problem(s)):\n{lines}")
    typer.echo(f"OK: {report.entries} entries verified in {directory}\n"
               f"head hash: {report.head_hash}\nserver key fingerprint: {report.server_key_fingerprint}"
               + ("" if key else "\n(server key not pinned: pass --trusted-key to check who wrote the log)"))


@app.command()
def report(
    directory: Annotated[Path, typer.Argument(help="The audit directory.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the HTML report "
                                      "(outside the audit directory).")] = Path("report.html"),
) -> None:
    """Render a self-contained HTML report (exit 1, report still written, if the log does not verify)."""
    from clinograph.secure.audit import render_report, verify_audit_dir

    if not directory.is_dir():
        _fail(f"{directory} is not a directory: pass the audit directory (with audit.jsonl).")
    if out.resolve().is_relative_to(directory.resolve()):
        _fail(f"--out {out} is inside the audit directory; write the report elsewhere (any extra file "
              "there fails verification).")
    try:
        path = render_report(directory, out=out)
        ok = verify_audit_dir(directory).ok
    except (ClinographError, OSError) as exc:
        _fail(f"Cannot render the report for {directory}: {exc}")
        return
    except Exception as exc:  # never a traceback at the CLI
        _fail(f"Internal error while rendering {directory} ({type(exc).__name__}); please report it.")
        return
    typer.echo(f"Report written to {path}")
    if not ok:
        _fail(f"WARNING: {directory} does not verify; the report shows the problems at its top. "
              f"Run `clinograph audit verify {directory}` for details.")
