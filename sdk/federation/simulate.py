"""A whole federation in one process: the real server, real hospitals, the in-process transport.

Everything a deployment does happens here too -- signed plans, the secure-aggregation mode
(with the CKKS key ceremony relayed like over Flower), module-wise strategy, the audit trail --
and through the same builders (:func:`clinograph.secure.runtime.build_server`,
:func:`.build.build_hospital`) and the same loop (:func:`clinograph.secure.runtime.run_round`).
Only the transport is a function call.

Model selection (``[selection]``, on by default without DP): every round also sums the
hospitals' validation losses through the secure mode (:mod:`clinograph.sdk.training.selection`);
the run stops early after ``patience`` rounds without improvement, one last round scores the
final global model (it trains nothing), every hospital keeps the selected model and fits its
Platt scaling, and the audit trail records a ``model_selected`` entry. ``SimulationResult.final``
holds the selected model's test metrics; ``rounds`` keeps the per-round curves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from clinograph.secure.audit import AuditTrail
from clinograph.secure.ckks.presets import CkksPreset
from clinograph.secure.errors import ConfigError
from clinograph.secure.identity import Identity
from clinograph.secure.runtime import InProcessTransport, build_server, run_ckks_ceremony, run_round
from clinograph.secure.runtime.liveness import Liveness
from clinograph.secure.runtime.loop import RoundOutcome
from clinograph.secure.runtime.participation import end_run
from clinograph.secure.server import FederationServer

from ..config import SimulationConfig
from ..ingest import ingest, read_table
from ..ingest.table import PatientTable
from ..ontology import FeatureDictionary, SiteSchema
from ..outdir import output_folder
from .build import build_hospital, initial_model
from .client import HospitalClient


@dataclass
class SimulatedFederation:
    """The server, every hospital, the transport between them and the audit trail."""

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
    #: the per-federation model choice (:mod:`.candidates`): the chosen candidate and every
    #: candidate's kept round, rounds run and federated validation loss; empty: one model ran
    choice: dict = field(default_factory=dict)


def build_simulation(tables: Sequence[PatientTable], dictionary: FeatureDictionary, config: SimulationConfig, *,
                     audit_dir: Path, server_identity: Identity | None = None) -> SimulatedFederation:
    """Identities, hospitals, transport, key ceremony (ckks), server and audit trail
    (``server_identity``: the server's key, e.g. to add a run to an audit directory it signed)."""
    fed = config.federation
    from clinograph.secure.strategies.attention import check_secure_mode

    check_secure_mode(fed.strategy, fed.secure_mode)  # refused before anything is written
    names = [t.site for t in tables]
    if len(set(names)) != len(names):
        raise ConfigError(f"Two hospitals share a site name: {sorted(n for n in names if names.count(n) > 1)}.")
    server_id = server_identity or Identity.generate("server")
    ids = {t.site: Identity.generate(t.site) for t in tables}
    publics = {n: i.public for n, i in ids.items()}
    hconf = config.hospital_config()
    audit, first_round = None, 0
    if config.scaling.source == "federated":  # set-up round: robust scaling from securely summed histograms
        from .scaling import federated_scaling

        if config.privacy.enabled:
            raise ConfigError("[scaling] source = 'federated' is not covered by the DP accountant (the summed "
                              "histograms are exact); use source = 'dictionary' under [privacy].")
        audit = AuditTrail(audit_dir, identity=server_id)
        try:
            dictionary, tables, first_round = federated_scaling(
                tables, dictionary, scaling=config.scaling, federation=fed, server_identity=server_id,
                identities=ids, audit=audit)
        except BaseException:
            audit.close()
            raise
    if config.model.features == "shared":  # set-up round: the features every hospital observes
        from .coverage import refuse_unresolvable, shared_features, with_features

        refuse_unresolvable(config)
        audit = audit or AuditTrail(audit_dir, identity=server_id)
        try:
            shared, _, first_round = shared_features(tables, dictionary, federation=fed, server_identity=server_id,
                                                     identities=ids, audit=audit, first_round=first_round)
        except BaseException:
            audit.close()
            raise
        config = with_features(config, shared)
        hconf = config.hospital_config()
    hospitals = {t.site: build_hospital(t, dictionary=dictionary, config=hconf, identity=ids[t.site],
                                        server=server_id.public, peers=publics, federation_id=fed.id,
                                        state_dir=Path(hconf.privacy.state_dir or config.output) / t.site)
                 for t in tables}
    transport = InProcessTransport(hospitals)
    ckks_context = None
    if fed.secure_mode == "ckks":
        ckks_context, _ = run_ckks_ceremony(transport, federation_id=fed.id, participants=tuple(sorted(hospitals)),
                                            enrolled=publics, preset=CkksPreset(fed.ckks_preset),
                                            min_holders=min(fed.min_clients, len(hospitals)))
    first = hospitals[sorted(hospitals)[0]]
    policy = config.dp_policy()
    if config.privacy.enabled and config.privacy.mode == "distributed":
        from .dp_task import check_simulation, distributed_policy

        policy = distributed_policy(config)
        check_simulation(config, tables, dim=first.task.columns.dim)  # refused here if it cannot keep its promise
    audit = audit or AuditTrail(audit_dir, identity=server_id)
    try:
        server = build_server(federation=fed, identity=server_id, enrolled=publics,
                              initial=initial_model(first.task, dictionary=dictionary), audit=audit,
                              dp_policy=policy.policy() if policy else None, ckks_context=ckks_context)
    except BaseException:
        audit.close()
        raise
    server.round = first_round  # one audit trail: training rounds continue after the set-up round
    liveness = Liveness(suspend_after=fed.suspend_after_missed, retry_every=fed.retry_every)
    return SimulatedFederation(server=server, hospitals=hospitals, transport=transport, audit=audit,
                               liveness=liveness, audit_dir=Path(audit_dir), dictionary=dictionary)


def simulate(tables: Sequence[PatientTable], dictionary: FeatureDictionary, config: SimulationConfig, *,
             audit_dir: Path, on_round: Callable[[int, dict[str, dict[str, float]]], None] | None = None,
             drop_at: Mapping[int, Mapping[str, int]] | None = None) -> SimulationResult:
    """The federation ``config`` describes, as ``clinograph simulate`` runs it: with
    ``[selection] candidates`` (the default for binary static NS-FL: the wide path alone, with
    shape functions, and each beside the GNN) every candidate runs and the one with the lowest federated validation loss
    is kept (:func:`.candidates.simulate_choosing`, ``result.choice``); otherwise one model
    (:func:`simulate_one`). Every run evaluates each hospital's test split after each round.

    ``drop_at[r][name] = k``: hospital ``name`` goes silent in round ``r`` from its k-th exchange
    on (in every candidate's run).
    """
    from .candidates import simulate_choosing

    return simulate_choosing(tables, dictionary, config, audit_dir=audit_dir, on_round=on_round, drop_at=drop_at)


def simulate_one(tables: Sequence[PatientTable], dictionary: FeatureDictionary, config: SimulationConfig, *,
                 audit_dir: Path, on_round: Callable[[int, dict[str, dict[str, float]]], None] | None = None,
                 drop_at: Mapping[int, Mapping[str, int]] | None = None) -> SimulationResult:
    """Exactly one model: ``config.federation.rounds`` rounds (early stopping on the federated
    validation loss), ``config``'s candidates ignored. ``drop_at`` as in :func:`simulate`."""
    sim = build_simulation(tables, dictionary, config, audit_dir=audit_dir)
    for r, silent in (drop_at or {}).items():
        sim.transport.drop_at(r, silent)
    return run_simulation(sim, config, on_round=on_round)


def run_simulation(sim: SimulatedFederation, config: SimulationConfig, *,
                   on_round: Callable[[int, dict[str, dict[str, float]]], None] | None = None) -> SimulationResult:
    """The rounds of an already built federation (early stopping on the federated validation
    loss, the selected and calibrated model, the run's end entries); closes its audit trail."""
    result = SimulationResult(audit_dir=sim.audit_dir)
    status, reason = "completed", f"all {config.federation.rounds} planned round(s) ran"
    try:
        for r in range(config.federation.rounds):
            t0 = time.perf_counter()
            outcome = sim.run_round()
            total = time.perf_counter() - t0
            train = sum(h.last_train_seconds for n, h in sim.hospitals.items() if n not in outcome.dropped)
            result.timings.setdefault("round_seconds", []).append(total)
            result.timings.setdefault("local_training_seconds", []).append(train)
            result.timings.setdefault("protocol_and_aggregation_seconds", []).append(total - train)
            result.dropped.append(outcome.dropped)
            for n, h in sim.hospitals.items():
                if h.last is not None and h.last.ledger is not None and n not in outcome.dropped:
                    result.epsilons.setdefault(n, []).append(h.last.ledger.epsilon)
            metrics = sim.evaluate("test")
            result.rounds.append(metrics)
            if on_round is not None:
                on_round(r, metrics)
            if _should_stop(sim):
                status, reason = "completed", f"stopped early after round {r} (validation loss, patience)"
                break
        _select(sim, result, patience=config.selection.patience)
    except BaseException as exc:
        status, reason = "failed", f"{type(exc).__name__}: {exc}"
        raise
    finally:
        try:  # the run's release and run_ended entries, as run_rounds writes them
            end_run(sim.server, status=status, reason=reason, rounds_completed=len(result.rounds),
                    rounds_planned=config.federation.rounds)
        finally:
            sim.audit.close()
    return result


def _selections(sim: SimulatedFederation) -> list:
    return [s for h in sim.hospitals.values() if (s := getattr(h.task, "selection", None)) is not None]


def _should_stop(sim: SimulatedFederation) -> bool:
    sel = _selections(sim)
    return bool(sel) and sel[0].should_stop  # every hospital decoded the same losses


def _select(sim: SimulatedFederation, result: SimulationResult, *, patience: int) -> None:
    """Score the last global model (an evaluation-only round), keep the selected model at every
    hospital, calibrate, record ``model_selected``; ``result.final`` = selected test metrics."""
    sel = _selections(sim)
    if sel and result.rounds:
        stopped = sel[0].should_stop
        for h in sim.hospitals.values():
            h.task.evaluate_only = True
        try:
            sim.run_round()
        finally:
            for h in sim.hospitals.values():
                h.task.evaluate_only = False
    finishes = {n: h.task.finish() for n, h in sorted(sim.hospitals.items()) if hasattr(h.task, "finish")}
    if not sel or sel[0].best_round is None:
        result.final = sim.evaluate("test") if finishes else (result.rounds[-1] if result.rounds else {})
        return
    s = sel[0]
    uncalibrated = {}
    for n, h in sorted(sim.hospitals.items()):
        cal, h.task.calibration = h.task.calibration, None
        uncalibrated[n] = h.task.evaluate("test")
        h.task.calibration = cal
    result.final = sim.evaluate("test")
    result.selection = {"round": s.best_round, "validation_loss": s.best_loss, "rounds_evaluated": list(s.rounds),
                        "validation_losses": list(s.losses), "stopped_early": bool(stopped), "patience": patience,
                        "calibration": {n: {"a": f["platt_a"], "b": f["platt_b"]} for n, f in finishes.items()},
                        "uncalibrated": uncalibrated}
    sim.audit.record("model_selected", {"round": int(s.best_round), "validation_loss": float(s.best_loss),
                                        "rounds_evaluated": len(s.rounds), "patience": int(patience),
                                        "stopped_early": bool(stopped), "losses": [float(x) for x in s.losses]})


def load_tables(config: SimulationConfig) -> tuple[list[PatientTable], FeatureDictionary]:
    """Ingest every hospital's table; the problems of all hospitals are reported together."""
    from clinograph.secure.errors import SchemaError

    if config.dictionary is None:
        raise ConfigError("The config names no feature dictionary: set `dictionary = \"path/to/dictionary.toml\"` "
                          "(the same file every hospital uses; examples/data/dictionary.toml is the demo's). "
                          "There is no default: a silent default would map your tables onto the demo's ontology.")
    dictionary = FeatureDictionary.from_toml(config.dictionary)
    tables, problems = [], []
    for h in config.hospitals:
        try:
            schema = SiteSchema.from_toml(h.schema_file)
            if schema.site != h.site:
                problems.append(f"[hospitals] site {h.site!r}: its schema {h.schema_file} says site {schema.site!r}.")
                continue
            tables.append(ingest(read_table(h.table), schema=schema, dictionary=dictionary))
        except SchemaError as exc:
            problems.extend(f"{h.site}: {p}" for p in exc.problems)
    if problems:
        raise SchemaError(problems, title="Hospital tables cannot be ingested")
    if len(tables) < 2:
        raise SchemaError([f"A federation needs at least 2 hospitals; the config lists {len(tables)}. "
                           "Add [[hospitals]] entries."], title="Too few hospitals")
    return tables, dictionary


def simulate_from_config(config: SimulationConfig, *,
                         on_round: Callable[[int, dict[str, dict[str, float]]], None] | None = None) -> SimulationResult:
    """Ingest, build, run; the audit directory is ``<output>/audit`` (refused if it holds a run).
    With ``[selection] candidates`` (default for binary NS-FL: :data:`.candidates.DEFAULT_BINARY_CANDIDATES`)
    every candidate runs and the lowest federated validation loss is kept (:mod:`.candidates`)."""
    tables, dictionary = load_tables(config)
    output_folder(config.output, what="The config's `output`")
    audit_dir = config.output / "audit"
    if audit_dir.exists() and not audit_dir.is_dir():
        raise ConfigError(f"Output {audit_dir} exists and is not a folder; choose another `output`.")
    if audit_dir.exists() and any(audit_dir.iterdir()):
        raise ConfigError(f"Audit directory {audit_dir} already holds a run; choose another `output` or move it.")
    return simulate(tables, dictionary, config, audit_dir=audit_dir, on_round=on_round)
