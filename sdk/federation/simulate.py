"""A whole federation in one process: the real server, real hospitals, the in-process transport.

Everything a deployment does happens here too, through the same code: the same run
(:func:`clinograph.secure.runtime.run.run_federation` -- candidates, rounds under the stop rule,
the evaluation-only scoring round, every hospital keeping the selected and calibrated model,
``model_selected`` and ``model_chosen``), the same server assembly
(:class:`clinograph.secure.runtime.assemble.ServerSide`: audit runs, the CKKS key ceremony,
:func:`~clinograph.secure.runtime.build_server`) and the same hospital
(:class:`.member.FederationMember` over :func:`.build.build_hospital`). Only the transport is a
function call. What the simulation adds is measurement: each hospital's test metrics after
every round and at the end (a deployment's hospitals keep theirs).

The set-up sums that run before the candidates (``[scaling] source = "federated"``,
``[model] features = "shared"``) are phases of the same run, as over Flower: the run's models
list them (:func:`.build.run_models`, as ``clinograph model init`` writes them),
:func:`~clinograph.secure.runtime.run.run_federation` drives them and each
:class:`.member.FederationMember` answers them (:mod:`.setup`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clinograph.secure.audit import AuditTrail
from clinograph.secure.runtime import InProcessTransport, run_round
from clinograph.secure.runtime.assemble import ServerSide
from clinograph.secure.runtime.liveness import Liveness
from clinograph.secure.runtime.loop import RoundOutcome
from clinograph.secure.runtime.models import RunModels
from clinograph.secure.runtime.run import CandidateRun, run_federation
from clinograph.secure.runtime.workers import ProcessTransport
from clinograph.secure.server import FederationServer

from clinograph.core.arguments import checked_arguments
from clinograph.core.errors import ConfigError
from clinograph.core.identity import Identity

from ..config import SimulationConfig
from ..ingest.sources import ingest_site, load_site_source
from ..ingest.table import PatientTable
from ..ontology import FeatureDictionary
from ..outdir import output_folder
from .build import build_hospital, run_models
from .candidates import Candidate, candidate_configs
from .client import HospitalClient
from .member import FederationMember, MemberCandidate, canonical, with_horizon
from .refused import RunRefused, refusal, set_aside_refused_run
from .setup import HospitalSetup


@dataclass
class SimulatedFederation:
    """One model's server, every hospital, the transport between them and the audit trail: for
    tests and studies that drive rounds themselves (:func:`build_simulation`)."""

    server: FederationServer
    hospitals: dict[str, HospitalClient]
    transport: InProcessTransport
    audit: AuditTrail
    liveness: Liveness | None = None
    audit_dir: Path | None = None
    #: the dictionary the hospitals train with (derived by [scaling] source = 'federated', else the given one)
    dictionary: FeatureDictionary | None = None

    def run_round(self) -> RoundOutcome:
        """One round with every live hospital (suspended ones only when due a retry)."""
        if self.liveness is None:
            return run_round(self.server, self.transport)
        invited = self.liveness.invited(self.server.round, self.hospitals)
        outcome = run_round(self.server, self.transport, participants=invited)
        for kind, payload in self.liveness.observe(outcome.result.round, invited, outcome.result.contributors):
            self.server.audit.record(kind, payload)
        return outcome

    def evaluate(self, split: str = "test") -> dict[str, dict[str, float]]:
        """Each hospital's metrics on its own ``split`` with its current model (global + personal)."""
        return {n: h.task.evaluate(split) for n, h in sorted(self.hospitals.items())}


