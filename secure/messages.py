"""Wire messages of one round (architecture.md, "One round, as data flows").

Frozen, strict pydantic models, one per protocol stage, discriminated by ``kind`` and parsed
only at the boundary (:mod:`clinograph.secure.wire`). Arrays travel as little-endian bytes
(:mod:`clinograph.core.codec`). The secure modes add their own stage messages beside these
(``masking/messages.py``, ``ckks/messages.py``) on the same base class.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import weakref
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializationInfo,
    ValidationInfo,
    WrapSerializer,
    model_serializer,
    model_validator,
)

from clinograph.core.fields import RoundNumber
from clinograph.core.identity import NAME_PATTERN
from clinograph.core.spec import MODULE_NAME_PATTERN, ModelSpec

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
#: Largest client report envelope the server parses (metrics, ledger, feature relevance).
MAX_REPORT_BYTES = 2 * 1024 * 1024
#: Feature relevance, as audited, stays well inside the audit's 1 MiB payload limit.
MAX_RELEVANCE_CHARS = 512 * 1024
ID_PATTERN = NAME_PATTERN  # names and ids: one pattern (clinograph.core.identity)

#: A finite float: NaN and infinity are refused at the boundary (JSON ``NaN``/``Infinity`` too).
Finite = Annotated[float, Field(allow_inf_nan=False)]
MetricName = Annotated[str, Field(min_length=1, max_length=64)]
FeatureName = Annotated[str, Field(min_length=1, max_length=128)]


#: Key of the serialisation / validation context through which :mod:`clinograph.secure.wire`
#: moves :data:`Blob` fields into and out of envelope attachments.
ATTACHMENTS = "attachments"


def _blob_out(value: bytes, handler: Any, info: SerializationInfo) -> Any:
    blobs = (info.context or {}).get(ATTACHMENTS) if info.mode_is_json() else None
    if blobs is None:
        return handler(value)
    blobs.append(value)
    return {"attachment": len(blobs) - 1}


def _blob_in(value: Any, info: ValidationInfo) -> Any:
    if info.mode != "json":
        return value
    if isinstance(value, str):  # no attachments (e.g. a message stored as plain JSON): base64
        try:
            return base64.urlsafe_b64decode(value.replace("+", "-").replace("/", "_").encode("ascii"))
        except (binascii.Error, UnicodeEncodeError, ValueError):
            raise ValueError("not valid base64") from None
    if not isinstance(value, dict):
        return value  # the strict bytes check refuses it
    blobs = (info.context or {}).get(ATTACHMENTS)
    index = value.get("attachment")
    if blobs is None or set(value) != {"attachment"} or not isinstance(index, int) or isinstance(index, bool) \
            or not 0 <= index < len(blobs):
        raise ValueError("not a reference to one of the envelope's attachments")
    used: set[int] = info.context.setdefault("used", set())  # type: ignore[union-attr]
    if index in used:
        raise ValueError(f"attachment {index} is referenced twice")
    used.add(index)
    return blobs[index]


#: The serialiser and validator that make ``bytes`` a :data:`Blob`; put size constraints before
#: them (``Annotated[bytes, Field(max_length=...), *BLOB_CODEC]``) so they check the bytes.
BLOB_CODEC = (WrapSerializer(_blob_out), BeforeValidator(_blob_in))

#: Bytes that travel as a raw envelope attachment instead of base64 inside the JSON payload
#: (:mod:`clinograph.secure.wire`); outside an envelope they serialise as base64 like ``bytes``.
Blob = Annotated[bytes, *BLOB_CODEC]


def omit_none(data: Any, *keys: str) -> Any:
    """A message's serialised fields without ``keys`` whose value is None: a field added to a message
    leaves it byte for byte what it was while the field is unset (for a wrap ``model_serializer``)."""
    if isinstance(data, dict):
        for key in keys:
            if key in data and data[key] is None:
                del data[key]
    return data


class WireMessage(BaseModel):
    """Base of every message: frozen, strict, no extra keys, bytes as base64 in JSON."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", strict=True, ser_json_bytes="base64", val_json_bytes="base64"
    )


class DistributedDP(WireMessage):
    """The federation's distributed-DP mechanism (docs/privacy.md): public, in every plan, and
    what every hospital's declared share must equal."""

    mechanism: Literal["skellam"]
    noise_multiplier: float = Field(gt=0, le=1000, allow_inf_nan=False)
    sample_rate: float = Field(gt=0, le=1, allow_inf_nan=False)
    min_honest: int = Field(ge=1, le=10_000)
    rounds: int = Field(ge=1, le=100_000)


