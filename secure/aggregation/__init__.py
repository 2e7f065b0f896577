"""Secure-aggregation modes behind one interface, chosen by name.

>>> create_mode("masekd")  # doctest: +SKIP
RegistryError: Unknown secure mode 'masekd'. Registered: ckks, ckks_threshold, insecure_plaintext, masked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from clinograph.core.errors import RegistryError

from .base import AggregateVoided, AggregationClient, AggregationServer, LocalUpdate, ModuleSums
from .plaintext import PlaintextClient, PlaintextServer

Options = dict[str, float | int | str | bool]


def _no_options(participants: tuple[str, ...]) -> Options:
    return {}


@dataclass(frozen=True)
class ModeRun:
    """A mode's server side for one run, from its set-up (:meth:`SecureMode.open_run`).

    ``server``: the aggregation-server factory (None: the mode's own class); ``options``: the
    public plan options for a round with these participants; ``hospitals``: who can take part
    (None: everyone the transport reaches; CKKS: the key holders); ``check_distributed``: the
    mode's check of a distributed-DP policy (None: the mode cannot carry distributed DP).
    """

    server: Callable[..., AggregationServer] | None = None
    options: Callable[[tuple[str, ...]], Options] = _no_options
    hospitals: tuple[str, ...] | None = None
    check_distributed: Callable[..., None] | None = None
    #: ``(kind, payload)`` entries the mode's set-up records in the run's audit trail once its
    #: server is built (CKKS: who holds the secret key)
    audit: tuple[tuple[str, dict[str, Any]], ...] = ()


@dataclass(frozen=True)
class SecureMode:
    """A registered mode: its two halves, whether the server sees the aggregate, and -- so that
    nothing outside the mode's own package branches on its name -- its set-up for a run
    (``prepare``) and how a hospital joins a round (``join``)."""

    name: str
    server: type[AggregationServer]
    client: type[AggregationClient]
    server_sees_sum: bool
    insecure: bool = False
    #: whether the mode's sum can carry the hospitals' distributed-DP noise shares (its run's
    #: ``check_distributed`` then checks a policy against the round's parameters)
    distributed_dp: bool = False
    #: prepare(federation=, transport=, run_id=, enrolled=, max_weight=, context=, on_event=) -> ModeRun
    prepare: Callable[..., ModeRun] | None = None
    #: join(plan=, identity=, server=, peers=, update=, keys=) -> AggregationClient (keys: the
    #: hospital's key holder from the set-up); None: ``client(plan=, identity=, server=, peers=, update=)``
    join: Callable[..., AggregationClient] | None = None
    #: describe(plan_options, entries) -> (paragraph, [(parameter, value)]): the report's account of
    #: the mode (``entries``: the run's audit payloads by kind); None: its ``<name>.*`` plan options
    describe: Callable[..., tuple[str, list[tuple[str, object]]]] | None = None
    #: accept(plan, release=) -> None: a hospital's check, before it trains, of a signed plan
    #: against the mode's rules and the hospital's own ``[release]`` (raises ClinographError);
    #: None: the mode's client checks the plan when it is made
    accept: Callable[..., None] | None = None

    def check_plan(self, plan: Any, *, release: Any) -> None:
        """Refuse, before any training, a plan this hospital's half would refuse or its own rules
        (``release``: its ``[release]`` section) do not allow."""
        if self.accept is not None:
            self.accept(plan, release=release)

    def open_run(self, *, federation: Any, transport: Any, run_id: str, enrolled: Mapping[str, Any],
                 max_weight: float, context: object | None = None,
                 on_event: Callable[[str, Mapping[str, Any]], None] | None = None) -> ModeRun:
        """The mode's set-up for a run (over ``transport``; or from an already made ``context``)."""
        if self.prepare is None:
            return ModeRun()
        return self.prepare(federation=federation, transport=transport, run_id=run_id, enrolled=enrolled,
                            max_weight=max_weight, context=context, on_event=on_event or (lambda k, d: None))

    def make_client(self, *, plan: Any, identity: Any, server: Any, peers: Mapping[str, Any], update: LocalUpdate,
                    keys: Any = None) -> AggregationClient:
        """This hospital's half of the round ``plan`` describes."""
        if self.join is None:
            return self.client(plan=plan, identity=identity, server=server, peers=peers, update=update)  # type: ignore[call-arg]
        return self.join(plan=plan, identity=identity, server=server, peers=peers, update=update, keys=keys)


_MODES: dict[str, SecureMode] = {}


def register_mode(mode: SecureMode) -> None:
    """Register a mode under ``mode.name`` (re-registering the same classes is a no-op)."""
    old = _MODES.get(mode.name)
    if old is not None and old != mode:
        raise RegistryError(f"Secure mode {mode.name!r} is already registered.")
    _MODES[mode.name] = mode


def create_mode(name: str) -> SecureMode:
    """The mode registered as ``name``; a miss lists the options."""
    why = unknown_mode(name)
    if why is not None:
        raise RegistryError(why)
    return _MODES[name]


def registered_modes() -> list[str]:
    """Names of every registered mode."""
    _load_builtin()
    return sorted(_MODES)


def unknown_mode(name: str) -> str | None:
    """None if ``name`` is a registered mode, else the sentence that says so (every config and the
    CLI refuse an unknown mode with it)."""
    modes = registered_modes()
    return None if name in modes else f"Unknown secure mode {name!r}. Registered: {', '.join(modes)}."


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

__all__ = ["AggregateVoided", "AggregationClient", "AggregationServer", "LocalUpdate", "ModeRun", "ModuleSums", "SecureMode",
           "create_mode", "register_mode", "registered_modes", "unknown_mode"]