@dataclass
class SimulationResult:
    """Per-round test metrics per hospital, final metrics (the selected, calibrated model),
    timings, dropouts, ε, the audit directory, and ``selection``: the kept round, the federated
    validation loss curve, whether the run stopped early, each hospital's calibration and its
    uncalibrated test metrics."""

    rounds: list[dict[str, dict[str, float]]] = field(default_factory=list)
    selection: dict = field(default_factory=dict)
    final: dict[str, dict[str, float]] = field(default_factory=dict)
    timings: dict[str, list[float]] = field(default_factory=dict)
    dropped: list[dict[str, str]] = field(default_factory=list)
    audit_dir: Path | None = None
    epsilons: dict[str, list[float]] = field(default_factory=dict)
    #: the per-federation model choice: the chosen candidate and every candidate's kept round,
    #: rounds run and federated validation loss; empty: one model ran
    choice: dict = field(default_factory=dict)
    #: each candidate's test metrics after its own run (its selected, calibrated model), by candidate
    #: name, then hospital, then metric: ``{"linear": {"north": {"auroc": 0.81, ...}, ...}, ...}``.
    #: Public and stable, for studies comparing candidates; the hospitals' own test metrics, which a
    #: deployment's hospitals keep to themselves; never used for the choice and not audited.
    #: Empty when one model ran; a candidate early elimination dropped before its run ended is
    #: absent (it kept no model). (``choice["final_by_candidate"]`` is the same mapping, kept for
    #: existing code.)
    metrics_by_candidate: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    #: every hospital as the run left it (``.client``: its kept model; ``.clients``: each candidate's)
    hospitals: dict[str, FederationMember] = field(default_factory=dict, repr=False)


@dataclass
class _Prepared:
    """What the run needs: tables, dictionary, candidates, identities, the run's models."""

    tables: list[PatientTable]
    dictionary: FeatureDictionary
    config: SimulationConfig
    candidates: list[Candidate]
    server_id: Identity
    ids: dict[str, Identity]
    models: RunModels
    #: (table, hospital config) -> the hospital's task; None: :func:`.build.build_task`
    task_factory: Callable[[PatientTable, Any], Any] | None = None


def _beside_audit(config: SimulationConfig, audit_dir: Path) -> SimulationConfig:
    """``config`` with ``output`` = the audit directory's folder when the config names none (a config
    built in code: ``output`` not in ``model_fields_set``). The run's files -- each hospital's state
    (anchor, checkpoints, ledger, kept model), the task strategy's public files, the candidates' --
    then go beside the audit directory the caller chose, not into ``runs/simulation`` under the
    process's working folder, where every later run in that folder found them (and a DP run refused
    the ledger another run's identity had signed). ``simulate_from_config``'s audit directory is
    ``<output>/audit``: the same folder."""
    if "output" in config.model_fields_set:
        return config
    return config.model_copy(update={"output": Path(audit_dir).absolute().parent})


def _prepare(tables: Sequence[PatientTable], dictionary: FeatureDictionary, config: SimulationConfig, *,
             server_identity: Identity | None, choose: bool, audit_dir: Path) -> _Prepared:
    """Identities, the candidates and the run's models (with the set-up sums the config asks
    for, exactly as ``clinograph model init`` writes them); refusals before anything runs."""
    from ..tasks import create_task

    config = _beside_audit(config, audit_dir)

    wrong = sorted({type(t).__name__ for t in tables if not isinstance(t, PatientTable)})
    if wrong:
        raise ConfigError(f"simulate needs each hospital's ingested table (cg.ingest(...)'s PatientTable), got "
                          f"{', '.join(wrong)}; or run the config's own tables with cg.simulate_from_config(config).")
    if create_task(config.task).participant is not None:  # concepts: a voted run, hospitals built from files
        raise ConfigError(f"task = {config.task!r} builds each hospital from its own files (concepts: its concept "
                          "columns and its own DAG proposal); simulate() builds hospitals from tables under one shared "
                          "config. Run it in process with its own driver (concepts: clinograph.sdk.concepts.federation."
                          "run_concept_federation, or `clinograph demo --concepts`) or over Flower (docs/concepts.md).")
    config = _with_task_strategy(config, dictionary=dictionary)
    fed = config.federation
    from clinograph.secure.strategies.attention import check_secure_mode

    check_secure_mode(fed.strategy, fed.secure_mode)  # refused before anything is written
    names = [t.site for t in tables]
    if len(set(names)) != len(names):
        raise ConfigError(f"Two hospitals share a site name: {sorted(n for n in names if names.count(n) > 1)}.")
    server_id = server_identity or Identity.generate("server")
    ids = {t.site: Identity.generate(t.site) for t in tables}
    if config.privacy.enabled and config.privacy.mode == "distributed":  # σ and q, if left out (one operator)
        from .dp_policy import with_public_parameters

        spec = run_models(config.hospital_config(), dictionary=dictionary, candidates=[]).candidates[0].initial.spec
        config = with_public_parameters(config, n_hospitals=len(tables), dim=sum(m.size for m in spec.shared))
    cands = candidate_configs(config) if choose else []
    if config.scaling.source == "federated" and config.privacy.enabled and config.privacy.mode == "distributed":
        raise ConfigError("[scaling] source = 'federated' under [privacy] mode = 'distributed': the histograms are "
                          "released with local noise, accounted in the local-DP ledger (sdk/privacy/counts.py), which "
                          "the distributed-DP trainer does not keep; use source = 'dictionary', or mode = 'local'.")
    shared_asked = [c for c in cands if c.config.model.features == "shared"]
    if config.model.features == "shared" or shared_asked:
        from .coverage import refuse_unresolvable

        refuse_unresolvable(config if config.model.features == "shared" else shared_asked[0].config)
    models = run_models(config.hospital_config(), dictionary=dictionary, candidates=cands)
    return _Prepared(tables=list(tables), dictionary=dictionary, config=config, candidates=cands, server_id=server_id,
                     ids=ids, models=models)


