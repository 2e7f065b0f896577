"""The payload schema of every audit entry kind the server writes (docs/audit.md lists them).

:meth:`AuditTrail.record` validates a payload against its kind's model here before writing it,
and :func:`verify_audit_dir` validates it again, so what the report reads is what was meant.
A kind not listed here may still be recorded (schema-free); the kinds written by the trail
itself (``audit_open``, ``audit_reopen``, ``artefact``, ``envelope``) cannot be recorded by hand.

Models are strict and forbid extra keys: add a field here before emitting it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from clinograph.core.fields import RoundNumber

Hex64 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Name = Annotated[str, Field(min_length=1, max_length=200)]
Key32 = Annotated[str, Field(pattern=r"^[A-Za-z0-9+/]{43}=$")]  # 32 bytes, standard base64


class Payload(BaseModel):
    """Base: frozen, strict, no extra keys."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class ServerInfo(Payload):
    """The server's name and Ed25519 public key (base64)."""

    name: Name
    public_key: Key32


class DistributedDPInfo(Payload):
    """Distributed DP: the federation's mechanism (:class:`clinograph.secure.messages.DistributedDP`)."""

    mechanism: str = Field(max_length=32)
    noise_multiplier: float = Field(gt=0)
    sample_rate: float = Field(gt=0, le=1)
    min_honest: int = Field(ge=1)
    rounds: int = Field(ge=1)


class DPPolicyInfo(Payload):
    """The federation's DP policy as in :class:`clinograph.secure.messages.DPPolicy`."""

    required: bool
    max_epsilon: float = Field(gt=0)
    delta: float = Field(gt=0, lt=1)
    min_noise_multiplier: float = Field(ge=0)
    max_clip_norm: float = Field(gt=0)
    distributed: DistributedDPInfo | None = None
    insecure_unchecked_prv: bool = False


class Manifest(Payload):
    """``manifest``: who is enrolled with which key, under which rules. First thing a server
    records; again whenever enrolment or policy changes (the latest one before an entry
    applies to it). ``hospitals`` maps names to base64 Ed25519 keys: the verifier checks the
    hospitals' stored envelopes with them. ``insecure_options`` lists every ``insecure_*``
    option (or insecure mode) in use; the report shows them in red."""

    federation_id: Name
    server: ServerInfo
    hospitals: dict[str, Key32]
    dictionary_hash: Hex64
    secure_mode: Name
    strategy: Name
    dp_policy: DPPolicyInfo | None
    spec_digest: Hex64
    insecure_options: list[str]
    environment: Literal["development", "production"]


class RoundPlanEntry(Payload):
    """``round_plan``: the plan of one round (the signed plan itself is published as an artefact)."""

    round: RoundNumber
    participants: list[str]
    plan_sha256: Hex64
    secure_mode: Name
    strategy: Name
    weights: dict[str, float]
    spec_version: int = Field(ge=0)


class UpdateAccepted(Payload):
    """``update_accepted``: a hospital's update (report) was let in; ``report_sha256`` is the
    digest of its stored, signed envelope (``Envelope.digest()``)."""

    round: RoundNumber
    client: Name
    report_sha256: Hex64


class UpdateRejected(Payload):
    """``update_rejected``: a hospital's message was refused; ``reason`` says why (no data)."""

    round: RoundNumber
    client: Name
    reason: str = Field(max_length=4000)


class UnattributedRefusals(Payload):
    """``unattributed_refusals``: one per round, the messages refused *without* an
    ``update_rejected`` entry. ``counts`` is by reason class of messages that did not
    authenticate as their channel's hospital's message for this round and stage (forged,
    malformed, replayed, on another hospital's channel, exact re-sends; see
    ``clinograph.secure.aggregation.checks.UNATTRIBUTED_CLASSES``): nobody is blamed for them.
    ``suppressed`` counts, per authenticated sender, refusals beyond the per-sender cap of
    ``update_rejected`` entries a round (``clinograph.secure.server.MAX_REJECTIONS_PER_SENDER``)."""

    round: RoundNumber
    total: int = Field(ge=0)
    counts: dict[Annotated[str, Field(max_length=32)], Annotated[int, Field(ge=0)]] = Field(max_length=32)
    suppressed: dict[Name, Annotated[int, Field(ge=1)]] = Field(default_factory=dict)


