"""Secure-aggregation modes behind one interface, chosen by name.

>>> create_mode("masekd")  # doctest: +SKIP
RegistryError: Unknown secure mode 'masekd'. Registered: ckks, insecure_plaintext, masked.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import RegistryError
from .base import AggregationClient, AggregationServer, LocalUpdate, ModuleSums
from .plaintext import PlaintextClient, PlaintextServer


@dataclass(frozen=True)
class SecureMode:
    """A registered mode: its two halves and whether the server sees the aggregate."""

    name: str
    server: type[AggregationServer]
    client: type[AggregationClient]
    server_sees_sum: bool
    insecure: bool = False


_MODES: dict[str, SecureMode] = {}


def register_mode(mode: SecureMode) -> None:
    """Register a mode under ``mode.name`` (re-registering the same classes is a no-op)."""
    old = _MODES.get(mode.name)
    if old is not None and old != mode:
        raise RegistryError(f"Secure mode {mode.name!r} is already registered.")
    _MODES[mode.name] = mode


def create_mode(name: str) -> SecureMode:
    """The mode registered as ``name``; a miss lists the options."""
    _load_builtin()
    try:
        return _MODES[name]
    except KeyError:
        raise RegistryError(f"Unknown secure mode {name!r}. Registered: {', '.join(sorted(_MODES))}.") from None


def registered_modes() -> list[str]:
    """Names of every registered mode."""
    _load_builtin()
    return sorted(_MODES)


def _load_builtin() -> None:
    # Optional modes register themselves on import; a mode whose module is absent is simply
    # not offered (the error above lists what is).
    import importlib

    for modname in ("clinograph.secure.masking", "clinograph.secure.ckks"):
        try:
            importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name != modname:
                raise


register_mode(SecureMode("insecure_plaintext", PlaintextServer, PlaintextClient, server_sees_sum=True, insecure=True))

__all__ = ["AggregationClient", "AggregationServer", "LocalUpdate", "ModuleSums", "SecureMode",
           "create_mode", "register_mode", "registered_modes"]