def _with_task_strategy(config: SimulationConfig, *, dictionary: FeatureDictionary) -> SimulationConfig:
    """``config`` with the server strategy its task needs (:func:`clinograph.sdk.tasks.task_strategy`):
    its public files written into the output folder and pinned in ``strategy_options`` unless the
    config pins them already (each hospital checks the pin against what it derived itself)."""
    from ..tasks import task_strategy

    fed = config.federation
    needed = task_strategy(config.hospital_config(), dictionary=dictionary, directory=Path(config.output))
    if needed is None:
        return config
    name, options = needed
    if fed.strategy != name:
        raise ConfigError(f"task = {config.task!r} needs [federation] strategy = {name!r} (the server's side of the "
                          f"task); this config sets {fed.strategy!r}. Set strategy = {name!r}.")
    if fed.strategy_options:
        return config
    return config.model_copy(update={"federation": fed.model_copy(update={"strategy_options": options})})


def _server_side(prep: _Prepared, *, audit_dir: Path) -> ServerSide:
    config = prep.config
    policy = config.dp_policy()
    if config.privacy.enabled and config.privacy.mode == "distributed":
        from .dp_policy import check_simulation, distributed_policy

        policy = distributed_policy(config)
        dim = sum(m.size for m in prep.models.candidates[0].initial.spec.shared)
        check_simulation(config, prep.tables, dim=dim)  # refused here if it cannot keep its promise
    return ServerSide(federation=config.federation, identity=prep.server_id,
                      enrolled={n: i.public for n, i in prep.ids.items()}, dp_policy=policy.policy() if policy else None,
                      audit_dir=Path(audit_dir))


def _hospital(prep: _Prepared, table: PatientTable, config: SimulationConfig, federation_id: str, *,
              rounds: int | None = None, setup: HospitalSetup | None = None) -> HospitalClient:
    hconf = with_horizon(config.hospital_config(), rounds)
    dictionary = prep.dictionary
    if setup is not None:  # what the run's set-up sums derived: rescaled table and dictionary, shared features
        hconf, table, dictionary = setup.resolve(hconf), setup.table, setup.dictionary
    publics = {n: i.public for n, i in prep.ids.items()}
    task = prep.task_factory(table, hconf) if prep.task_factory is not None else None
    return build_hospital(table, dictionary=dictionary, config=hconf, identity=prep.ids[table.site],
                          server=prep.server_id.public, peers=publics, federation_id=federation_id,
                          state_dir=Path(hconf.privacy.state_dir or config.output) / table.site, task=task)