class HospitalSuspended(Payload):
    """``hospital_suspended``: a hospital missed ``missed_rounds`` consecutive rounds and is no longer
    invited, except once every ``retry_every`` rounds (secure/runtime/liveness.py)."""

    round: RoundNumber
    hospital: Name
    missed_rounds: int = Field(ge=1)
    retry_every: int = Field(ge=1)


class HospitalRejoined(Payload):
    """``hospital_rejoined``: a suspended hospital contributed again and is invited to every round."""

    round: RoundNumber
    hospital: Name


class ModelCaughtUp(Payload):
    """``model_caught_up``: the current global model (its state digest, the one the round's plan names)
    went with the plan of ``round`` to ``hospitals``, which had missed rounds (the round loop's catch-up)."""

    round: RoundNumber
    hospitals: list[Name] = Field(min_length=1)
    global_state_digest: Hex64


class NoiseCheck(Payload):
    """``noise_check``: the server's one-sided test that a distributed-DP aggregate carries the
    noise its contributors declared (:mod:`clinograph.secure.dp.noise_check`); a failure voids
    the round (followed by ``round_aborted``)."""

    round: RoundNumber
    passed: bool
    energy_ratio: float = Field(ge=0)
    threshold_ratio: float
    dim: int = Field(ge=1)
    contributors: int = Field(ge=1)
    share_variance: float = Field(gt=0)
    false_alarm_bound: float = Field(gt=0, lt=1)


class RoundAborted(Payload):
    """``round_aborted``: the round could not be aggregated (e.g. fewer survivors than t)."""

    round: RoundNumber
    reason: str = Field(max_length=4000)


class Aggregate(Payload):
    """``aggregate``: who contributed, how many contributors each module had, the new state."""

    round: RoundNumber
    contributors: list[str]
    module_coverage: dict[str, int]
    global_state_digest: Hex64
    modules_updated: int = Field(ge=0)
    #: ckks: SHA-256 of the sealed encrypted aggregate every contributor received (the state digest
    #: is all zeros there: the server holds no plaintext model)
    ciphertext_sha256: Hex64 | None = None
    #: ckks_threshold: the key holders whose decryption shares opened the sum (t-of-N: t of them)
    decrypted_by: list[Name] | None = None


class DistributedShareInfo(Payload):
    """Distributed DP: the noise share a hospital declared for the round, and the ε its own share
    alone would give (the report shows both guarantees)."""

    mechanism: str = Field(max_length=32)
    min_honest: int = Field(ge=1)
    scale: float = Field(gt=0)
    share_variance: float = Field(ge=0)
    dim: int | None = Field(default=None, ge=1)
    epsilon_alone: float = Field(ge=0)


class ReleaseInfo(Payload):
    """One entry of ``ledger.releases``: ``count`` Gaussian releases at noise multiplier σ_s."""

    noise_multiplier: float = Field(gt=0)
    count: int = Field(ge=1)
    purpose: Literal["selection", "setup"]


class Ledger(Payload):
    """``ledger``: one hospital's privacy accounting for one round (cumulative epsilon)."""

    client: Name
    round: RoundNumber
    epsilon: float = Field(ge=0)
    delta: float = Field(gt=0, lt=1)
    budget_epsilon: float = Field(gt=0)
    noise_multiplier: float = Field(ge=0)
    sample_rate: float | None = Field(default=None, gt=0, le=1)
    steps: int | None = Field(default=None, ge=0)
    clip_norm: float | None = Field(default=None, gt=0)
    accountant: str | None = Field(default=None, max_length=32)
    share: DistributedShareInfo | None = None
    #: the round's Gaussian releases outside DP-SGD (model selection), composed into ``epsilon``
    releases: list[ReleaseInfo] = Field(default_factory=list, max_length=64)
    epsilon_training: float | None = Field(default=None, ge=0)
    epsilon_selection: float | None = Field(default=None, ge=0)
    epsilon_setup: float | None = Field(default=None, ge=0)


class Metrics(Payload):
    """``metrics``: the metrics hospitals chose to release, per client, for one round."""

    round: RoundNumber
    per_client: dict[str, dict[str, float]]


class FeatureRelevance(Payload):
    """``feature_relevance``: a site's published feature-mask relevance (only if it opted in)."""

    client: Name
    round: int | None = Field(default=None, ge=0)
    features: dict[str, float]


