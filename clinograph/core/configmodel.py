"""The base of every configuration model: invalid values raise the one exception tree.

A model built in code (``HospitalConfig(federation={"rounds": "5"})``) or validated from a dict
(``SiteSchema.model_validate(d)``) raises :class:`~clinograph.core.errors.ConfigValidationError`,
a :class:`~clinograph.core.errors.ConfigError` (and a ``ValueError``), with the message a TOML
file gets from :func:`~clinograph.core.tomlio.load_toml_model`: every bad key, what was found and
what was expected. Pydantic's own ``ValidationError`` would be outside the tree an integrator catches.

Nested models are validated in one pass (the overridden ``__init__`` is marked as pydantic's own,
so a nested section does not call it), so every problem of a whole config is listed at once.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any, Self

from pydantic import BaseModel, ValidationError, field_validator

from .errors import ConfigValidationError
from .tomlio import validation_message


def config_validation_error(what: str, exc: ValidationError | ConfigValidationError) -> ConfigValidationError:
    """``exc`` as the tree's error, its message naming ``what`` (a model, or a file)."""
    return ConfigValidationError(validation_message(what, exc), exc.errors())


class ConfigModel(BaseModel):
    """A pydantic model whose validation errors are :class:`ConfigValidationError`."""

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise config_validation_error(type(self).__name__, exc) from None

    # pydantic calls a custom __init__ for every nested model and cannot then gather their
    # errors into one; this one only translates the error, so pydantic may treat it as its own
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @field_validator("*", mode="after")
    @classmethod
    def _no_nul_in_paths(cls, value: Any) -> Any:
        """A path with a NUL character names no file (the OS refuses it: open() and mkdir() raised
        ValueError, an internal error at the CLI): refused here, by key, like any other bad value."""
        if isinstance(value, PurePath) and "\x00" in str(value):
            raise ValueError("a path cannot contain a NUL character (\\u0000 in the TOML string); "
                             "write the file's or folder's path without it")
        return value

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Self:  # noqa: D102 (pydantic's)
        return _translated(cls, super().model_validate, obj, **kwargs)

    @classmethod
    def model_validate_json(cls, json_data: Any, **kwargs: Any) -> Self:  # noqa: D102 (pydantic's)
        return _translated(cls, super().model_validate_json, json_data, **kwargs)


def _translated(cls: type, validate: Any, data: Any, **kwargs: Any) -> Any:
    """``validate(data, **kwargs)`` (pydantic's own), its ValidationError as the tree's error."""
    try:
        return validate(data, **kwargs)
    except ValidationError as exc:
        raise config_validation_error(cls.__name__, exc) from None
