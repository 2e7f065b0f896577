"""Loading strict pydantic models from TOML: one place for the read-validate-explain steps.

Errors name the file, every bad key (``extra="forbid"`` makes a misspelt key an error) and
what was expected. Whatever the file holds, loading ends in a model or a :class:`ConfigError`:
only regular files are opened (a directory, FIFO or device is refused before any read), files
over :data:`MAX_TOML_BYTES` are refused, bytes that are not UTF-8 and nesting too deep for the
parser are explained rather than raised as ``UnicodeDecodeError``/``RecursionError``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from .errors import ConfigError, ConfigValidationError
from .fileio import NotRegularFile, TooLarge, read_regular

M = TypeVar("M", bound=BaseModel)
MAX_TOML_BYTES = 16 * 1024 * 1024

def read_toml_text(path: Path, *, what: str) -> str:
    """The text of a TOML file: a regular file, at most MAX_TOML_BYTES, valid UTF-8 (a BOM is allowed).

    Raises:
        ConfigError: missing, unreadable, not a regular file, too large or not UTF-8; names the file.
    """
    try:
        data = read_regular(path, limit=MAX_TOML_BYTES)
    except FileNotFoundError:
        raise ConfigError(f"Cannot read {what} {path}: the file does not exist. Check the path.") from None
    except NotRegularFile as exc:
        raise ConfigError(f"Cannot read {what} {path}: it is {exc.kind}, not a regular file. Give the path of "
                          "the TOML file itself.") from None
    except TooLarge as exc:
        raise ConfigError(f"Cannot read {what} {path}: {exc.size} bytes is over the limit of "
                          f"{MAX_TOML_BYTES} bytes for a TOML file. Check that this is the right file.") from None
    except OSError as exc:
        raise ConfigError(f"Cannot read {what} {path}: {exc.strerror or type(exc).__name__}.") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"Cannot read {what} {path}: it is not valid UTF-8 (first bad byte at line {line}, "
                          f"byte offset {exc.start}). TOML files must be UTF-8: re-save it as UTF-8 (for a "
                          "latin-1 file: iconv -f latin1 -t utf-8).") from None


def validation_message(what: str, exc: ValidationError | ConfigValidationError) -> str:
    """Every problem of a validation error, one line each, with the dotted key."""
    from .logging import printable

    # a key is the file's own text: printable, so no escape sequence or newline reaches a terminal

    lines = [f"{what} is invalid ({exc.error_count()} problem(s)):"]
    for err in exc.errors():
        loc = printable(".".join(str(x) for x in err["loc"])) or "(top level)"
        msg = {"extra_forbidden": "unknown key (remove it or check the spelling)",
               "finite_number": f"expected a finite number, got {err['input']!r}; write a number "
                                "(TOML's inf and nan are not settings)"}.get(err["type"], err["msg"])
        lines.append(f"  - {loc}: {msg.removeprefix('Value error, ')}")
    return "\n".join(lines)


def load_toml_model(model: type[M], path: str | Path, *, what: str,
                    prepare: Callable[[dict[str, Any], Path], None] | None = None) -> M:
    """Read ``path`` as TOML, let ``prepare`` adjust the raw dict, validate it as ``model``.

    Raises:
        ConfigError: unreadable file, bad TOML, or any validation problem (all listed).
    """
    path = Path(path)
    text = read_toml_text(path, what=what)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"Cannot read {what} {path}: invalid TOML: {exc}. Fix the syntax at that line.") from None
    except RecursionError:
        raise ConfigError(f"Cannot read {what} {path}: arrays or tables are nested too deeply to parse. "
                          "A configuration needs only a few levels; check the file.") from None
    if prepare is not None:
        prepare(data, path)
    try:
        return model.model_validate(data)
    except (ValidationError, ConfigValidationError) as exc:  # the latter: a ConfigModel's
        unknown = {e["loc"][0] for e in exc.errors() if e["type"] == "extra_forbidden" and len(e["loc"]) == 1}
        other_files = getattr(model, "OTHER_FILES_KEYS", {})  # a section of another kind of file: say whose
        hint = "".join(f"\n  {other_files[k]}." for k in sorted(unknown, key=str) if k in other_files)
        if data and unknown == set(data):  # nothing in it is a key of this kind of file: another kind of file
            keys = ", ".join(sorted(f.alias or n for n, f in model.model_fields.items()))
            hint += (f"\n  None of its top-level keys is one a {what} has ({keys}): is this the right file "
                    "(a feature dictionary, site schema, hospital.toml and server.toml are not interchangeable)?")
        raise ConfigError(validation_message(f"{what.capitalize()} {path}", exc) + hint) from None
    except RecursionError:
        raise ConfigError(f"{what.capitalize()} {path} is nested too deeply to validate; check the file.") from None
