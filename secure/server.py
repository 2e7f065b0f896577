"""The federation server: a transport-agnostic state machine over signed messages.

It holds the ModelSpec and the global state of the shared modules, plans rounds, checks each
hospital's report against the federation's DP policy, runs the chosen secure-aggregation
mode, applies the strategy module-wise and records every step in the audit trail. It never
sees a personal module, and in ``masked`` mode never a single hospital's update.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .aggregation import AggregationServer, ModuleSums, create_mode
from .aggregation.checks import check_header, encode_modules
from .audit.canonical import canonical_json
from .errors import ConfigError, ProtocolError
from .identity import Identity, PublicIdentity
from .messages import ClientReport, DPPolicy, GlobalModel, RoundPlan, RoundResult
from .policy import Environment, require_allowed
from .spec import ModelSpec
from .state import UNKNOWN_STATE, State, check_state, state_digest
from .strategies import Strategy
from .wire import Envelope, open_envelope, parse_envelope, seal


class AuditSink(Protocol):
    """What the server needs of :class:`clinograph.secure.audit.AuditTrail`."""

    def record(self, kind: str, payload: Mapping[str, Any]) -> Any: ...
    def publish(self, name: str, data: bytes, *, kind: str, meta: Mapping[str, Any] | None = None) -> str: ...
    def store_envelope(self, envelope_bytes: bytes, *, kind: str, sender: str) -> str: ...


@dataclass
class OpenRound:
    """Server-side state of the round in progress."""

    plan: RoundPlan
    plan_bytes: bytes
    aggregation: AggregationServer
    reports: dict[str, ClientReport] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)


class FederationServer:
    """Plans rounds, admits updates, aggregates module-wise, publishes audited artefacts."""

    def __init__(self, *, federation_id: str, spec: ModelSpec, initial_state: Mapping[str, np.ndarray],
                 dictionary_hash: str, identity: Identity, enrolled: Mapping[str, PublicIdentity],
                 secure_mode: str, strategy: Strategy, min_clients: int, local_epochs: int,
                 dp_policy: DPPolicy | None, audit: AuditSink, environment: Environment,
                 plan_options: Callable[[tuple[str, ...]], Mapping[str, float | int | str | bool]] | None = None,
                 mode_server: Callable[..., AggregationServer] | None = None):
        """Use :func:`clinograph.secure.runtime.build_server`, which decides every parameter once.

        ``plan_options(participants)`` gives the secure mode's public parameters for a round
        with those participants (masked: neighbours, threshold and fixed-point scales).
        """
        self.mode = create_mode(secure_mode)
        if self.mode.insecure:
            require_allowed(secure_mode, environment=environment, why="the server sees every hospital's update")
        if min_clients < 1 or min_clients > len(enrolled):
            raise ConfigError(f"min_clients = {min_clients} must be between 1 and the {len(enrolled)} enrolled hospitals.")
        self.federation_id = federation_id
        self.spec = spec
        self.state: State | None = check_state(spec, initial_state)
        self.dictionary_hash = dictionary_hash
        self.identity = identity
        self.enrolled = dict(enrolled)
        self.strategy = strategy
        self.min_clients = min_clients
        self.local_epochs = local_epochs
        self.dp_policy = dp_policy
        self.audit = audit
        self.environment = environment
        self._plan_options = plan_options or (lambda participants: {})
        self._mode_server = mode_server or self.mode.server  # ckks: CkksServer.with_context(ctx)
        self.round = 0
        self.history: list[RoundResult] = []
        self._current: OpenRound | None = None
        audit.record("manifest", {
            "federation_id": federation_id,
            "server": {"name": identity.name, "public_key": identity.public.b64()},
            "hospitals": {n: p.b64() for n, p in sorted(self.enrolled.items())},
            "dictionary_hash": dictionary_hash,
            "secure_mode": secure_mode,
            "strategy": strategy.name,
            "dp_policy": dp_policy.model_dump(mode="json") if dp_policy else None,
            "spec_digest": spec.digest(),
            "insecure_options": [secure_mode] if self.mode.insecure else [],
            "environment": environment,
        })

    # -- stage 1: the plan --------------------------------------------------------------
    def open_round(self, participants: tuple[str, ...]) -> bytes:
        """Sign and log the plan for the next round; returns the plan envelope's bytes."""
        if self._current is not None:
            raise ProtocolError(f"Round {self.round} is still open; close it before opening another.")
        unknown = sorted(set(participants) - set(self.enrolled))
        if unknown:
            raise ConfigError(f"Participants {unknown} are not enrolled. Enrolled: {sorted(self.enrolled)}.")
        weights = self.strategy.client_weights(round_=self.round, participants=participants)
        options: dict[str, float | int | str | bool] = {**self._plan_options(tuple(sorted(participants))),
                                                        **self.strategy.plan_options()}
        options.update({f"strategy.{k}": v for k, v in self.strategy.constructor_options().items()})
        options.update({f"weight/{c}": float(w) for c, w in weights.items()})
        plan = RoundPlan(
            federation_id=self.federation_id, round=self.round, participants=tuple(sorted(participants)),
            spec=self.spec, dictionary_hash=self.dictionary_hash, secure_mode=self.mode.name,
            strategy=self.strategy.name, min_clients=self.min_clients, local_epochs=self.local_epochs,
            dp_policy=self.dp_policy, global_state_digest=self._state_digest(), options=options,
        )
        plan_bytes = seal(plan, self.identity)
        agg = self._mode_server(plan=plan, peers=self.enrolled, identity=self.identity)
        self._current = OpenRound(plan=plan, plan_bytes=plan_bytes, aggregation=agg)
        self.audit.record("round_plan", {"round": plan.round, "participants": list(plan.participants),
                                         "plan_sha256": parse_envelope(plan_bytes).digest(),
                                         "secure_mode": plan.secure_mode, "strategy": plan.strategy,
                                         "weights": weights, "spec_version": self.spec.version})
        self.audit.publish(f"round-{plan.round:04d}/plan.json", plan_bytes, kind="round_plan")
        return plan_bytes

    @property
    def current(self) -> OpenRound:
        """The open round (ProtocolError if none)."""
        if self._current is None:
            raise ProtocolError("No round is open.")
        return self._current

    # -- stage 2: reports and the mode's messages -------------------------------------------
    def receive_report(self, data: bytes, *, channel: str | None = None) -> bool:
        """Check a hospital's signed report (ledger, released metrics). False = refused.

        ``channel`` is the hospital the transport received it from; an envelope naming anyone
        else is refused under the channel's name, never the name it claims.
        """
        rnd = self.current
        sender = channel or "?"
        try:
            env = self._parse(data)
            self._check_channel(env, channel)
            sender = env.sender
            if sender in rnd.reports:
                raise ProtocolError(f"Replayed report from {sender!r} in round {rnd.plan.round}.")
            report = open_envelope(env, sender=self._peer(sender), model=ClientReport)
            check_header(rnd.plan, sender=sender, federation_id=report.federation_id, round_=report.round,
                         dictionary_hash=report.dictionary_hash)
            if report.client != sender:
                raise ProtocolError(f"Report names {report.client!r} but was signed by {sender!r}.")
            self._check_dp(report)
        except Exception as exc:
            self._reject(sender, exc)
            return False
        rnd.reports[sender] = report
        digest = self.audit.store_envelope(data, kind="client_report", sender=sender)
        self.audit.record("update_accepted", {"round": rnd.plan.round, "client": sender, "report_sha256": digest})
        if report.ledger is not None:
            self.audit.record("ledger", {"client": sender, **report.ledger.model_dump(mode="json")})
        if report.feature_relevance is not None:
            self.audit.record("feature_relevance", {"client": sender, "round": rnd.plan.round,
                                                    "features": report.feature_relevance})
        return True

    def receive(self, data: bytes, *, channel: str | None = None) -> bool:
        """Feed one mode message to the aggregation; False = refused (the client is dropped)."""
        rnd = self.current
        sender = channel or "?"
        try:
            env = self._parse(data)
            self._check_channel(env, channel)
            sender = env.sender
            if sender not in rnd.reports:
                raise ProtocolError(f"{sender!r} sent an update without an accepted report this round.")
            rnd.aggregation.receive(env)
        except Exception as exc:
            self._reject(sender, exc)
            return False
        return True

    def next_stage(self) -> dict[str, bytes] | None:
        """The mode's next per-client messages, or None when aggregation is complete."""
        return self.current.aggregation.next_stage()

    # -- stage 3: close --------------------------------------------------------------------
    def close_round(self, *, decrypted: ModuleSums | None = None) -> RoundResult:
        """Apply the strategy to the aggregate, log it and publish the new global model.

        ``decrypted`` is only for modes where the server does not see the sum (ckks): then the
        server keeps no plaintext state and publishes nothing but the round result.
        """
        rnd = self.current
        self._current = None
        for client, reason in rnd.aggregation.rejected().items():
            rnd.rejected.setdefault(client, reason)
            self.audit.record("update_rejected", {"round": rnd.plan.round, "client": client, "reason": reason})
        try:
            sums = rnd.aggregation.result() if self.mode.server_sees_sum else None
        except ProtocolError as exc:
            self.audit.record("round_aborted", {"round": rnd.plan.round, "reason": str(exc)})
            raise
        metrics = {c: dict(r.metrics) for c, r in rnd.reports.items() if r.metrics}
        self.strategy.observe(round_=rnd.plan.round, metrics=metrics)
        if sums is not None:
            if self.state is None:
                raise ProtocolError("No plaintext state to update: this federation ran a round in a mode "
                                    "where the server does not see the sum.")
            self.state = self.strategy.apply(self.state, sums)
            contributors, coverage = sums.contributors, dict(sums.counts)
        else:
            self.state = None
            contributors, coverage = tuple(sorted(rnd.reports)), {}
        digest = self._state_digest()
        result = RoundResult(federation_id=self.federation_id, round=rnd.plan.round, contributors=contributors,
                             rejected=dict(rnd.rejected), module_coverage=coverage, global_state_digest=digest)
        self.audit.record("aggregate", {"round": rnd.plan.round, "contributors": list(contributors),
                                        "module_coverage": coverage, "global_state_digest": digest,
                                        "modules_updated": len(coverage)})
        if metrics:
            self.audit.record("metrics", {"round": rnd.plan.round, "per_client": metrics})
        self._record_strategy(rnd.plan.round)
        if self.state is not None:
            self.audit.publish(f"round-{rnd.plan.round:04d}/global_model.json", self.global_model_bytes(),
                               kind="global_model", meta={"round": rnd.plan.round, "state_sha256": digest})
        self.history.append(result)
        self.round += 1
        return result

    def global_model_bytes(self) -> bytes:
        """The signed global model (shared modules) -- what hospitals load next round."""
        if self.state is None:
            raise ProtocolError(f"In {self.mode.name!r} mode the server holds no plaintext model.")
        msg = GlobalModel(federation_id=self.federation_id, round=self.round, spec=self.spec,
                          modules=encode_modules(self.state, "<f8"))
        return seal(msg, self.identity)

    # -- helpers -------------------------------------------------------------------------
    def _record_strategy(self, round_: int) -> None:
        """The strategy's audit hook: a strategy may define ``audit_records(round_)`` returning
        ``(kind, payload)`` pairs about the round it just applied (``dag_voting``: its
        ``dag_outcome``). Each is recorded (validated against its kind's schema) and published
        as the artefact ``round-<r>/<kind>.json`` (canonical JSON of the payload). Nothing is
        recorded in modes where the server does not see the sum (the strategy did not run here)."""
        hook = getattr(self.strategy, "audit_records", None)
        if not callable(hook):
            return
        for kind, payload in hook(round_):
            self.audit.record(kind, payload)
            self.audit.publish(f"round-{round_:04d}/{kind}.json", canonical_json(payload), kind=kind,
                               meta={"round": round_})

    def _state_digest(self) -> str:
        return state_digest(self.state) if self.state is not None else UNKNOWN_STATE

    def _peer(self, name: str) -> PublicIdentity:
        try:
            return self.enrolled[name]
        except KeyError:
            raise ProtocolError(f"{name!r} is not enrolled in federation {self.federation_id!r}.") from None

    @staticmethod
    def _check_channel(env: Envelope, channel: str | None) -> None:
        if channel is not None and env.sender != channel:
            raise ProtocolError(f"Envelope names {env.sender[:64]!r} but arrived on {channel!r}'s channel.")

    @staticmethod
    def _parse(data: bytes) -> Envelope:
        return parse_envelope(data)

    def _check_dp(self, report: ClientReport) -> None:
        policy = self.dp_policy
        if policy is None or not policy.required:
            return
        entry = report.ledger
        if entry is None:
            raise ProtocolError("The federation requires DP, but the report carries no ledger entry.")
        problems = []
        if entry.epsilon > policy.max_epsilon:
            problems.append(f"ε = {entry.epsilon:.3f} exceeds the federation's maximum {policy.max_epsilon}")
        if entry.delta > policy.delta:
            problems.append(f"δ = {entry.delta:g} exceeds the federation's δ = {policy.delta:g}")
        if entry.noise_multiplier < policy.min_noise_multiplier:
            problems.append(f"noise multiplier {entry.noise_multiplier} is below the minimum {policy.min_noise_multiplier}")
        if entry.clip_norm > policy.max_clip_norm:
            problems.append(f"clip norm {entry.clip_norm} exceeds the maximum {policy.max_clip_norm}")
        if entry.round != report.round:
            problems.append(f"ledger entry is for round {entry.round}, not {report.round}")
        if problems:
            raise ProtocolError("Update breaks the DP policy: " + "; ".join(problems) + ".")

    def _reject(self, sender: str, exc: Exception) -> None:
        rnd = self.current
        reason = f"{type(exc).__name__}: {exc}"
        rnd.rejected[sender] = reason
        self.audit.record("update_rejected", {"round": rnd.plan.round, "client": sender, "reason": reason})