class DagOutcome(Payload):
    """``dag_outcome``: the DAG vote of one round -- exactly
    ``clinograph.secure.dag_voting.DagOutcome.model_dump(mode="json")``.
    ``adjacency[i][j] = 1`` when the edge concepts[i] -> concepts[j] was adopted; ``tallies``
    holds named matrices over the concepts (``strength``: weighted votes for i -> j, ``none``,
    ``observers``: n x n; ``support``: 1 x n). The report labels edges with ``strength``."""

    kind: Literal["dag_outcome"] | None = None
    round: RoundNumber
    concepts: list[str]
    task: str | None = None
    active: list[bool] | None = None
    adjacency: list[list[int]]
    dropped_cycle_edges: list[Annotated[list[str], Field(min_length=2, max_length=2)]] = Field(default_factory=list)
    added_task_parent: Annotated[list[str], Field(min_length=2, max_length=2)] | None = None
    tallies: dict[str, list[list[float]]]

    @model_validator(mode="after")
    def _square(self) -> DagOutcome:
        n = len(self.concepts)
        if len(self.adjacency) != n or any(len(r) != n for r in self.adjacency):
            raise ValueError(f"adjacency must be {n}x{n} (one row and column per concept)")
        if any(v not in (0, 1) for r in self.adjacency for v in r):
            raise ValueError("adjacency entries must be 0 or 1")
        if self.active is not None and len(self.active) != n:
            raise ValueError(f"active must have {n} entries")
        for name, rows in self.tallies.items():
            if len(rows) not in (1, n) or any(len(r) != n for r in rows):
                raise ValueError(f"tallies[{name!r}] must be {n}x{n} or 1x{n}")
        return self


class RuleRow(Payload):
    """One rule of a ``rules`` entry: its stable string form and body, its probability under the
    new prior and under the mixture of the hospitals' posteriors, and the pooled (fuzzy) support
    of ``body ∧ head``, coverage of ``body`` and confidence = support / coverage."""

    rule: Annotated[str, Field(min_length=1, max_length=500)]
    body: list[Name]
    prior: float = Field(ge=0, le=1)
    posterior: float = Field(ge=0, le=1)
    support: float = Field(ge=0, le=1)
    coverage: float = Field(ge=0, le=1)
    confidence: float | None = Field(default=None, ge=0, le=1.000001)


class RuleHead(Payload):
    """The top rules of one head."""

    head: Name
    rules: list[RuleRow]


class Rules(Payload):
    """``rules``: FedNSL's learned rule prior after one round (strategy ``fednsl_rules``), top
    rules per head. Only aggregates: the mixture of the posteriors and the pooled support are
    sums over the contributing hospitals (masked mode), never one hospital's."""

    round: RoundNumber
    generator: Name
    rule_space_sha256: Hex64
    n_bodies: int = Field(ge=1)
    contributors: int = Field(ge=0)
    heads: list[RuleHead]


class ModelSelected(Payload):
    """``model_selected``: the round whose global model the federation kept, chosen by the
    federated validation loss (sum over hospitals of loss x validation count, summed by the
    secure mode; no hospital's own figure appears here), and why the run stopped."""

    round: RoundNumber
    validation_loss: float
    rounds_evaluated: int = Field(ge=1)
    patience: int = Field(ge=0)
    stopped_early: bool
    losses: list[float]
    #: under distributed DP: each loss's noise std, which the noise-aware rule compared them by
    #: (secure/runtime/selection.py, ``selection_step``; absent without DP, where it is 0)
    noises: list[Annotated[float, Field(ge=0)]] | None = None
    #: hospitals whose signed status disagreed with the majority (name -> the round it reported
    #: or kept; -1: kept none) -- the majority's value was used (secure/runtime/selection.py)
    disagreeing: dict[Name, int] = Field(default_factory=dict, max_length=10_000)


class RunExtended(Payload):
    """``run_extended``: an ended federation goes on (secure/runtime/resume.py): the same id,
    keys, hospitals, global model, ledgers and round numbering, as run ``run`` of its journal,
    linked to the previous run's last audit entry (``previous_audit_seq`` / ``_hash``)."""

    previous_audit_seq: int | None = Field(ge=0)
    previous_audit_hash: Hex64 | None
    run: int = Field(ge=2)
    rounds_completed: int = Field(ge=0)
    rounds_planned: int = Field(ge=1)
    next_round: RoundNumber


class CandidateRow(Payload):
    """One candidate of a ``model_chosen`` entry: its name, its public config overrides (JSON),
    the round it kept, the rounds it ran and its kept round's federated validation loss."""

    name: Name
    overrides: str = Field(max_length=4000)
    validation_loss: float | None
    round: int | None = Field(ge=0)
    rounds_run: int = Field(ge=0)
    #: the rung after which early elimination dropped it (``candidates_eliminated``); absent: it was not
    eliminated_after_rung: int | None = Field(default=None, ge=0)


