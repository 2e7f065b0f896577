"""Choosing the model per federation on the federated validation loss (issue 15, session 6).

A federation trains k small variants of its model (``[selection] candidates``: config overrides
such as ``model = { linear_shape = true }``) on identical splits, one after another, and keeps
the candidate whose *kept round* has the lowest federated validation loss -- the selection
statistic NS-FL already computes every round (:mod:`clinograph.sdk.training.selection`):
Σ_k loss_k·n_k / Σ_k n_k summed through the secure mode into ``metric/validation``.

Privacy: only those already-public aggregate validation losses are compared. No hospital's own
loss, prediction or data leaves it beyond what one run already sends; the comparison is the
same arithmetic as choosing the kept round, over k runs instead of one. The candidates'
overrides are public configuration (the same at every hospital), recorded in the audit trail.

Rule: candidates are tried in list order, the first is the simplest; a later one wins only if
its validation loss is lower than the best so far by more than ``[selection] min_delta``
(ties go to the simpler candidate).

Cost: with ``[selection] elimination = "successive_halving"`` (the default) at most 2× the
training rounds of one run, whatever k (k = 4 by default: the wide path alone, with shape
functions, and each beside the GNN): all candidates train a first budget of rounds, the best half
go on, and so on (:mod:`clinograph.secure.runtime.elimination`, audited as
``candidates_eliminated``); the comparison at each cut is this module's rule on each candidate's
lowest federated validation loss so far. ``elimination = "none"``: k× the training of one run.
Plus one evaluation-only round per candidate whose run ends (the survivor; any the stop rule
ended early). Not used under DP (the validation sums are outside the accountant) nor when
selection is off; a candidate list is then refused.

Audit: all candidates run in one audit directory with one server key, one run (``audit_open`` /
``audit_reopen``) each -- one per rung under early elimination (``run_paused``, ``run_resumed``) --
every run that ends with its own ``model_selected``; a last, short run records
``model_chosen`` (:class:`clinograph.secure.audit.kinds.ModelChosen`): every candidate's
overrides, kept round, rounds run and validation loss, and the chosen one.
``clinograph audit verify`` verifies the whole directory.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clinograph.secure.runtime.run import (
    choose as choose,  # re-exported: the rule lives with the run
)

from clinograph.core.errors import ConfigError

from ..config import HospitalConfig, SimulationConfig, merge_sections

#: the default for a binary NS-FL federation (static model, no DP), simplest first (ties go to the
#: earlier): the wide path alone -- a federated logistic regression over every dictionary feature
#: ([model] deep = false) -- and with per-feature shape functions (a federated GAM), both with the
#: wide rows at 5x the learning rate (they are all that learns, and must converge within the
#: planned rounds); then NS-FL's GNN beside the linear wide path, and beside shape functions.
#: Measured in research/real_tables/README.md ("Issue 15, session 7"): on small real tables the federated
#: linear model often wins on validation, on larger or interaction-rich ones the GNN does.
DEFAULT_BINARY_CANDIDATES: tuple[dict[str, Any], ...] = (
    {"name": "wide", "model": {"deep": False}, "training": {"wide_lr_factor": 5.0}},
    {"name": "wide_shape", "model": {"deep": False, "linear_shape": True}, "training": {"wide_lr_factor": 5.0}},
    {"name": "linear"},
    {"name": "shape", "model": {"linear_shape": True}},
)
#: sections a candidate may override: the model and its training, never the split, the
#: target, the privacy settings or the selection itself (candidates must be comparable)
OVERRIDABLE = ("model", "training", "graph", "agat", "personal")
#: most models one choice trains (candidates × restarts)
MAX_RUNS = 16
_FIX = ("Write each candidate as a table with a unique `name` and overrides of "
        f"{', '.join(OVERRIDABLE)}, e.g. [[selection.candidates]] name = \"shape\" model = {{ linear_shape = true }}")


@dataclass(frozen=True)
class Candidate:
    """One candidate: its name, its public overrides and the full config it runs with."""

    name: str
    overrides: dict[str, Any]
    config: HospitalConfig


def _hospital(config: HospitalConfig) -> HospitalConfig:
    """The settings a hospital trains with (a simulation's DP horizon and fedopt rule applied)."""
    return config.hospital_config() if isinstance(config, SimulationConfig) else config


def default_applies(config: HospitalConfig) -> bool:
    """Whether the SDK's default candidates apply: binary static NS-FL with selection active,
    the wide path on, and neither shape functions, the GNN's switch nor the wide rows' learning
    rate chosen explicitly (a config that sets them means that one model)."""
    m = config.model
    return (config.task == "nsfl" and config.target.kind == "binary" and m.temporal == "none" and not m.modalities
            and m.linear_path and not m.linear_shape and m.deep and "wide_lr_factor" not in config.training.model_fields_set
            and _hospital(config).selection_active())


def listed_candidates(config: HospitalConfig) -> tuple[Any, ...]:
    """The raw ``[selection] candidates`` entries (None: the task's default; may be empty)."""
    raw = config.selection.candidates
    if raw is None:
        return DEFAULT_BINARY_CANDIDATES if default_applies(config) else ()
    return tuple(raw)


def candidate_configs(config: HospitalConfig) -> list[Candidate]:
    """The candidates of ``config`` (``[selection] candidates``; None: the default for the task,
    an empty list: no choice). Every problem is reported at once.

    Raises:
        ConfigError: an entry is not a table, lacks a unique ``name``, overrides a section it may
            not, or gives a setting its section refuses (the message names the entry and the fix);
            or candidates are listed where selection is off (DP, fedopt, no validation split).
    """
    raw = listed_candidates(config)
    if config.selection.candidates and not _hospital(config).selection_active():
        raise ConfigError("[selection] candidates needs model selection: the choice compares federated validation "
                          "losses, and selection is off here (DP, fedopt, [selection] enabled = false or no "
                          "validation split). Remove the candidates or turn selection on.")
    restarts = config.selection.restarts
    if restarts > 1:
        if not _hospital(config).selection_active():
            raise ConfigError(f"[selection] restarts = {restarts} needs model selection: the restarts are compared "
                              "by federated validation loss, and selection is off here (DP, fedopt, [selection] "
                              "enabled = false or no validation split). Set restarts = 1 or turn selection on.")
        if config.task != "nsfl":
            raise ConfigError(f"[selection] restarts = {restarts} is for task = \"nsfl\" (it varies [model] init_seed "
                              f"and [training] seed); this config's task is {config.task!r}. Set restarts = 1.")
        models = max(1, len(raw)) * restarts
        if models > MAX_RUNS:
            raise ConfigError(f"[selection] {max(1, len(raw))} candidate(s) × restarts = {restarts} would train "
                              f"{models} models; at most {MAX_RUNS}. Lower restarts or list fewer candidates.")
    problems, out, seen = [], [], set()
    base = config.model_dump(mode="python", by_alias=True)
    if config.privacy.enabled:  # each candidate's DP plan covers the whole choice (private_choice reads the list)
        base["selection"]["candidates"] = tuple(raw)
    for i, entry in enumerate(raw):
        where = f"[selection] candidates entry {i + 1}"
        if not isinstance(entry, Mapping):
            problems.append(f"{where} is a {type(entry).__name__}, not a table.")
            continue
        name = entry.get("name")
        if not isinstance(name, str) or not name or len(name) > 40 or not name.replace("_", "").replace("-", "").isalnum():
            problems.append(f"{where} has no valid `name` (letters, digits, '-' or '_', at most 40).")
            continue
        where = f"{where} ({name!r})"
        if name in seen:
            problems.append(f"{where}: the name is used twice.")
            continue
        seen.add(name)
        over = {k: v for k, v in entry.items() if k != "name"}
        bad = sorted(k for k in over if k not in OVERRIDABLE or not isinstance(over[k], Mapping))
        if bad:
            problems.append(f"{where} overrides {', '.join(map(repr, bad))}, which a candidate may not (or not as a "
                            "table).")
            continue
        try:
            cfg = type(config).model_validate(merge_sections(base, over))
        except Exception as exc:  # pydantic's message names the key  # noqa: BLE001
            detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in getattr(exc, "errors", list)())
            problems.append(f"{where} does not give a valid config ({detail or type(exc).__name__}).")
            continue
        out.append(Candidate(name=name, overrides=json.loads(json.dumps(over, default=str)), config=cfg))
    if problems:
        raise ConfigError("Cannot read [selection] candidates: " + " ".join(problems) + " " + _FIX + ".")
    return with_restarts(out, config) if restarts > 1 else out