def _members(prep: _Prepared) -> dict[str, FederationMember]:
    config = prep.config
    cands = prep.candidates or [Candidate(name="model", overrides={}, config=config)]
    publics = {n: i.public for n, i in prep.ids.items()}
    out = {}
    for t in prep.tables:
        setup = HospitalSetup(table=t, dictionary=prep.dictionary, config=config.hospital_config(),
                              state_dir=Path(config.output) / t.site,
                              candidates=prep.candidates, identity=prep.ids[t.site], server=prep.server_id.public,
                              peers=publics, federation_id=config.federation.id) if prep.models.setup else None
        out[t.site] = FederationMember(
            identity=prep.ids[t.site], server=prep.server_id.public, federation_id=config.federation.id,
            candidates=[MemberCandidate(name=c.name, overrides=canonical(c.overrides),
                                        build=lambda fid, rounds, t=t, c=c, setup=setup: _hospital(
                                            prep, t, _output(c, config), fid, rounds=rounds, setup=setup))
                        for c in cands], setup=setup)
    return out


def _output(c: Candidate, base: SimulationConfig) -> SimulationConfig:
    """A candidate's config with its own output folder (its hospitals' exported models)."""
    cfg = c.config if isinstance(c.config, SimulationConfig) else base
    if c.name == "model":
        return cfg
    return cfg.model_copy(update={"output": Path(base.output) / "candidates" / c.name})


@checked_arguments
def build_simulation(tables: Sequence[PatientTable], dictionary: FeatureDictionary, config: SimulationConfig, *,
                     audit_dir: Path, server_identity: Identity | None = None) -> SimulatedFederation:
    """One model (``config``'s own; candidates ignored) ready for rounds driven by the caller:
    the run's set-up sums (:func:`clinograph.secure.runtime.setup.run_setup`, as in a run),
    identities, hospitals, the server (same :class:`ServerSide` as :func:`simulate`, CKKS
    ceremony included) and its audit trail."""
    from clinograph.secure.runtime.setup import run_setup

    prep = _prepare(tables, dictionary, config, server_identity=server_identity, choose=False, audit_dir=audit_dir)
    side = _server_side(prep, audit_dir=audit_dir)
    members = _members(prep)
    models = run_setup(prep.models, side=side, transport=InProcessTransport(members), event=lambda kind, data: None)
    hospitals = {n: m.active for n, m in members.items()}
    transport = InProcessTransport(hospitals)
    server, narrowed = side.open_run(models.candidates[0], run_id=prep.config.federation.id,
                                     transport=transport)
    setups = [m.setup for m in members.values() if m.setup is not None]
    fed = prep.config.federation
    liveness = Liveness(suspend_after=fed.suspend_after_missed, retry_every=fed.retry_every)
    return SimulatedFederation(server=server, hospitals=hospitals, transport=narrowed, audit=server.audit,  # type: ignore[arg-type]
                               liveness=liveness, audit_dir=Path(audit_dir),
                               dictionary=setups[0].dictionary if setups else prep.dictionary)


@checked_arguments
def simulate(tables: Sequence[PatientTable], dictionary: FeatureDictionary, config: SimulationConfig, *,
             audit_dir: Path, on_round: Callable[[int, dict[str, dict[str, float]]], None] | None = None,
             drop_at: Mapping[int, Mapping[str, int]] | None = None, choose: bool = True,
             task_factory: Callable[[PatientTable, Any], Any] | None = None,
             on_event: Callable[[str, Mapping[str, Any]], None] | None = None) -> SimulationResult:
    """The federation ``config`` describes, as ``clinograph simulate`` and a Flower deployment run
    it (:func:`clinograph.secure.runtime.run.run_federation`): with ``[selection] candidates``
    (the default for binary static NS-FL: the wide path alone, with shape functions, and each
    beside the GNN) and ``restarts`` every candidate runs and the one with the lowest federated
    validation loss is kept (``result.choice``); ``choose=False`` runs ``config``'s own model
    only. Every run evaluates each hospital's test split after each round.

    ``drop_at[r][name] = k``: hospital ``name`` goes silent in round ``r`` from its k-th exchange
    on (in every candidate's run). ``task_factory(table, hospital_config)``: each hospital's task
    when it is not built from the config alone (e.g. a modality task over the hospital's signals).
    ``on_event(kind, data)``: every progress event of the run (names, counts, seconds -- no data).
    A run every hospital refused before round 1 raises a ProtocolError naming their refusals and
    the audit log that holds them (no metrics: they would be the untrained model's). The run's
    other files (each hospital's state, ledger and kept model; the candidates') go in ``config.output``,
    or, for a config that names none, in ``audit_dir``'s folder (:func:`_beside_audit`).
    """
    prep = _prepare(tables, dictionary, config, server_identity=None, choose=choose, audit_dir=audit_dir)
    prep.task_factory = task_factory
    side = _server_side(prep, audit_dir=audit_dir)
    members = _members(prep)
    transport = _transport(prep, members)
    try:
        for r, silent in (drop_at or {}).items():
            transport.drop_at(r, silent)
        result = _run(prep, side, transport, audit_dir=Path(audit_dir), on_round=on_round, on_event=on_event)
        refused = None if result.rounds else refusal(Path(audit_dir))
        if refused is not None:  # every hospital refused before round 1: the metrics would be the untrained model's
            raise refused
        if isinstance(transport, ProcessTransport):
            members = transport.members()
        result.hospitals = members
        return result
    finally:
        if isinstance(transport, ProcessTransport):
            transport.close()