class EliminationRow(Payload):
    """One candidate still in at a rung of ``candidates_eliminated``: its name, its lowest federated
    validation loss so far and that model's round, the training rounds it ran, and whether the
    stop rule had already ended its run."""

    name: Name
    validation_loss: float | None
    round: int | None = Field(ge=0)
    rounds_run: int = Field(ge=0)
    stopped_early: bool


class CandidatesEliminated(Payload):
    """``candidates_eliminated``: early elimination after rung ``rung`` of a run of several
    candidates (secure/runtime/elimination.py, successive halving): every candidate still in had
    ``rounds`` training rounds (or the stop rule ended it), the best ``len(kept)`` on the federated
    validation loss go on, ``eliminated`` stop (their rounds stay in their own runs, which end with
    ``run_paused``). ``eta``, ``max_cost``: the schedule's rule; ``schedule``: every rung's
    (rounds, kept); ``cost``: the most training rounds the run's candidates train in all."""

    rung: int = Field(ge=0)
    rounds: int = Field(ge=1)
    candidates: list[EliminationRow] = Field(min_length=1, max_length=32)
    kept: list[Name] = Field(min_length=1, max_length=32)
    eliminated: list[Name] = Field(max_length=32)
    rule: str = Field(max_length=1000)
    min_delta: float = Field(ge=0)
    eta: int = Field(ge=2)
    max_cost: float = Field(ge=1)
    schedule: list[Annotated[list[int], Field(min_length=2, max_length=2)]] = Field(min_length=1, max_length=64)
    cost: int = Field(ge=1)


class RunPaused(Payload):
    """``run_paused``: the last entry of a candidate's run that early elimination paused after
    ``rounds_completed`` training rounds (of ``rounds_planned``) while the other candidates of rung
    ``rung`` train; its server keeps its state, and the run goes on in a later audit run
    (``run_resumed``) or was eliminated (``candidates_eliminated``). No release: not a model."""

    rung: int = Field(ge=0)
    next_round: RoundNumber
    rounds_completed: int = Field(ge=0)
    rounds_planned: int = Field(ge=1)


class RunResumed(Payload):
    """``run_resumed``: a paused candidate's run goes on (after its ``manifest``) in rung ``rung``,
    continuing the audit run ``previous_run_id`` that ended with ``run_paused``: same federation
    id, keys, hospitals, global model and round numbering; its selection goes on too."""

    rung: int = Field(ge=1)
    previous_run_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    next_round: RoundNumber
    rounds_completed: int = Field(ge=0)


class ModelChosen(Payload):
    """``model_chosen``: the model variant the federation kept among its candidates
    (sdk/federation/candidates.py), chosen on the kept rounds' federated validation losses (the
    same public sums as ``model_selected``; each candidate ran as its own run of this trail)."""

    chosen: Name
    candidates: list[CandidateRow] = Field(min_length=1, max_length=32)
    rule: str = Field(max_length=1000)
    min_delta: float = Field(ge=0)


class FeatureCoverage(Payload):
    """``feature_coverage``: how many hospitals observe each feature, from the secure sum of their
    0/1 coverage vectors (sdk/federation/coverage.py; never which hospital), and the features
    every contributing hospital observes -- what ``[model] features = "shared"`` resolved to."""

    hospitals: int = Field(ge=1)
    shared: list[Name] = Field(max_length=100_000)
    hospitals_observing: dict[Name, int]
    rule: str = Field(max_length=1000)


class ModelDerived(Payload):
    """``model_derived``: the model every hospital built from the voted DAG (a voted run,
    secure/runtime/voted.py), before its training run: the vote's last round, the DAG's digest
    (the ``dag_outcome`` of that round), the derived initial model's digest and spec digest, and
    the hospitals that derived exactly this model (all that answered)."""

    round: RoundNumber
    dag_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    initial_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    spec_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    parameters: int = Field(ge=0)
    hospitals: list[Name] = Field(min_length=1, max_length=100_000)


Stage = Annotated[str, Field(pattern=r"^(hello|setup|plan|stage( [0-9]{1,4})?|end)$")]
Reason = Annotated[str, Field(max_length=4000)]


class Drop(Payload):
    """Where a hospital fell out of a round and why (the transport's words, with the wait)."""

    stage: Stage
    reason: Reason


