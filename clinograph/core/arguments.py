"""Public functions name a wrong argument type at the boundary, from their own annotations.

``@checked_arguments`` reads a function's annotations once (at its first call) and checks each
argument whose annotation is a plain type: a class (``SimulationConfig``), a union of classes
with or without ``None``, a path (``Path`` or ``str | Path``: a ``str`` or any ``os.PathLike``,
never ``bytes``), ``Sequence[...]``/``Mapping[...]``/``tuple[...]`` (the container only; the
function checks the items). Other annotations (callables, protocols, literals, numbers, numpy
arrays -- array-likes are coerced --, names only imported for type checking) are left to the function. A wrong type is a
:class:`~clinograph.core.errors.ConfigError` naming the function, the argument, the type received
and the type expected -- where pathlib, ``len()`` or an attribute lookup deep inside raised a
``TypeError``/``AttributeError`` outside the one exception tree before.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import os
import pathlib
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])

#: a check: the accepted types (isinstance), their names for the message; None: not checked
_Check = tuple[tuple[type, ...], str] | None
_PATH_TYPES = (str, os.PathLike)
_CONTAINERS = {collections.abc.Sequence: "a sequence (list or tuple)", collections.abc.Mapping: "a mapping (dict)",
               tuple: "a tuple", list: "a list", dict: "a dict"}
_UNCHECKED = (int, float, bool, complex, object)  # numbers: numpy scalars pass where they work


def _member(tp: Any) -> tuple[tuple[type, ...], str] | None:
    """One member of a union: the isinstance types and the name, or None if it cannot be checked."""
    if tp is type(None):
        return (type(None),), "None"
    if isinstance(tp, type) and issubclass(tp, pathlib.PurePath):
        return _PATH_TYPES, "a file name (str or pathlib.Path)"
    origin = typing.get_origin(tp)
    if origin in _CONTAINERS:
        return (origin,), _CONTAINERS[origin]
    if (not isinstance(tp, type) or origin is not None or tp in _UNCHECKED or getattr(tp, "_is_protocol", False)
            or tp in _CONTAINERS or tp.__module__.partition(".")[0] == "numpy"):  # arrays: array-likes are coerced
        return None
    return (tp,), f"{'a str' if tp is str else tp.__name__}"


def _a(value: object) -> str:
    """``None``, ``an int``, ``a dict``: the type received, for the message (never the value)."""
    if value is None:
        return "None"
    kind = type(value).__name__
    return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"


def _check_of(annotation: Any) -> _Check:
    members = (typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType)
               else (annotation,))
    found = [_member(m) for m in members]
    if any(f is None for f in found):
        return None
    kinds = tuple(dict.fromkeys(t for f in found for t in f[0]))  # type: ignore[index]
    names = list(dict.fromkeys(f[1] for f in found))  # type: ignore[index]
    if _PATH_TYPES[0] in kinds and "a str" in names:  # "str | Path": the path's name says str
        names.remove("a str")
    if "None" in names:  # last: "a SiteSchema or None"
        names.remove("None")
        names.append("None")
    return kinds, " or ".join(names)


def _checks(fn: Callable[..., Any]) -> dict[str, tuple[tuple[type, ...], str]]:
    """Each parameter's check; an annotation that does not resolve at run time is not checked."""
    out = {}
    for name, text in inspect.get_annotations(fn).items():
        if name == "return":
            continue
        try:  # the function's own annotation text (source code), evaluated where it was written
            annotation = eval(text, fn.__globals__) if isinstance(text, str) else text  # noqa: S307
        except Exception:  # noqa: S112 -- a name imported only under TYPE_CHECKING
            continue
        check = _check_of(annotation)
        if check is not None:
            out[name] = check
    return out


def checked_arguments(fn: F | None = None, *, unchecked: tuple[str, ...] = ()) -> Any:
    """Decorate a public function: a wrong argument type is a ConfigError naming it (see the module).
    ``@checked_arguments(unchecked=("key",))``: ``key`` is left to the function, whose own check
    names the fix (``trusted_server_key``: the forms a server key may take)."""
    if fn is None:
        return functools.partial(checked_arguments, unchecked=unchecked)
    signature = inspect.signature(fn)
    label = fn.__qualname__.rsplit("<locals>.", 1)[-1]
    checks: dict[str, tuple[tuple[type, ...], str]] | None = None

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal checks
        if checks is None:
            checks = {k: v for k, v in _checks(fn).items() if k not in unchecked}
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:  # a missing or unknown argument: Python's own message says which
            return fn(*args, **kwargs)
        for name, value in bound.arguments.items():
            check = checks.get(name)
            if check is None or isinstance(value, check[0]):
                continue
            owner = bound.arguments.get("cls")  # a classmethod: the class it was called on
            where = f"{owner.__name__}.{fn.__name__}" if isinstance(owner, type) else label
            raise ConfigError(f"{where}: {name} is {_a(value)}; expected {check[1]}.")
        return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
