"""Loading strict pydantic models from TOML: one place for the read-validate-explain steps.

Errors name the file, every bad key (``extra="forbid"`` makes a misspelt key an error) and
what was expected.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from .errors import ConfigError

M = TypeVar("M", bound=BaseModel)


def validation_message(what: str, exc: ValidationError) -> str:
    """Every problem of a validation error, one line each, with the dotted key."""
    lines = [f"{what} is invalid ({exc.error_count()} problem(s)):"]
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = "unknown key (remove it or check the spelling)" if err["type"] == "extra_forbidden" else err["msg"]
        lines.append(f"  - {loc}: {msg.removeprefix('Value error, ')}")
    return "\n".join(lines)


def load_toml_model(model: type[M], path: str | Path, *, what: str,
                    prepare: Callable[[dict[str, Any], Path], None] | None = None) -> M:
    """Read ``path`` as TOML, let ``prepare`` adjust the raw dict, validate it as ``model``.

    Raises:
        ConfigError: unreadable file, bad TOML, or any validation problem (all listed).
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"Cannot read {what} {path}: {exc}.") from None
    if prepare is not None:
        prepare(data, path)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_message(f"{what.capitalize()} {path}", exc)) from None