def choice_rounds(config: HospitalConfig, rounds: int) -> tuple[int, int]:
    """(training rounds of the whole choice, candidate runs) for runs of ``rounds`` rounds: the
    successive-halving schedule's cost (:func:`clinograph.secure.runtime.elimination.schedule`,
    about 2× ``rounds``) or k × ``rounds`` for ``elimination = "none"``; one run without selection."""
    if not _hospital(config).selection_active():
        return rounds, 1
    from clinograph.secure.runtime.elimination import EliminationRule, schedule

    raw = listed_candidates(config)
    runs = max(1, len(raw)) * config.selection.restarts
    total = (schedule(runs, rounds=rounds, rule=EliminationRule()).cost
             if config.selection.elimination == "successive_halving" else runs * rounds)
    return total, runs


def distributed_rounds(config: Any) -> int:
    """The rounds a distributed-DP promise covers (a SimulationConfig): ``[federation] rounds``,
    or with private selection the whole choice's training rounds plus two a run (the scoring
    round that ends it -- one more noisy sum over the validation patients, accounted like a
    training round, sdk/privacy/distributed_trainer.py -- and a spare for a resumed rung)."""
    rounds = config.federation.rounds
    if not (config.privacy.enabled and _hospital(config).selection_active()):
        return rounds
    total, runs = choice_rounds(config, rounds)
    return total + 2 * runs


