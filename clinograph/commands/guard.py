"""Every command's guard: a :class:`~clinograph.core.errors.ClinographError` becomes a clear
message on stderr and exit 2, anything else exit 3 without a traceback (it could quote a cell;
``CLINOGRAPH_DEBUG=1`` shows it). Used by :mod:`clinograph.cli` and the commands it mounts."""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from typing import Any

import typer

from clinograph.core.logging import format_warning


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Map errors to messages and exit codes: 2 = bad input/config, 3 = internal error; Clinograph's
    warnings are shown as one line each (:func:`format_warning`)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from pydantic import ValidationError

        from clinograph.core.errors import ClinographError

        saved, warnings.formatwarning = warnings.formatwarning, format_warning
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except ClinographError as exc:
            typer.secho(f"error: {exc}", err=True, fg="red")
            raise typer.Exit(2) from None
        except ValidationError as exc:
            lines = [f"  - {'.'.join(str(x) for x in e['loc'])}: {e['msg'].removeprefix('Value error, ')}"
                     for e in exc.errors()]
            typer.secho("error: invalid settings:\n" + "\n".join(lines), err=True, fg="red")
            raise typer.Exit(2) from None
        except BrokenPipeError:  # the reader went away (`clinograph check ... | head`): not an error of ours
            _stdout_to_devnull()
            raise typer.Exit(1) from None
        except KeyboardInterrupt:  # commands that write something say what they left (clinograph simulate)
            typer.echo("interrupted by the operator (Ctrl-C) before the command finished; nothing more was done",
                       err=True)
            raise typer.Exit(130) from None
        except Exception as exc:
            if os.environ.get("CLINOGRAPH_DEBUG") == "1":
                raise
            typer.secho(f"internal error ({type(exc).__name__}); rerun with CLINOGRAPH_DEBUG=1 and report it.",
                        err=True, fg="red")
            raise typer.Exit(3) from None
        finally:
            warnings.formatwarning = saved

    return wrapper


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so that flushing it at exit does not raise again (Python's
    documented handling of SIGPIPE)."""
    import sys

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # no real file behind stdout (a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