class DistributedShare(WireMessage):
    """A hospital's declaration of the noise share it added in one round (inside its ledger entry)."""

    mechanism: str = Field(max_length=32)
    min_honest: int = Field(ge=1, le=10_000)
    scale: float = Field(gt=0, allow_inf_nan=False)
    share_variance: float = Field(ge=0, allow_inf_nan=False)
    dim: int = Field(ge=1, le=10**9, description="coordinates the share noised (the released ones)")
    epsilon_alone: float = Field(ge=0, allow_inf_nan=True, description="ε this hospital's own share gives alone")


class DPPolicy(WireMessage):
    """The federation's differential-privacy policy, part of every plan.

    ``required`` means every update must carry a ledger entry within these bounds.
    """

    required: bool
    max_epsilon: float = Field(gt=0)
    delta: float = Field(gt=0, lt=1)
    min_noise_multiplier: float = Field(ge=0)
    max_clip_norm: float = Field(gt=0)
    distributed: DistributedDP | None = None
    #: accept local-DP ledgers kept with the PRV accountant, whose ε the server cannot check
    #: (no RDP floor applies to it); off by default ([dp_policy] insecure_unchecked_prv)
    insecure_unchecked_prv: bool = False


class RoundPlan(WireMessage):
    """Server -> hospitals: what round ``round`` is, signed by the server."""

    kind: Literal["round_plan"] = "round_plan"
    federation_id: str = Field(pattern=ID_PATTERN)
    round: RoundNumber
    participants: tuple[str, ...] = Field(min_length=1, max_length=10_000)
    spec: ModelSpec
    dictionary_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    secure_mode: str = Field(max_length=64)
    strategy: str = Field(max_length=64)
    min_clients: int = Field(ge=1)
    local_epochs: int = Field(ge=1, le=1000)
    dp_policy: DPPolicy | None = None
    global_state_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    options: dict[str, Finite | int | str | bool] = Field(default_factory=dict, max_length=1024)  # the run's options and one weight per hospital
    _digest: tuple[weakref.ref, str] | None = PrivateAttr(default=None)  # (the plan that computed it, digest)

    def digest(self) -> str:
        """SHA-256 (hex) of the plan's canonical JSON (sorted keys, a domain tag), memoised. Every
        masked and ``ckks_threshold`` client message of the round names it (``plan_digest``) and each
        hospital checks its peers' against its own: one plan is sealed for every participant of a
        round, so hospitals sent different plans -- another participant list, ``min_clients``,
        weight, option or model -- cannot complete the round together. The memo names the object that
        computed it: ``model_copy`` copies private attributes, and a copy with other fields must not
        inherit its original's digest -- by a weak reference, not its id: CPython gives a freed object's id
        to the next object of its size, and a copy (``copy``, ``deepcopy``, a copy of a copy) made after
        its original was freed took the original's memo (tests/secure/masking/test_masking_model_binding.py)."""
        private = self.__pydantic_private__  # the dict itself: ``self._digest`` costs ~1.4 µs a read here
        memo = private.get("_digest")
        if memo is None or memo[0]() is not self:
            body = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
            memo = private["_digest"] = (weakref.ref(self),
                                         hashlib.sha256(b"clinograph/round-plan/1\x00" + body.encode()).hexdigest())
        return memo[1]

    def __getstate__(self) -> dict[Any, Any]:
        """pydantic's pickled state without the memo (a weak reference does not pickle; the copy
        computes its own): plans travel to worker processes."""
        state = super().__getstate__()
        private = state.get("__pydantic_private__")
        if private and private.get("_digest") is not None:
            state = {**state, "__pydantic_private__": {**private, "_digest": None}}
        return state



class ModuleTensor(WireMessage):
    """One module's values (a delta, an aggregate, or global parameters)."""

    name: str = Field(pattern=MODULE_NAME_PATTERN, max_length=200)
    dtype: Literal["<f4", "<f8"] = "<f4"
    data: Blob