class Refusal(Payload):
    """A hospital's own refusal: at which stage, why, whether it was signed (a
    ``hospital_refusal`` envelope, see :mod:`clinograph.secure.refusals`) and whether it is
    final for the run (e.g. its privacy budget is spent)."""

    stage: Stage
    reason: Reason
    signed: bool
    final: bool = False


class RoundParticipation(Payload):
    """``round_participation``: who did what in one round, by name, written by the round loop
    after the round closed or aborted. ``invited``: the plan's participants; ``answered``: sent
    a report and the mode's first message; ``contributed``: in the aggregate (empty if the
    round aborted; per-module counts are in ``aggregate.module_coverage``); ``dropped``: went
    silent or failed at a stage (a hospital may have contributed and then dropped: in masked
    mode its update stays in the sum); ``refused``: the hospital said no itself;
    ``rejected``: the server refused its message (``update_rejected`` has every entry)."""

    round: RoundNumber
    secure_mode: Name
    outcome: Literal["aggregated", "aborted"]
    invited: list[Name]
    answered: list[Name]
    contributed: list[Name]
    dropped: dict[Name, Drop]
    refused: dict[Name, Refusal]
    rejected: dict[Name, Reason]
    abort_reason: Reason | None = None


class HospitalRefused(Payload):
    """``hospital_refused``: a hospital (or a Flower node that could not be tied to one: the
    hello) refused a message. ``signed``: the hospital signed a ``HospitalRefusal`` (stored as
    an ``envelope`` entry, ``refusal_sha256`` is its digest) that the server checked against
    the enrolled key, this round and the message it sent; unsigned reasons are the
    transport's (a Flower error reply). ``final``: the hospital will not take part again in
    this run (its privacy budget is spent)."""

    round: int | None = Field(default=None, ge=0)
    stage: Stage
    client: Name | None = None
    node: int | None = Field(default=None, ge=0)
    reason: Reason
    signed: bool
    final: bool = False
    refusal_sha256: Hex64 | None = None


class AttributionStep(Payload):
    """``attribution_step``: one round of the group testing that names the hospital whose input
    voids rounds (secure/runtime/attribution.py). ``opened_by``: the voided round that opened the
    search (its own step has ``test`` 0); ``hospitals``: the round's inputs (voided: whose inputs
    were in the refused sum -- not contributors, nothing of the round was applied) or its
    contributors (aggregated); ``suspects``: the intersection of the search's voided input sets
    after this round (the proof); ``candidates`` and ``vouched``: what steers the next test;
    ``end``: ``named`` (followed by ``hospital_retired``) or ``inconclusive``."""

    round: RoundNumber
    opened_by: int = Field(ge=0)
    test: int = Field(ge=0)
    outcome: Literal["voided", "aggregated"]
    hospitals: list[Name]
    suspects: list[Name]
    candidates: list[Name]
    vouched: list[Name]
    end: Literal["named", "inconclusive"] | None
    method: Literal["group_testing"]


class HospitalRetired(Payload):
    """``hospital_retired``: a hospital named as the one whose input voided the ``evidence``
    rounds (it is the only hospital whose input was in every one) is out of the run."""

    round: RoundNumber
    client: Name
    reason: Reason
    evidence: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)
    method: Literal["group_testing"]


class RunEnded(Payload):
    """``run_ended``: the last entry of a run, with why it ended. ``completed``: every planned
    round ran; ``too_few_hospitals``: fewer than ``min_clients`` hospitals could take part
    (e.g. budgets spent), a planned end; ``failed``: a round aborted or an error stopped it."""

    status: Literal["completed", "too_few_hospitals", "failed"]
    reason: Reason
    rounds_completed: int = Field(ge=0)
    rounds_planned: int = Field(ge=0)


class Release(Payload):
    """``release``: the model this run released, at its end. ``model_sha256`` is the SHA-256
    of the published ``global_model`` artefact (None in modes where the server holds no
    plaintext model: the hospitals hold the decrypted aggregate). There ``global_state_digest`` is
    all zeros and ``ciphertext_sha256`` -- the SHA-256 of the sealed encrypted aggregate of the
    released round, the same bytes every contributor received -- identifies the release."""

    round: RoundNumber
    secure_mode: Name
    global_state_digest: Hex64
    model_sha256: Hex64 | None
    ciphertext_sha256: Hex64 | None = None