def _transport(prep: _Prepared, members: dict[str, FederationMember]) -> InProcessTransport:
    """``[simulation] workers``: the hospitals in this process (1), or in forked worker processes.

    ``"auto"`` also stays in this process where forking is missing or unsafe: a process running other
    Python threads (an application embedding the SDK, a web server) would fork with their locks held,
    and a worker could hang on one. An explicit count N >= 2 forks anyway, with a warning there."""
    import multiprocessing
    import threading

    workers = prep.config.simulation.worker_count(len(members))
    auto = prep.config.simulation.workers == "auto"
    no_fork = "fork" not in multiprocessing.get_all_start_methods()  # 'auto' stays serial there; N >= 2 is refused
    threads = threading.active_count() > 1
    if workers < 2 or (auto and (no_fork or threads)):
        return InProcessTransport(members)
    if threads:
        warnings.warn(f"[simulation] workers = {workers} forks this process while it runs {threading.active_count() - 1} "
                      "other Python thread(s); a lock one of them holds at the fork stays locked in the workers. "
                      "Use workers = 'auto' (serial here) or 1 in an application that runs threads.",
                      RuntimeWarning, stacklevel=3)
    anchors = [prep.server_id, *prep.ids.values(), *(c.build for m in members.values() for c in m.candidates.values())]
    return ProcessTransport(members, workers=workers, after_fork=_after_fork, anchors=anchors,
                            reply_timeout=prep.config.simulation.reply_timeout)


def _after_fork() -> None:
    """In a worker, first: torch on one thread (forking after OpenMP was used is safe only so, and
    the workers share the cores)."""
    import torch

    torch.set_num_threads(1)


def _observe(member: FederationMember, dropped: frozenset[str]) -> dict[str, Any]:
    """One hospital after a round (run where the hospital lives; ``dropped``: the round's dropped
    hospitals): its training seconds, its ε when it contributed under local DP, its test metrics
    with its current model."""
    out = member.name in dropped
    epsilon = None
    if not out and member.last is not None and member.last.ledger is not None:
        epsilon = member.last.ledger.epsilon
    return {"train_seconds": 0.0 if out else member.last_train_seconds, "epsilon": epsilon,
            "metrics": member.active.task.evaluate("test")}


def _finish(member: FederationMember, selected: bool) -> dict[str, Any]:
    """One hospital at its run's end: test metrics with its kept model; with ``selected``, also its
    calibration and the test metrics without it."""
    task = member.active.task
    out: dict[str, Any] = {"final": task.evaluate("test")}
    if selected:
        cal, task.calibration = task.calibration, None
        out["uncalibrated"] = task.evaluate("test")
        task.calibration = cal
        out["calibration"] = {"a": cal.a if cal else 1.0, "b": cal.b if cal else 0.0}
    return out