class Release(BaseModel):
    """One Gaussian release outside DP-SGD in a round (issue 30): ``count`` releases of a bounded
    statistic with noise multiplier σ_s (RDP α/(2σ_s²) each, the subsampled Gaussian at q = 1),
    for ``purpose`` (model selection; a set-up sum)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    noise_multiplier: float = Field(gt=0, allow_inf_nan=False)
    count: int = Field(ge=1, lt=2**31)
    purpose: Literal["selection", "setup"]


class LedgerEntry(WireMessage):
    """A hospital's privacy accounting for one round, signed with its update. ``share``: in
    distributed-DP mode, the noise share it added (checked against the plan's mechanism).
    ``releases``: the Gaussian releases of the round outside DP-SGD (model selection), composed
    into ``epsilon``; ``epsilon_training`` / ``epsilon_selection`` / ``epsilon_setup``: ε of DP-SGD alone,
    of the selection releases alone and of the set-up releases alone (None: not reported),
    ``epsilon`` being everything composed."""

    round: RoundNumber
    noise_multiplier: float = Field(ge=0, allow_inf_nan=False)
    sample_rate: float = Field(gt=0, le=1, allow_inf_nan=False)
    steps: int = Field(ge=0, lt=2**40)
    clip_norm: float = Field(gt=0, allow_inf_nan=False)
    accountant: str = Field(max_length=32)
    epsilon: float = Field(ge=0, allow_inf_nan=False)
    delta: float = Field(gt=0, lt=1, allow_inf_nan=False)
    budget_epsilon: float = Field(gt=0, allow_inf_nan=False)
    share: DistributedShare | None = None
    releases: list[Release] = Field(default_factory=list, max_length=64)
    epsilon_training: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    epsilon_selection: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    epsilon_setup: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class ClientUpdate(WireMessage):
    """Hospital -> server, plaintext mode: deltas of the shared modules it trained.

    ``weight`` is the aggregation weight (its sample count unless the plan says otherwise);
    ``modules`` lists exactly the modules it trained -- the server averages each module over
    its contributors only (F-CMs 4.2.3).
    """

    kind: Literal["client_update"] = "client_update"
    federation_id: str = Field(pattern=ID_PATTERN)
    round: RoundNumber
    client: str = Field(pattern=ID_PATTERN)
    spec_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    dictionary_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    weight: float = Field(gt=0, allow_inf_nan=False)
    modules: tuple[ModuleTensor, ...] = Field(max_length=100_000)
    metrics: dict[MetricName, Finite] = Field(default_factory=dict, max_length=32)
    ledger: LedgerEntry | None = None


#: the shared module the federated validation loss rides in (clinograph.sdk.model.nsfl_modules)
VALIDATION_MODULE = "metric/validation"


class ValidationAggregate(WireMessage):
    """Under distributed DP, with the global model of a round that summed ``metric/validation``:
    that module's Σ w and contributor count in the round's aggregate. A hospital needs both to
    read the released sums (Σ n_val) back from the module's move and the number of noise shares
    in them, i.e. the noise on the released validation loss
    (:func:`clinograph.secure.runtime.selection.released_loss_noise`)."""

    weight: float = Field(gt=0, allow_inf_nan=False)
    contributors: int = Field(ge=1, le=1_000_000)


class GlobalModel(WireMessage):
    """Server -> hospitals: the global shared modules after a round."""

    kind: Literal["global_model"] = "global_model"
    federation_id: str = Field(pattern=ID_PATTERN)
    round: RoundNumber
    spec: ModelSpec
    modules: tuple[ModuleTensor, ...]
    #: distributed DP with selection only (None otherwise: the message is then byte for byte as before)
    validation: ValidationAggregate | None = None

    @model_serializer(mode="wrap")
    def _without_unset_validation(self, handler):  # noqa: ANN001, ANN202 - pydantic's serializer protocol
        return omit_none(handler(self), "validation")


class RoundResult(WireMessage):
    """What a round produced: who contributed, which modules they covered."""

    kind: Literal["round_result"] = "round_result"
    federation_id: str = Field(pattern=ID_PATTERN)
    round: RoundNumber
    contributors: tuple[str, ...]
    rejected: dict[str, str] = Field(default_factory=dict)
    module_coverage: dict[str, int] = Field(default_factory=dict)
    global_state_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    #: ckks: SHA-256 of the sealed encrypted aggregate every contributor received (the server holds
    #: no plaintext model, so this, not ``global_state_digest``, identifies what the round released)
    ciphertext_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")


class ClientReport(WireMessage):
    """Hospital -> server, beside every mode's first message: the privacy ledger entry and the
    metrics the hospital chose to release. Signed; the server checks it against the DP policy
    before it lets the hospital's update into the aggregate.

    Bounded at the boundary so that whatever parses can be audited: finite floats only, at
    most 32 metrics with names of <= 64 characters, feature names of <= 128 characters and
    at most :data:`MAX_RELEVANCE_CHARS` of feature relevance (the envelope itself is bounded
    by :data:`MAX_REPORT_BYTES`)."""

    kind: Literal["client_report"] = "client_report"
    federation_id: str = Field(pattern=ID_PATTERN)
    round: RoundNumber
    client: str = Field(pattern=ID_PATTERN)
    dictionary_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    ledger: LedgerEntry | None = None
    metrics: dict[MetricName, Finite] = Field(default_factory=dict, max_length=32)
    feature_relevance: dict[FeatureName, Finite] | None = Field(default=None, max_length=10_000)

    @model_validator(mode="after")
    def _bounded_relevance(self) -> ClientReport:
        chars = sum(len(k) + 32 for k in self.feature_relevance or {})
        if chars > MAX_RELEVANCE_CHARS:
            raise ValueError(f"feature_relevance takes {chars} characters; at most {MAX_RELEVANCE_CHARS}")
        return self