class CkksKeyHolders(Payload):
    """``ckks_key_holders``: the hospitals that hold the federation's CKKS secret key after the
    key ceremony of this run (secure/ckks/setup.py), under which preset and context. The server
    is never one: it holds only the public parameters."""

    holders: list[Name] = Field(min_length=1, max_length=10_000)
    preset: Name
    context_digest: Hex64


class ResolvedDefault(Payload):
    """``resolved_default``: a model setting the hospital config left unwritten, resolved by a rule
    of the SDK (:class:`clinograph.secure.runtime.build.ResolvedDefault`; e.g. ``model.deep`` =
    ``false``, rule ``dp_default_model``), and the line the operator sees; after the manifest."""

    setting: str = Field(pattern=r"^[a-z_]{1,32}\.[a-z_]{1,32}$")
    value: str = Field(min_length=1, max_length=64)
    rule: str = Field(pattern=r"^[a-z_]{1,64}$")
    line: str = Field(min_length=1, max_length=300)


class InsecureOption(Payload):
    """``insecure_option``: an ``insecure_*`` option in use, and why (policy.require_allowed)."""

    option: str = Field(pattern=r"^insecure_[a-z0-9_]+$")
    why: str = Field(max_length=1000)


class AuditOpen(Payload):
    """``audit_open`` (entry 0) / ``audit_reopen``: written by the trail itself."""

    format: Literal["clinograph-audit/1", "clinograph-audit/2"]
    server: ServerInfo
    recovered_entries: int | None = Field(default=None, ge=1)
    #: format 2: the run this opening starts (every entry of the run carries it as ``run``).
    run_id: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")
    #: the server's software (package -> version), so an auditor recomputing a public step (a
    #: seeded M-step, a DAG vote's tie-break) uses the same libraries.
    software: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")],
                   Annotated[str, Field(max_length=64)]] | None = Field(default=None, max_length=32)


class Artefact(Payload):
    """``artefact``: written by :meth:`AuditTrail.publish` with the file ``artefacts/<sha256>``."""

    name: Name
    kind: Name
    sha256: Hex64
    size: int = Field(ge=0)
    meta: dict[str, Any]


class EnvelopeRef(Payload):
    """``envelope``: written by :meth:`AuditTrail.store_envelope`. ``digest`` is the SHA-256 of
    the envelope's payload (what other entries reference); ``sha256`` names the stored file;
    ``signature`` is the sender-signature check at store time, re-done by the verifier."""

    sender: Name
    kind: Name
    digest: Hex64
    sha256: Hex64
    size: int = Field(ge=0)
    signature: Literal["valid", "invalid", "unknown_sender"]


KINDS: dict[str, type[Payload]] = {
    "manifest": Manifest, "round_plan": RoundPlanEntry, "update_accepted": UpdateAccepted,
    "update_rejected": UpdateRejected, "unattributed_refusals": UnattributedRefusals,
    "round_aborted": RoundAborted, "aggregate": Aggregate, "noise_check": NoiseCheck,
    "ledger": Ledger, "metrics": Metrics, "feature_relevance": FeatureRelevance,
    "dag_outcome": DagOutcome, "insecure_option": InsecureOption, "resolved_default": ResolvedDefault, "rules": Rules,
    "model_selected": ModelSelected, "model_chosen": ModelChosen, "run_extended": RunExtended, "feature_coverage": FeatureCoverage,
    "model_derived": ModelDerived,
    "candidates_eliminated": CandidatesEliminated, "run_paused": RunPaused, "run_resumed": RunResumed,
    "round_participation": RoundParticipation, "hospital_refused": HospitalRefused,
    "run_ended": RunEnded, "release": Release, "ckks_key_holders": CkksKeyHolders,
    "hospital_suspended": HospitalSuspended, "hospital_rejoined": HospitalRejoined, "model_caught_up": ModelCaughtUp,
    "attribution_step": AttributionStep, "hospital_retired": HospitalRetired,
    "audit_open": AuditOpen, "audit_reopen": AuditOpen, "artefact": Artefact, "envelope": EnvelopeRef,
}
RESERVED = frozenset({"audit_open", "audit_reopen", "artefact", "envelope"})


def check_payload(kind: str, payload: dict[str, Any]) -> str | None:
    """None if ``payload`` fits ``kind``'s schema (or the kind has none), else the problem."""
    model = KINDS.get(kind)
    if model is None:
        return None
    try:
        model.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(payload)"
        return (f"payload does not fit the {kind!r} schema ({exc.error_count()} error(s), first: "
                f"{loc}: {first['msg']}); see clinograph.secure.audit.kinds.{model.__name__}")
    return None