def private_choice(config: HospitalConfig) -> HospitalConfig:
    """``config`` with its local-DP plan covering everything the hospital will release (issue 30).

    Under local DP every candidate run and restart trains on the same patients, and every
    validation release and set-up release is accounted, all in the hospital's one ledger. So σ,
    σ_s and σ_set are calibrated over all of it:

    * with selection on: the training rounds of the whole choice (:func:`choice_rounds`) and
      ``planned_selection_releases`` = those rounds plus two a run (the evaluation-only round
      that ends it, and one spare for a resumed rung);
    * ``planned_setup_releases``: one for ``[scaling] source = "federated"``, one when the
      config or a candidate asks for ``[model] features = "shared"``.

    A hospital that set a planned count keeps its own number. Without local DP: unchanged.
    """
    p = config.privacy
    if not (p.enabled and p.mode == "local"):
        return config
    raw = listed_candidates(config)
    update: dict[str, Any] = {}
    if p.planned_setup_releases is None:
        shared = config.model.features == "shared" or any(
            isinstance(c, Mapping) and isinstance(c.get("model"), Mapping) and c["model"].get("features") == "shared"
            for c in raw)
        setup = int(config.scaling.source == "federated") + int(shared)
        if setup:
            update["planned_setup_releases"] = setup
    if _hospital(config).selection_active() and p.planned_rounds is not None:
        rounds, runs = choice_rounds(config, p.planned_rounds)
        update["planned_rounds"] = rounds
        if p.planned_selection_releases is None:
            update["planned_selection_releases"] = rounds + 2 * runs
    return config.model_copy(update={"privacy": p.model_copy(update=update)}) if update else config


def with_restarts(cands: list[Candidate], config: HospitalConfig) -> list[Candidate]:
    """Each candidate (or, without candidates, the config's one model, named ``model``) from
    ``[selection] restarts`` initialisations: restart i > 0 is named ``<name>-init<i>`` and adds
    ``model.init_seed`` and ``training.seed`` + 1000·i to its overrides (public, audited like any
    override); restart 0 is the candidate itself, so it wins ties (:func:`choose`)."""
    base = cands or [Candidate(name="model", overrides={}, config=config)]
    out = []
    for c in base:
        for i in range(config.selection.restarts):
            if i == 0:
                out.append(c)
                continue
            seeds = {"model": {"init_seed": (c.config.model.init_seed + 1000 * i) % 2**63},
                     "training": {"seed": (c.config.training.seed + 1000 * i) % 2**63}}
            over = merge_sections(c.overrides, seeds)
            cfg = type(config).model_validate(merge_sections(c.config.model_dump(mode="python", by_alias=True),
                                                                 seeds))
            out.append(Candidate(name=f"{c.name}-init{i}", overrides=json.loads(json.dumps(over, default=str)),
                                 config=cfg))
    names = [c.name for c in out]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise ConfigError(f"[selection] restarts name restart i of candidate c `c-init<i>`, and that gives the "
                          f"names {', '.join(map(repr, clash))} twice. Rename the candidate(s) ending in -init<i>.")
    return out
