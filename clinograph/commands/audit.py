"""``clinograph audit``: verify an audit directory and render the auditor's report.

Mounted by the main CLI as ``app.add_typer(audit.app, name="audit")``. Both commands print
problems on stderr and exit 1; they never end in a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from clinograph.core.errors import ClinographError

# clinograph.secure.audit (and matplotlib, for the report) is imported by the commands that
# use it, so that `clinograph --help` and the other commands start quickly.

app = typer.Typer(name="audit", help="Verify audit logs and render audit reports.", no_args_is_help=True,
                  pretty_exceptions_enable=False)


KEY_HELP = ("The server's Ed25519 public key, obtained out of band: the file server.pub that `clinograph keys "
            "init` wrote (one line of base64), a PEM public key file, or the base64 itself. Without it the log "
            "is only checked against the key it names itself (self-consistent, not proven to be the server's).")
KEY_FIX = "Pass server.pub (written by `clinograph keys init` next to federation.toml) or the key itself as base64."


def _trusted_key(value: str | None) -> bytes | None:
    """The trusted key's 32 bytes (:func:`clinograph.core.keyarg.read_public_key`); a usage error
    (exit 2) saying what the value is when it is no Ed25519 public key."""
    if value is None:
        return None
    from clinograph.core.errors import ConfigError
    from clinograph.core.keyarg import read_public_key

    try:
        return read_public_key(value, flag="--trusted-key", fix=KEY_FIX)
    except ConfigError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None


def _trust_line(report: object, key: bytes | None) -> str:
    fp = getattr(report, "server_key_fingerprint", None)
    if key is not None and getattr(report, "trusted", False):
        return f"signer checked: the log is signed by the trusted server key (fingerprint {fp})"
    if key is not None:
        return (f"signer check FAILED: the log is not signed by the --trusted-key given (it names key "
                f"{fp or 'none'}); check that --trusted-key is this federation's server.pub")
    if fp is None:  # nothing signed could be read (not an audit directory, or an empty or altered log)
        return "signer NOT checked: the log names no server key (no signed entry could be read)"
    return (f"signer NOT checked: no --trusted-key given, so 'verified' means the log is self-consistent under "
            f"the key it names itself (fingerprint {fp}), not that the expected server wrote it")


def _fail(message: str) -> None:
    typer.echo(message, err=True)
    raise typer.Exit(1)


@app.command()
def verify(
    directory: Annotated[Path, typer.Argument(help="The audit directory (audit.jsonl, head.json, artefacts/).")],
    trusted_key: Annotated[str | None, typer.Option("--trusted-key", help=KEY_HELP)] = None,
    expect_head: Annotated[str | None, typer.Option("--expect-head", help="An entry hash noted out of band "
                                                    "earlier (the 'head hash' printed by a previous verify): "
                                                    "the log must still contain it (detects a rolled-back "
                                                    "directory).")] = None,
) -> None:
    """Check chain, signatures, head and every artefact; exit 0 if all verify, 1 otherwise.

    Exit 2: a bad --trusted-key argument (missing file, wrong format). A log signed by another
    key than the trusted one fails with "WRONG KEY" (exit 1)."""
    from clinograph.secure.audit import verify_audit_dir

    key = _trusted_key(trusted_key)
    if not directory.is_dir():
        _fail(f"FAILED: {directory} is not a directory: pass the audit directory (the one holding audit.jsonl, "
              "head.json and artefacts/).")
    try:
        report = verify_audit_dir(directory, trusted_server_key=key, expect_head=expect_head)
    except (ClinographError, OSError) as exc:
        _fail(f"Cannot verify {directory}: {exc}")
        return
    except Exception as exc:  # never a traceback at the CLI
        _fail(f"Internal error while verifying {directory} ({type(exc).__name__}); please report it.")
        return
    if not report.ok:
        lines = "\n".join(f"  - {p}" for p in report.problems)
        wrong = key is not None and any("not by the trusted server key" in p for p in report.problems)
        _fail(("WRONG KEY: the log is not signed by the trusted server key.\n" if wrong else "")
              + f"FAILED: {directory} does not verify ("
              + (f"first bad entry: {report.first_bad}; " if report.first_bad is not None else "")
              + f"{len(report.problems)} problem(s)):\n{lines}")
    runs = ", ".join(r or "(format 1, no id)" for r in report.runs)
    typer.echo(f"OK: {report.entries} entries verified in {directory}\n"
               f"runs: {len(report.runs)} ({runs})\n"
               f"head hash: {report.head_hash}\nserver key fingerprint: {report.server_key_fingerprint} "
               f"(SHA-256 of the 32-byte Ed25519 public key)\n{_trust_line(report, key)}"
               + ("" if key else "\n(server key not pinned: pass --trusted-key to check who wrote the log)")
               + (f"\nnote: a run is still writing this log (its writer holds the lock): the verdict covers the "
                  f"{report.entries} entries written so far; verify again when the run has ended."
                  if report.being_written else ""))


@app.command()
def report(
    directory: Annotated[Path, typer.Argument(help="The audit directory.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the HTML report "
                                      "(outside the audit directory).")] = Path("report.html"),
    trusted_key: Annotated[str | None, typer.Option("--trusted-key", help=KEY_HELP)] = None,
) -> None:
    """Render a self-contained HTML report (exit 1, report still written, if the log does not verify).

    The report states whether the signer was checked against a trusted key."""
    from clinograph.secure.audit import verify_audit_dir
    from clinograph.secure.audit.report import render_report

    key = _trusted_key(trusted_key)
    if not directory.is_dir():
        _fail(f"{directory} is not a directory: pass the audit directory (with audit.jsonl).")
    if out.resolve().is_relative_to(directory.resolve()):
        _fail(f"--out {out} is inside the audit directory; write the report elsewhere (any extra file "
              "there fails verification).")
    if out.is_dir():
        _fail(f"--out {out} is a folder; give a file path such as {out / 'report.html'}.")
    blocker = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        _fail(f"--out {out}: {blocker} is a file, not a folder; give a path in a folder, such as report.html.")
    try:
        path = render_report(directory, out=out, trusted_server_key=key)
        checked = verify_audit_dir(directory, trusted_server_key=key)
        ok = checked.ok
    except (ClinographError, OSError) as exc:
        _fail(f"Cannot render the report for {directory}: {exc}")
        return
    except Exception as exc:  # never a traceback at the CLI
        _fail(f"Internal error while rendering {directory} ({type(exc).__name__}); please report it.")
        return
    typer.echo(f"Report written to {path}\n{_trust_line(checked, key)}")
    if not ok:
        _fail(f"WARNING: {directory} does not verify; the report shows the problems at its top. "
              f"Run `clinograph audit verify {directory}` for details.")