def _run(prep: _Prepared, side: ServerSide, transport: InProcessTransport, *, audit_dir: Path,
         on_round: Callable[[int, dict[str, dict[str, float]]], None] | None,
         on_event: Callable[[str, Mapping[str, Any]], None] | None) -> SimulationResult:
    """The run over ``transport``; the hospitals' state is read through ``transport.call``."""
    fed = prep.config.federation
    results: dict[str, SimulationResult] = {}
    opened: dict[int, float] = {}

    def event(kind: str, data: Mapping[str, Any]) -> None:
        if kind == "round_opened":
            opened[int(data["round"])] = time.perf_counter()
        if on_event is not None:
            on_event(kind, data)

    def round_done(run: CandidateRun, r: int, outcome: RoundOutcome) -> None:
        res = results.setdefault(run.name, SimulationResult(audit_dir=audit_dir))
        total = time.perf_counter() - opened.get(outcome.result.round, time.perf_counter())
        seen = transport.call(_observe, frozenset(outcome.dropped))
        train = sum(o["train_seconds"] for o in seen.values())
        res.timings.setdefault("round_seconds", []).append(total)
        res.timings.setdefault("local_training_seconds", []).append(train)
        res.timings.setdefault("protocol_and_aggregation_seconds", []).append(total - train)
        res.dropped.append(outcome.dropped)
        for n, o in seen.items():
            if o["epsilon"] is not None:
                res.epsilons.setdefault(n, []).append(o["epsilon"])
        metrics = {n: o["metrics"] for n, o in seen.items()}
        res.rounds.append(metrics)
        if on_round is not None:
            on_round(r, metrics)

    def run_done(run: CandidateRun) -> None:
        res = results.setdefault(run.name, SimulationResult(audit_dir=audit_dir))
        t = run.control.tracker
        selected = t is not None and t.best_round is not None
        done = transport.call(_finish, selected)
        res.final = {n: d["final"] for n, d in done.items()}
        if not selected:
            return
        res.selection = {"round": t.best_round, "validation_loss": t.best_loss, "rounds_evaluated": list(t.rounds),
                         "validation_losses": list(t.losses), "stopped_early": bool(run.control.stopped),
                         **({"validation_noises": list(t.noises)} if any(t.noises) else {}),
                         "patience": t.rule.patience,
                         "calibration": {n: d["calibration"] for n, d in done.items()},
                         "uncalibrated": {n: d["uncalibrated"] for n, d in done.items()}}

    fed_run = run_federation(prep.models, side=side, transport=transport, rounds=fed.rounds, on_event=event,
                             on_round=round_done, on_run_end=run_done,
                             liveness=lambda: Liveness(suspend_after=fed.suspend_after_missed,
                                                       retry_every=fed.retry_every))
    kept = fed_run.kept
    result = results.setdefault(kept.name, SimulationResult(audit_dir=audit_dir))
    if fed_run.chosen is not None:
        result.metrics_by_candidate = {r.name: results[r.name].final for r in fed_run.runs
                                       if r.name in results and r.ended}  # an eliminated run never finished
        result.choice = {"chosen": kept.name, "candidates": [r.row() for r in fed_run.runs],
                         "min_delta": prep.config.selection.min_delta,
                         "final_by_candidate": result.metrics_by_candidate}
    return result


def simulate_one(tables: Sequence[PatientTable], dictionary: FeatureDictionary, config: SimulationConfig, *,
                 audit_dir: Path, on_round: Callable[[int, dict[str, dict[str, float]]], None] | None = None,
                 drop_at: Mapping[int, Mapping[str, int]] | None = None) -> SimulationResult:
    """Exactly ``config``'s own model (its candidates ignored): :func:`simulate` with ``choose=False``."""
    return simulate(tables, dictionary, config, audit_dir=audit_dir, on_round=on_round, drop_at=drop_at,
                    choose=False)


