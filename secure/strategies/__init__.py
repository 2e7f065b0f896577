"""Server update rules, chosen by name in config.

A strategy turns a round's :class:`ModuleSums` into the next global state. In ``ckks`` mode
the server never sees the sums, so every hospital applies the same strategy to the decrypted
sums itself; strategies are therefore deterministic functions of (state, sums, their own state).
"""

from __future__ import annotations

from collections.abc import Callable

from clinograph.core.errors import RegistryError

from .attention import AgatSecureAttention, InsecureAttention
from .base import Strategy
from .dag import DagVoting
from .dq import DQWeighted
from .fedavg import FedAvg, FedSGD
from .fedopt import FedAdam, FedOpt, FedYogi
from .fedprox import FedProx
from .rules import FedNSLRules

_REGISTRY: dict[str, Callable[..., Strategy]] = {}


def register_strategy(name: str, factory: Callable[..., Strategy]) -> None:
    """Register a strategy factory under ``name``."""
    _REGISTRY[name] = factory


def create_strategy(name: str, **options: object) -> Strategy:
    """Build the strategy registered as ``name``; a miss lists the registered names."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise RegistryError(f"Unknown aggregator {name!r}. Registered: {', '.join(sorted(_REGISTRY))}.") from None
    _check_option_types(name, factory, options)
    try:
        return factory(**options)
    except TypeError as exc:
        raise RegistryError(f"Bad options for aggregator {name!r} ([federation] strategy_options): {exc}. "
                            f"{_accepted(factory)}") from None


def _check_option_types(name: str, factory: Callable[..., Strategy], options: dict[str, object]) -> None:
    """Every option whose parameter is annotated ``float``, ``int``, ``bool`` or ``str`` has that type
    (an int is a float; a bool is neither a number nor a string), else one RegistryError naming every
    such option, what came and what is expected (a string for a number raised Python's own "'>' not
    supported between instances of 'str' and 'int'", or a ValueError from ``float()``)."""
    import inspect
    import typing

    init = factory.__init__ if inspect.isclass(factory) else factory
    try:
        hints = typing.get_type_hints(init)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: the factory checks its own options
        return
    kinds = {float: (int, float), int: (int,), bool: (bool,), str: (str,)}
    problems = []
    for key, value in options.items():
        want = hints.get(key)
        if want not in kinds:
            continue
        if not isinstance(value, kinds[want]) or (want is not bool and isinstance(value, bool)):
            problems.append(f"{key} = {value!r} ({type(value).__name__}), expected {want.__name__}")
    if problems:
        raise RegistryError(f"Bad options for aggregator {name!r} ([federation] strategy_options): "
                            f"{'; '.join(problems)}. Write numbers and true/false without quotes in the TOML "
                            "(strategy_options = {server_lr = 0.5}, not \"0.5\").")


def _accepted(factory: Callable[..., Strategy]) -> str:
    """The keyword options ``factory`` takes, as a sentence (from its signature; a factory taking
    ``**options`` validates them itself and says so)."""
    import inspect

    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return ""
    named = [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"]
    return f"It takes: {', '.join(named)}." if named else "It takes no options."


def linear_in_sums(name: str) -> bool:
    """Whether strategy ``name``'s next state is linear in the summed modules (model selection
    decodes the federated validation loss from it); unknown names count as linear (refused elsewhere)."""
    return bool(getattr(_REGISTRY.get(name), "linear_in_sums", True))


def reads_sum_at_server(name: str) -> bool:
    """Whether strategy ``name`` reads the summed update on the server (an M-step, an audited
    decision): such a strategy never runs at a hospital, which must not build it from a plan."""
    return bool(getattr(_REGISTRY.get(name), "server_reads_sum", False))


def registered_strategies() -> list[str]:
    """Every registered strategy name."""
    return sorted(_REGISTRY)


register_strategy("fedavg", FedAvg)
register_strategy("fedsgd", FedSGD)
register_strategy("fedprox", FedProx)
register_strategy("fedopt", FedOpt)
register_strategy("fedadam", FedAdam)
register_strategy("fedyogi", FedYogi)
register_strategy("dq_weighted", DQWeighted)
register_strategy("dag_voting", DagVoting)
register_strategy("insecure_attention", InsecureAttention)
register_strategy("agat_secure_attention", AgatSecureAttention)
register_strategy("fednsl_rules", FedNSLRules)

__all__ = ["AgatSecureAttention", "DQWeighted", "DagVoting", "FedAdam", "FedAvg", "FedNSLRules", "FedOpt", "FedProx", "FedSGD", "FedYogi", "InsecureAttention", "Strategy", "create_strategy",
           "reads_sum_at_server", "register_strategy", "registered_strategies"]
