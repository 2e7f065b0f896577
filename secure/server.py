"""The federation server: a transport-agnostic state machine over signed messages.

It holds the ModelSpec and the global state of the shared modules, plans rounds, checks each
hospital's report against the federation's DP policy, runs the chosen secure-aggregation
mode, applies the strategy module-wise and records every step in the audit trail. It never
sees a personal module, and in ``masked`` mode never a single hospital's update.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from clinograph.core.errors import ConfigError, IntegrityError, ProtocolError
from clinograph.core.identity import Identity, PublicIdentity
from clinograph.core.spec import ModelSpec

from .aggregation import AggregateVoided, AggregationServer, ModuleSums, create_mode
from .aggregation.checks import Unattributed, authenticate, check_header, encode_modules
from .audit.canonical import canonical_json
from .audit.kinds import UpdateRejected
from .dp_checks import LedgerTrack, Published, check_ledger, distributed_policy, share_problems
from .messages import (
    MAX_MESSAGE_BYTES,
    MAX_REPORT_BYTES,
    VALIDATION_MODULE,
    ClientReport,
    DPPolicy,
    GlobalModel,
    LedgerEntry,
    RoundPlan,
    RoundResult,
    ValidationAggregate,
)
from .policy import Environment, require_allowed
from .state import UNKNOWN_STATE, State, check_state, state_digest
from .strategies import Strategy
from .wire import Envelope, parse_envelope, seal, verify_envelope

#: ``update_rejected`` entries written per authenticated sender per round; later refusals of
#: the same sender are counted in the round's ``unattributed_refusals`` entry (``suppressed``).
MAX_REJECTIONS_PER_SENDER = 8
#: Longest refusal reason the audit takes (``update_rejected.reason``); longer ones are cut.
MAX_REASON_CHARS = next(m.max_length for m in UpdateRejected.model_fields["reason"].metadata
                        if hasattr(m, "max_length"))


class _Header(BaseModel):
    """Federation and round of any client message (to tell a replay from a hospital's mistake)."""

    model_config = ConfigDict(extra="ignore")
    federation_id: str
    round: int


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
    refused: set[str] = field(default_factory=set)  # whose report was refused: out of this round
    report_digests: set[str] = field(default_factory=set)
    unattributed: Counter[str] = field(default_factory=Counter)
    audited: Counter[str] = field(default_factory=Counter)  # update_rejected entries per sender
    suppressed: Counter[str] = field(default_factory=Counter)
    abort: str | None = None
    voided: tuple[str, ...] | None = None  # void_round: the inputs of the refused sum


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
        if dp_policy is not None and dp_policy.insecure_unchecked_prv:
            require_allowed("insecure_unchecked_prv", environment=environment,
                            why="hospitals may keep their ledgers with the PRV accountant, and the server cannot "
                                "check their ε against the RDP bound",
                            fix="Remove [dp_policy] insecure_unchecked_prv and have every hospital use "
                                "[privacy] accountant = \"rdp\".")
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
        #: under distributed DP: the last closed round's aggregate of ``metric/validation`` (for the
        #: hospitals' read of the released loss's noise; None otherwise and after a restore)
        self._validation: ValidationAggregate | None = None
        #: the run's public options for the next plan (``run.phase``, ``selection.*``: set by the
        #: run's control, :class:`clinograph.secure.runtime.loop.RunControl`)
        self.run_options: dict[str, float | int | str | bool] = {}
        self._mode_server = mode_server or self.mode.server  # ckks: CkksServer.with_context(ctx)
        self.round = 0
        self.history: list[RoundResult] = []
        self._current: OpenRound | None = None
        self._plan_heads: dict[int, int] = {}  # round -> audit.seq its (latest) plan presented
        self._ledgers: dict[str, LedgerTrack] = {}  # last accepted ledger per hospital (dp_checks)
        self.record_manifest()

    def record_manifest(self) -> None:
        """Record the ``manifest`` (who is enrolled with which key, under which rules) in the
        audit run: at construction, and again when a paused run goes on in a new audit run."""
        self.audit.record("manifest", {
            "federation_id": self.federation_id,
            "server": {"name": self.identity.name, "public_key": self.identity.public.b64()},
            "hospitals": {n: p.b64() for n, p in sorted(self.enrolled.items())},
            "dictionary_hash": self.dictionary_hash,
            "secure_mode": self.mode.name,
            "strategy": self.strategy.name,
            "dp_policy": self.dp_policy.model_dump(mode="json") if self.dp_policy else None,
            "spec_digest": self.spec.digest(),
            "insecure_options": ([self.mode.name] if self.mode.insecure else [])
            + (["insecure_unchecked_prv"] if self.dp_policy and self.dp_policy.insecure_unchecked_prv else []),
            "environment": self.environment,
        })

    # -- stage 1: the plan --------------------------------------------------------------
    def open_round(self, participants: tuple[str, ...]) -> bytes:
        """Sign and log the plan for the next round; returns the plan envelope's bytes."""
        if self._current is not None:
            raise ProtocolError(f"Round {self.round} is still open; close it before opening another.")
        unknown = sorted(set(participants) - set(self.enrolled))
        if unknown:
            raise ConfigError(f"Participants {unknown} are not enrolled. Enrolled: {sorted(self.enrolled)}.")
        weights = self.strategy.client_weights(round_=self.round, participants=participants,
                                              min_clients=self.min_clients)
        options: dict[str, float | int | str | bool] = {**self._plan_options(tuple(sorted(participants))),
                                                        **self.strategy.plan_options()}
        options.update({f"strategy.{k}": v for k, v in self.strategy.constructor_options().items()})
        options.update({f"weight/{c}": float(w) for c, w in weights.items()})
        options.update(self._audit_head(tuple(participants)))
        if isinstance(options.get("audit.seq"), int):
            self._plan_heads[self.round] = int(options["audit.seq"])
        options.update(self.run_options)
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

    def mode_options(self, participants: tuple[str, ...]) -> dict[str, float | int | str | bool]:
        """The secure mode's public parameters for a round with ``participants`` (what its plan
        would carry). Raises ConfigError when the mode cannot run such a round (e.g. a configured
        masked threshold above their number)."""
        return dict(self._plan_options(tuple(sorted(participants))))

    @property
    def current(self) -> OpenRound:
        """The open round (ProtocolError if none)."""
        if self._current is None:
            raise ProtocolError("No round is open.")
        return self._current

    # -- stage 2: reports and the mode's messages -------------------------------------------
    def receive_report(self, data: bytes, *, channel: str | None = None) -> bool:
        """Check a hospital's signed report (ledger, released metrics). False = refused.

        ``channel`` is the hospital the transport received it from. A message that does not
        authenticate as the channel's hospital's report for this round (see
        :func:`~clinograph.secure.aggregation.checks.authenticate`) is only counted; it changes
        nobody's state. An authenticated report that breaks a rule is refused with an audited
        reason and its sender takes no further part in the round. Never raises for bad input.
        """
        rnd = self.current
        try:
            env = self._open(data, channel=channel, max_bytes=MAX_REPORT_BYTES)
            report = authenticate(rnd.plan, env, peers=self.enrolled, model=ClientReport,
                                  max_bytes=MAX_REPORT_BYTES, seen=rnd.report_digests)
        except Unattributed as exc:
            rnd.unattributed[exc.reason_class] += 1
            return False
        except Exception as exc:  # noqa: BLE001 - a signed but malformed report: the sender's
            self._refuse_report(env.sender, exc)
            return False
        sender = env.sender
        try:
            if sender in rnd.refused:
                raise ProtocolError(f"{sender!r} already had a report refused in round {rnd.plan.round}.")
            if sender in rnd.reports:
                self._reject(sender, ProtocolError(f"Second, different report from {sender!r} in round "
                                                   f"{rnd.plan.round}; the first was kept."))
                return False
            check_header(rnd.plan, sender=sender, federation_id=report.federation_id, round_=report.round,
                         dictionary_hash=report.dictionary_hash)
            if report.client != sender:
                raise ProtocolError(f"Report names {report.client!r} but was signed by {sender!r}.")
            track = self._check_dp(sender, report)
        except Exception as exc:  # noqa: BLE001 - every refusal is audited, none escapes the round
            self._refuse_report(sender, exc)
            return False
        rnd.reports[sender] = report
        if track is not None:
            self._ledgers[sender] = track
        rnd.report_digests.add(env.digest())
        digest = self.audit.store_envelope(data, kind="client_report", sender=sender)
        self.audit.record("update_accepted", {"round": rnd.plan.round, "client": sender, "report_sha256": digest})
        if report.ledger is not None:
            self.audit.record("ledger", {"client": sender, **report.ledger.model_dump(mode="json")})
        if report.feature_relevance is not None:
            self.audit.record("feature_relevance", {"client": sender, "round": rnd.plan.round,
                                                    "features": report.feature_relevance})
        return True

    def receive(self, data: bytes, *, channel: str | None = None) -> bool:
        """Feed one mode message to the aggregation; False = refused.

        As for reports: a message that does not authenticate as the channel's hospital's
        message for this round and stage is counted and changes nothing (the secure mode
        checks stage and duplicates); an authenticated one that breaks a rule is refused with
        an audited reason and the mode drops its sender. Never raises for bad input.
        """
        rnd = self.current
        limit = int(getattr(rnd.aggregation, "max_message_bytes", MAX_MESSAGE_BYTES))
        try:
            env = self._open(data, channel=channel, max_bytes=limit)
            if env.sender not in rnd.reports:
                self._check_authentic(env)
                raise ProtocolError(f"{env.sender!r} sent an update without an accepted report this round.")
            rnd.aggregation.receive(env)
        except Unattributed as exc:
            rnd.unattributed[exc.reason_class] += 1
            return False
        except Exception as exc:  # noqa: BLE001 - every refusal is audited, none escapes the round
            self._reject(env.sender, exc)
            return False
        return True

    def next_stage(self) -> dict[str, bytes] | None:
        """The mode's next per-client messages, or None when aggregation is complete.

        A mode that aborts here (too few survivors) ends the stages; :meth:`close_round` then
        audits the abort and raises it, so the round never stays open.
        """
        rnd = self.current
        if rnd.abort is not None:
            return None
        try:
            return rnd.aggregation.next_stage()
        except ProtocolError as exc:
            rnd.abort = str(exc)
            return None

    def void_round(self, reason: str, *, refused_by: tuple[str, ...]) -> None:
        """Void the open round: :meth:`close_round` then audits it as aborted, with no contributor,
        and raises :class:`~.aggregation.AggregateVoided` naming the hospitals whose inputs were in
        the sum. For modes where only the hospitals see the sum (ckks): ``refused_by`` refused the
        aggregate they decrypted (signed refusals), so it was not applied everywhere."""
        rnd = self.current
        inputs = getattr(rnd.aggregation, "contributors", None)
        rnd.voided = tuple(sorted(inputs if isinstance(inputs, tuple) and inputs else rnd.reports))
        rnd.abort = (f"{len(refused_by)} hospital(s) refused the aggregate ({', '.join(sorted(refused_by))}): "
                     f"{reason} The round is voided; nothing of it is applied.")

    # -- stage 3: close --------------------------------------------------------------------
    def close_round(self, *, decrypted: ModuleSums | None = None) -> RoundResult:
        """Apply the strategy to the aggregate, log it and publish the new global model.

        ``decrypted`` is only for modes where the server does not see the sum (ckks): then the
        server keeps no plaintext state and publishes nothing but the round result.
        """
        rnd = self.current
        self._current = None
        for client, reason in rnd.aggregation.rejected().items():
            if client not in rnd.rejected:
                self._record_rejection(rnd, client, reason)
        if rnd.unattributed or rnd.suppressed:
            self.audit.record("unattributed_refusals", {
                "round": rnd.plan.round, "total": sum(rnd.unattributed.values()),
                "counts": dict(sorted(rnd.unattributed.items())), "suppressed": dict(sorted(rnd.suppressed.items()))})
        try:
            if rnd.abort is not None:
                raise ProtocolError(rnd.abort)
            sums = rnd.aggregation.result() if self.mode.server_sees_sum else None
            if sums is not None:
                self._check_aggregate_noise(rnd, sums)
        except ProtocolError as exc:
            self.audit.record("round_aborted", {"round": rnd.plan.round, "reason": str(exc)[:MAX_REASON_CHARS]})
            # The round number is spent: hospitals that trained in it refuse a second plan for it
            # (replay protection), so the next plan is for the next round, from the same state.
            self.round += 1
            inputs = rnd.voided or rnd.aggregation.voided_inputs
            if inputs and not isinstance(exc, AggregateVoided):
                raise AggregateVoided(str(exc), inputs=inputs) from exc
            raise
        metrics = {c: dict(r.metrics) for c, r in rnd.reports.items() if r.metrics}
        self.strategy.observe(round_=rnd.plan.round, metrics=metrics)
        if sums is not None:
            if self.state is None:
                raise ProtocolError("No plaintext state to update: this federation ran a round in a mode "
                                    "where the server does not see the sum.")
            self.state = self.strategy.apply(self.state, sums)
            contributors, coverage = sums.contributors, dict(sums.counts)
            self._validation = _validation_aggregate(sums) if self._distributed_dp() else None
        else:
            self.state = None
            contributors, coverage = tuple(sorted(rnd.reports)), {}
        digest = self._state_digest()
        sealed_sum = getattr(rnd.aggregation, "aggregate_sha256", None) if sums is None else None
        decrypted_by = getattr(rnd.aggregation, "decrypted_by", None)  # ckks_threshold: who decrypted
        result = RoundResult(federation_id=self.federation_id, round=rnd.plan.round, contributors=contributors,
                             rejected=dict(rnd.rejected), module_coverage=coverage, global_state_digest=digest,
                             ciphertext_sha256=sealed_sum if isinstance(sealed_sum, str) else None)
        self.audit.record("aggregate", {"round": rnd.plan.round, "contributors": list(contributors),
                                        "module_coverage": coverage, "global_state_digest": digest,
                                        "modules_updated": len(coverage),
                                        **({"ciphertext_sha256": result.ciphertext_sha256}
                                           if result.ciphertext_sha256 else {}),
                                        **({"decrypted_by": list(decrypted_by)} if decrypted_by else {})})
        if metrics:
            self.audit.record("metrics", {"round": rnd.plan.round, "per_client": metrics})
        self._record_strategy(rnd.plan.round)
        if self.state is not None:
            self.audit.publish(f"round-{rnd.plan.round:04d}/global_model.json", self.global_model_bytes(),
                               kind="global_model", meta={"round": rnd.plan.round, "state_sha256": digest})
        self.history.append(result)
        self.round += 1
        return result

    def global_model_bytes(self, *, as_published: bool = False) -> bytes:
        """The signed global model (shared modules) -- what hospitals load next round.
        ``as_published``: numbered as when the last closed round published it (round + 1 of that
        round; voided rounds since then advanced :attr:`round`, not the model), for a hospital that
        missed it (:func:`clinograph.secure.runtime.loop.run_round`)."""
        if self.state is None:
            raise ProtocolError(f"In {self.mode.name!r} mode the server holds no plaintext model.")
        number = self.history[-1].round + 1 if as_published and self.history else self.round
        msg = GlobalModel(federation_id=self.federation_id, round=number, spec=self.spec,
                          modules=encode_modules(self.state, "<f8"), validation=self._validation)
        return seal(msg, self.identity)

    def _distributed_dp(self) -> bool:
        return self.dp_policy is not None and self.dp_policy.distributed is not None

    # -- crash journal (clinograph.secure.runtime.journal) ------------------------------
    def ledger_view(self) -> dict[str, dict[str, Any]]:
        """The DP ledgers' server view (last accepted entry and declared RDP per hospital, as exact
        float hex strings) as JSON data."""
        return {n: {"last": t.last.model_dump(mode="json"), "rdp": [float(x).hex() for x in t.rdp],
                    **{k: [float(x).hex() for x in v] for k, v in (("skellam", t.skellam),
                                                                   ("skellam_alone", t.skellam_alone)) if v is not None}}
                for n, t in sorted(self._ledgers.items())}

    def restore(self, *, round_: int, state: Mapping[str, np.ndarray] | None, history: list[RoundResult],
                ledgers: Mapping[str, Mapping[str, Any]]) -> None:
        """Resume from a journalled boundary: next round number, global state (None: a mode where
        the server holds no plaintext model), closed rounds' results and the DP ledgers' view.

        Raises:
            ProtocolError: a round is open (restore only a fresh server).
        """
        if self._current is not None:
            raise ProtocolError("Cannot restore a server with an open round.")
        self.round = int(round_)
        self.state = check_state(self.spec, state) if state is not None else None
        self.history = list(history)
        def floats(v: Mapping[str, Any], key: str) -> np.ndarray | None:
            return None if key not in v else np.array([float.fromhex(x) for x in v[key]], dtype=np.float64)

        self._ledgers = {n: LedgerTrack(last=LedgerEntry.model_validate(v["last"]), rdp=floats(v, "rdp"),  # type: ignore[arg-type]
                                        skellam=floats(v, "skellam"), skellam_alone=floats(v, "skellam_alone"))
                         for n, v in ledgers.items()}

    # -- helpers -------------------------------------------------------------------------
    def _audit_head(self, participants: tuple[str, ...]) -> dict[str, int | str]:
        """The audit trail's head as signed plan options (``audit.seq``, ``audit.head``): hospitals
        keep the latest they saw and refuse a server that presents an older one (rollback) or one
        that does not extend it (a fork). ``audit.proof`` holds the entries since an entry at or
        before every participant's anchor (``audit.proof_from``, :mod:`.audit.consistency`): the
        head this server's plan presented in the last round each participant contributed to (it
        anchored that plan or a later one); after a restart, the ``round_plan`` entry of the round
        before (an earlier entry); the whole log for a participant that never contributed."""
        head = getattr(self.audit, "head", None)
        if head is None or not isinstance(getattr(head, "seq", None), int):
            return {}
        options: dict[str, int | str] = {"audit.seq": int(head.seq), "audit.head": str(head.hash)}
        plan_seq, segment = getattr(self.audit, "plan_entry_seq", None), getattr(self.audit, "segment", None)
        if not (callable(plan_seq) and callable(segment)):
            return options
        last: dict[str, int] = {}
        for result in self.history:
            last.update(dict.fromkeys(result.contributors, result.round))
        start = int(head.seq)
        for p in participants:
            r = last.get(p)
            before = None if r is None else self._plan_heads.get(r, plan_seq(r - 1) if r > 0 else None)
            start = min(start, before if isinstance(before, int) else -1)
        options.update({"audit.proof_from": start, "audit.proof": segment(start).decode("ascii")})
        return options

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
    def _open(data: bytes, *, channel: str | None, max_bytes: int) -> Envelope:
        """The envelope, if it is one and names the channel's hospital; else Unattributed."""
        if len(data) > max_bytes:
            raise Unattributed("oversized", f"Message of {len(data)} bytes exceeds the limit of {max_bytes}.")
        try:
            env = parse_envelope(data, max_bytes=max_bytes)
        except ProtocolError as exc:
            raise Unattributed("malformed_envelope", str(exc)) from None
        if channel is not None and env.sender != channel:
            raise Unattributed("channel_mismatch", f"Envelope names {env.sender!r} but arrived on {channel!r}'s "
                               "channel.")
        return env

    def _check_authentic(self, env: Envelope) -> None:
        """Unattributed unless ``env`` is signed by its sender for this federation and round."""
        key = self.enrolled.get(env.sender)
        if key is None:
            raise Unattributed("unknown_sender", f"{env.sender!r} is not enrolled.")
        try:
            verify_envelope(env, sender=key)
        except IntegrityError:
            raise Unattributed("bad_signature", f"Envelope naming {env.sender!r} is not signed by it.") from None
        try:
            head = _Header.model_validate_json(env.payload)
        except ValidationError:
            return  # signed garbage: the sender's own doing
        plan = self.current.plan
        if head.federation_id != plan.federation_id:
            raise Unattributed("other_federation", f"Message from {env.sender!r} is for another federation.")
        if head.round != plan.round:
            raise Unattributed("stale_round", f"Message from {env.sender!r} is for round {head.round} (a replay).")

    def _check_dp(self, sender: str, report: ClientReport) -> LedgerTrack | None:
        """ProtocolError if the report breaks the DP policy or its ledger is inconsistent with
        the hospital's earlier ones (:mod:`clinograph.secure.dp_checks`); else the ledger track
        to keep once the report is accepted."""
        policy = self.dp_policy
        if policy is None or not policy.required:
            return None
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
        published = Published(scale=_ring_scale(self.current.plan), dim=sum(m.size for m in self.spec.shared))
        problems.extend(share_problems(entry, policy=policy, published=published))
        ledger_problems, track = check_ledger(entry, previous=self._ledgers.get(sender), policy=policy,
                                              published=published)
        problems.extend(p for p in ledger_problems if p not in problems)
        if problems:
            raise ProtocolError(f"Hospital {sender!r}: its update breaks the DP policy: " + "; ".join(problems) + ".")
        return track

    def _check_aggregate_noise(self, rnd: OpenRound, sums: ModuleSums) -> None:
        """Distributed DP: the one-sided test of :mod:`clinograph.secure.dp.noise_check` on the
        aggregate (audited as ``noise_check``); a failure voids the round (AggregateVoided). Only
        the server's numbers enter it: the modules in the sum (spec sizes), the hospitals whose
        inputs are in it (every module must be counted by all of them), and μ/h of the policy at
        the plan's published scale."""
        policy = self.dp_policy
        if policy is None or policy.distributed is None or not sums.sums:
            return
        scale = _ring_scale(rnd.plan)
        if scale is None:
            return  # no share was accepted without a published scale (share_problems)
        from .dp.noise_check import check_noise, coverage_problem

        k = len(sums.contributors)
        problem = coverage_problem(sums.counts, contributors=k)
        if problem is not None:
            raise AggregateVoided(inputs=sums.contributors, message=f"Round {rnd.plan.round} voided: {problem}; "
                                  "nothing of this round is released.")
        share = distributed_policy(policy).share_variance(scale)
        found = check_noise(((np.rint(np.asarray(v, dtype=np.float64) * scale), k) for v in sums.sums.values()),
                            share_variance=share)
        self.audit.record("noise_check", found.payload(rnd.plan.round))
        if not found.passed:
            raise AggregateVoided(inputs=sums.contributors, message=
                f"Round {rnd.plan.round} voided: the aggregate carries {found.energy_ratio:.3g}x the noise energy "
                f"its {found.contributors} contributors' shares must give over {found.dim} coordinates (a sound "
                f"test refuses below {found.threshold_ratio:.3g}x; false alarm <= 2^-40). At least one noise share is "
                "smaller than declared; nothing of this round is released.")

    def _refuse_report(self, sender: str, exc: Exception) -> None:
        self.current.refused.add(sender)
        self._reject(sender, exc)

    def _reject(self, sender: str, exc: Exception) -> None:
        self._record_rejection(self.current, sender, f"{type(exc).__name__}: {exc}")

    def _record_rejection(self, rnd: OpenRound, sender: str, reason: str) -> None:
        """Keep the first reason per sender; audit at most MAX_REJECTIONS_PER_SENDER a round."""
        reason = reason if len(reason) <= MAX_REASON_CHARS else reason[:MAX_REASON_CHARS - 1] + "…"
        rnd.rejected.setdefault(sender, reason)
        if rnd.audited[sender] >= MAX_REJECTIONS_PER_SENDER:
            rnd.suppressed[sender] += 1
            return
        rnd.audited[sender] += 1
        self.audit.record("update_rejected", {"round": rnd.plan.round, "client": sender, "reason": reason})


def _ring_scale(plan: RoundPlan) -> float | None:
    """The fixed-point scale of the masked ring this round's signed plan publishes (None: none), at
    which distributed-DP shares are declared and the aggregate's noise is tested."""
    scale = plan.options.get("masked.scale")
    return float(scale) if isinstance(scale, (int, float)) and not isinstance(scale, bool) else None


def _validation_aggregate(sums: ModuleSums) -> ValidationAggregate | None:
    """``metric/validation``'s Σ w and contributor count in ``sums`` (None: not summed this round)."""
    weight = float(sums.weights.get(VALIDATION_MODULE, 0.0))
    count = int(sums.counts.get(VALIDATION_MODULE, 0))
    return ValidationAggregate(weight=weight, contributors=count) if weight > 0 and count > 0 else None
