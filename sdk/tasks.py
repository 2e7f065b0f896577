"""Tasks by registration, in the style of ``create_mode`` and ``create_strategy``.

A task is registered under the name ``hospital.toml`` gives as ``task = "..."`` with two
functions: ``build`` makes a hospital's :class:`~clinograph.sdk.federation.task.Task` over its
ingested table, and ``modules`` makes the task's
:class:`~clinograph.sdk.model.modules.ModuleMap` from the config alone, with the same initial
weights (what ``clinograph model init`` writes for the lean server). Everything else -- rounds,
secure modes, transports, selection, audit -- is the run's, so a registered task runs under
every secure mode and transport (docs/write_a_task.md).

Built in: ``nsfl`` (:mod:`clinograph.sdk.federation.builtin_tasks`; NS-FL with local or distributed
DP, temporal, survival, modalities as configuration), ``agat`` (:mod:`clinograph.sdk.agat.registration`,
Molaei et al. 2024), ``fednsl`` (:mod:`clinograph.sdk.fednsl.registration`, Xing, Lu, Yu 2024) and
``concepts`` (:mod:`clinograph.sdk.concepts.registration`, F-CMs: a voted run).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clinograph.core.arguments import checked_arguments
from clinograph.core.errors import RegistryError

#: build(table, *, dictionary, config, split, state_dir, identity) -> Task
TaskBuild = Callable[..., Any]
#: modules(config, *, dictionary) -> ModuleMap (seeded exactly as ``build``'s task)
TaskModules = Callable[..., Any]
TaskStrategy = Callable[..., tuple[str, dict[str, Any]]]


@dataclass(frozen=True)
class TaskEntry:
    """A registered task: its name, how to build it at a hospital and its modules without a table."""

    name: str
    build: TaskBuild
    modules: TaskModules
    #: whether the task reports its validation loss (``metric/validation``): model selection,
    #: early stopping and the choice among candidates need it
    validation: bool = True
    #: strategy(config, *, dictionary, directory) -> (strategy name, its options): a task that needs
    #: its own server strategy writes the public files it loads into ``directory`` (None: any)
    strategy: TaskStrategy | None = None
    #: run_models(config, *, dictionary) -> RunModels, for a task whose run is not candidates x
    #: restarts of its modules (concepts: a voted run); None: the default
    run_models: Callable[..., Any] | None = None
    #: participant(*, node_config, config, dictionary, federation, identity, data) -> the hospital's
    #: RoundParticipant for the whole run, built from its files by the SuperNode factory, for a
    #: task whose hospital is not a FederationMember of its candidates (concepts); None: the default
    participant: Callable[..., Any] | None = None


_TASKS: dict[str, TaskEntry] = {}


@checked_arguments
def register_task(name: str, *, build: TaskBuild, modules: TaskModules, validation: bool = True,
                  strategy: TaskStrategy | None = None, run_models: Callable[..., Any] | None = None,
                  participant: Callable[..., Any] | None = None) -> TaskEntry:
    """Register a task under ``name`` (letters, digits, ``_``; at most 64). Registering a name
    twice replaces the entry (tests, notebooks). ``validation=False``: the task reports no
    validation loss, so model selection is off for it (no candidates, no early stopping).
    ``strategy``: the server strategy the task needs and the public files its options pin
    (``clinograph model init`` writes them and prints the options for ``server.toml``;
    ``simulate()`` writes them into its output folder). ``run_models`` and ``participant``: a
    task whose run is not its candidates' (concepts' voted run) and whose hospital is built by the
    SuperNode factory its own way.

    Raises:
        RegistryError: an invalid name.
    """
    if not name or len(name) > 64 or not name.replace("_", "").isalnum() or not name[0].isalpha():
        raise RegistryError(f"Task name {name!r} must start with a letter and hold letters, digits or '_' "
                            "(at most 64).")
    entry = TaskEntry(name=name, build=build, modules=modules, validation=validation, strategy=strategy,
                      run_models=run_models, participant=participant)
    _TASKS[name] = entry
    return entry


def create_task(name: str) -> TaskEntry:
    """The task registered as ``name``; a miss lists the options."""
    _load_builtin()
    try:
        return _TASKS[name]
    except KeyError:
        raise RegistryError(f"Unknown task {name!r}. Registered: {', '.join(registered_tasks())}. Register your "
                            "own with clinograph.register_task (docs/write_a_task.md).") from None


def registered_tasks() -> list[str]:
    """Names of every registered task."""
    _load_builtin()
    return sorted(_TASKS)


def _load_builtin() -> None:
    # The built-in tasks register themselves on import (sdk/federation/builtin_tasks.py); by name,
    # so that this registry (read by the config, the lowest SDK layer) imports nothing above it.
    for name, module in (("nsfl", "clinograph.sdk.federation.builtin_tasks"), ("agat", "clinograph.sdk.agat.registration"),
                         ("fednsl", "clinograph.sdk.fednsl.registration"),
                         ("concepts", "clinograph.sdk.concepts.registration")):
        if name not in _TASKS:
            importlib.import_module(module)




def task_strategy(config: Any, *, dictionary: Any, directory: Any) -> tuple[str, dict[str, Any]] | None:
    """The server strategy ``config.task`` needs and its options (its public files written into
    ``directory``); None when the task runs under any strategy."""
    entry = create_task(config.task)
    return None if entry.strategy is None else entry.strategy(config, dictionary=dictionary, directory=directory)