def load_tables(config: SimulationConfig) -> tuple[list[PatientTable], FeatureDictionary]:
    """Ingest every hospital's table; the problems of all hospitals are reported together."""
    from clinograph.core.errors import ConfigError, SchemaError

    dictionary = FeatureDictionary.from_toml(config.require_dictionary())
    tables, problems, unreadable = [], [], []
    for h in config.hospitals:
        try:
            schema = load_site_source(h.schema_file)  # a site schema, or an EHR source file ([omop], [meds], [fhir])
            if schema.site != h.site:
                problems.append(f"[hospitals] site {h.site!r}: its schema {h.schema_file} says site {schema.site!r}.")
                continue
            tables.append(ingest_site(h.table, schema, dictionary=dictionary, base=Path(h.schema_file).parent))
        except SchemaError as exc:
            problems.extend(f"{h.site}: {p}" for p in exc.problems)
        except ConfigError as exc:  # a missing file: reported with the other hospitals' problems
            unreadable.append(f"{h.site}: {exc}")
    timed = [t.site for t in tables if t.survival is not None]
    if timed and config.target.kind != "survival":  # the event alone: censored patients would count as negatives
        problems.append(f"The site schemas of {', '.join(map(repr, timed))} declare [survival] (follow-up time and "
                        f"event), but the config's [target] kind is {config.target.kind!r}: the event would be "
                        "trained as a 0/1 label with the follow-up time dropped, and a patient censored early "
                        "would count as event-free. Set [target] kind = \"survival\" with breaks in the config, "
                        "or give those schemas a label instead of [survival].")
    if problems:
        raise SchemaError(unreadable + problems, title="Hospital tables cannot be ingested")
    if unreadable:
        raise ConfigError(" ".join(unreadable))
    if len(tables) < 2:
        raise SchemaError([f"A federation needs at least 2 hospitals; the config lists {len(tables)}. "
                           "Add [[hospitals]] entries."], title="Too few hospitals")
    return tables, dictionary


def one_class_hospitals(tables: Sequence[PatientTable], config: SimulationConfig) -> list[tuple[str, int, int]]:
    """(site, its one label, patients) of every labelled hospital of a binary target whose patients
    all carry the same label: it cannot be evaluated alone (AUROC undefined) and pulls a shared
    model towards that class -- most often a label column or coding gone wrong (``clinograph
    check`` warns the same)."""
    if config.target.kind != "binary":
        return []
    out = []
    for t in tables:
        pos, neg = int((t.labels == 1).sum()), int((t.labels == 0).sum())
        if t.report.labelled and t.n_patients and not (pos and neg):
            out.append((t.site, 1 if pos else 0, t.n_patients))
    return out


@checked_arguments
def simulate_from_config(config: SimulationConfig, *,
                         on_round: Callable[[int, dict[str, dict[str, float]]], None] | None = None,
                         on_event: Callable[[str, Mapping[str, Any]], None] | None = None) -> SimulationResult:
    """Ingest, build, run; the audit directory is ``<output>/audit`` (refused if it holds a run).
    A run every hospital refused before round 1 raises a ProtocolError after moving its audit log to
    ``<output>/audit-refused-<time>`` (:mod:`.refused`), so the same call runs again.
    With ``[selection] candidates`` (default for binary NS-FL: :data:`.candidates.DEFAULT_BINARY_CANDIDATES`)
    every candidate runs and the lowest federated validation loss is kept (:mod:`.candidates`)."""
    tables, dictionary = load_tables(config)
    if on_event is not None:
        for site, label, n in one_class_hospitals(tables, config):
            on_event("hospital_one_class", {"site": site, "label": label, "patients": n})
        for t in tables:  # mapped columns a hospital lacks or never filled: features it does not have (warned)
            if t.report is not None and (t.report.absent_columns or t.report.empty_columns):
                on_event("hospital_missing_columns", {"site": t.site, "absent": list(t.report.absent_columns),
                                                      "empty": list(t.report.empty_columns)})
            if t.report is not None and t.report.far_from_reference:  # a likely wrong unit (sdk/ingest/plausibility.py)
                on_event("hospital_far_from_reference", {"site": t.site, "columns": sorted(t.report.far_from_reference)})
    output_folder(config.output, what="The config's `output`")
    audit_dir = config.output / "audit"
    if audit_dir.exists() and not audit_dir.is_dir():
        raise ConfigError(f"Output {audit_dir} exists and is not a folder; choose another `output`.")
    if audit_dir.exists() and any(audit_dir.iterdir()):
        raise ConfigError(f"Audit directory {audit_dir} already holds a run; choose another `output` or move it.")
    try:
        return simulate(tables, dictionary, config, audit_dir=audit_dir, on_round=on_round, on_event=on_event)
    except RunRefused as refused:  # refused before round 1: audit kept aside, the rerun free
        raise set_aside_refused_run(audit_dir, refused) from None
