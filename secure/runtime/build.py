"""The one place that builds a federation server. Torch-free: the server is a lean install.

Decided here, once, for every transport and every caller (simulation, demo, Flower ServerApp):

- **weights**: a hospital weighs its update by its training-patient count, capped at
  ``federation.max_weight`` (default 10 000, see :data:`.config.DEFAULT_MAX_WEIGHT`); a
  strategy that fixes normalised weights (DQ) uses the bound 1. The bound travels in every
  plan as ``weight.max`` and the hospital applies the cap itself.
- **masked parameters**: neighbours and threshold from :func:`clinograph.secure.masking.params.masked_defaults`
  for the round's participant count (or ``masked_threshold`` when set), clip =
  ``max_weight * masked_clip``; recomputed every round, so a round with fewer participants
  gets parameters that fit it.
- **min_clients**: the configured value, capped at the number of enrolled hospitals.
- **DP policy**: ``[dp_policy]`` when present (every report must carry a ledger within it).
- **CKKS**: the public context from the key ceremony, checked against the dealer's key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import numpy as np
from pydantic import Field

from ..aggregation import create_mode
from ..aggregation.checks import encode_modules
from ..codec import decode_array
from ..errors import ConfigError, ProtocolError
from ..identity import Identity, PublicIdentity
from ..messages import DPPolicy, ModuleTensor, WireMessage
from ..server import AuditSink, FederationServer
from ..spec import ModelSpec, ModuleKind
from ..strategies import Strategy, create_strategy
from .config import FederationSection

MAX_INITIAL_MODEL_BYTES = 512 * 1024 * 1024


class InitialModel(WireMessage):
    """The model a federation starts from: its spec and the shared modules' values.

    Written once with the hospital install (``clinograph model init``, or in process by
    :func:`clinograph.sdk.runtime.build.initial_model`), read by the server, which needs no
    torch to hold it. Its digest is the manifest's ``spec_digest`` plus the first plan's state
    digest, both in the audit trail.
    """

    kind: Literal["initial_model"] = "initial_model"
    task: str = Field(max_length=64)
    dictionary_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    spec: ModelSpec
    modules: tuple[ModuleTensor, ...] = Field(max_length=100_000)

    @classmethod
    def create(cls, *, task: str, dictionary_hash: str, spec: ModelSpec,
               state: Mapping[str, np.ndarray]) -> InitialModel:
        """Package ``state`` (every shared module of ``spec``) for the server."""
        shared = set(spec.names(ModuleKind.SHARED))
        if set(state) != shared:
            raise ConfigError(f"Initial state must hold exactly the shared modules of the spec; missing "
                              f"{sorted(shared - set(state))[:5]}, extra {sorted(set(state) - shared)[:5]}.")
        return cls(task=task, dictionary_hash=dictionary_hash, spec=spec, modules=encode_modules(state, "<f8"))

    def state(self) -> dict[str, np.ndarray]:
        """The shared modules' values, checked against the spec."""
        out: dict[str, np.ndarray] = {}
        for t in self.modules:
            try:
                size = self.spec.module(t.name).size
            except KeyError:
                raise ProtocolError(f"Initial model holds module {t.name!r}, which its spec does not declare.") from None
            out[t.name] = decode_array(t.data, dtype=t.dtype, length=size, what=f"initial module {t.name!r}")
        return out

    def to_bytes(self) -> bytes:
        """JSON bytes (what ``clinograph model init`` writes)."""
        return self.model_dump_json().encode()


def initial_model_from_bytes(data: bytes) -> InitialModel:
    """Parse an initial model file; a ConfigError says what is wrong with it."""
    from pydantic import ValidationError

    if len(data) > MAX_INITIAL_MODEL_BYTES:
        raise ConfigError(f"Initial model file of {len(data)} bytes exceeds {MAX_INITIAL_MODEL_BYTES} bytes.")
    try:
        return InitialModel.model_validate_json(data)
    except ValidationError as exc:
        raise ConfigError(f"Not a Clinograph initial model file ({exc.error_count()} problem(s); first: "
                          f"{exc.errors()[0]['msg']}). Write one with `clinograph model init`.") from None


def build_strategy(federation: FederationSection) -> Strategy:
    """The configured strategy; ``server_lr`` is FedSGD's own option."""
    options = dict(federation.strategy_options)
    if federation.strategy == "fedsgd":
        options.setdefault("server_lr", federation.server_lr)
    return create_strategy(federation.strategy, **options)


def weight_bound(strategy: Strategy, federation: FederationSection) -> float:
    """The public bound on any hospital's weight (see the module docstring)."""
    return 1.0 if strategy.normalised_weights else float(federation.max_weight)


def masked_options(federation: FederationSection, *, n: int, max_weight: float) -> dict[str, float | int | str | bool]:
    """The masked mode's plan options for ``n`` participants (threshold from the security argument)."""
    from ..masking import params

    if federation.masked_threshold is not None:
        threshold = federation.masked_threshold
    else:
        threshold = params.masked_defaults(n).threshold
    return params.masked_plan_options(n_clients=n, threshold=threshold, clip=max_weight * federation.masked_clip,
                                      max_weight=max_weight, word_bits=federation.masked_word_bits)


def _check_distributed(policy: DPPolicy, *, federation: FederationSection, opts: Mapping[str, float | int | str | bool],
                       n: int, max_weight: float, dim: int) -> None:
    """Refuse a distributed-DP configuration that cannot keep its promise (every reason at once)."""
    from ..dp import DistributedPolicy, check_configuration

    d = policy.distributed
    if federation.masked_word_bits != 32:
        raise ConfigError("Distributed DP needs the 32-bit masked ring: set [federation] masked_word_bits = 32.")
    if federation.strategy != "fedsgd":
        raise ConfigError("Distributed DP is one DP-SGD step a round: it needs strategy = 'fedsgd'.")
    check_configuration(DistributedPolicy(mechanism=d.mechanism, noise_multiplier=d.noise_multiplier,  # type: ignore[union-attr]
                                          clip_norm=policy.max_clip_norm, sample_rate=d.sample_rate,  # type: ignore[union-attr]
                                          min_honest=d.min_honest, rounds=d.rounds,  # type: ignore[union-attr]
                                          max_epsilon=policy.max_epsilon, delta=policy.delta),
                        n_hospitals=n, masked_threshold=int(opts["masked.threshold"]),
                        scale=float(opts["masked.scale"]), hospital_bound=float(opts["masked.clip"]),
                        max_batch=max_weight, dim=dim, planned_rounds=federation.rounds)


def build_server(*, federation: FederationSection, identity: Identity, enrolled: Mapping[str, PublicIdentity],
                 initial: InitialModel, audit: AuditSink, dp_policy: DPPolicy | None,
                 ckks_context: object | None = None) -> FederationServer:
    """The federation server, with every parameter decided here (see the module docstring).

    Raises:
        ConfigError: CKKS without a ceremony context, an insecure mode in production, too few
            hospitals for the mode.
    """
    from ..strategies.attention import check_secure_mode

    check_secure_mode(federation.strategy, federation.secure_mode)  # a plaintext-only rule under a secure mode
    strategy = build_strategy(federation)
    max_weight = weight_bound(strategy, federation)
    mode = create_mode(federation.secure_mode)
    mode_server = None
    static: dict[str, float | int | str | bool] = {"weight.max": max_weight}
    if federation.secure_mode == "ckks":
        from ..ckks import CkksServer, CkksServerContext, ckks_plan_options

        if not isinstance(ckks_context, CkksServerContext):
            raise ConfigError("secure_mode = 'ckks' needs the key ceremony's public context: run "
                              "run_ckks_ceremony(...) over the transport first.")
        mode_server = CkksServer.with_context(ckks_context)
        static.update(ckks_plan_options(ckks_context))
    if federation.secure_mode == "masked":
        opts = masked_options(federation, n=len(enrolled), max_weight=max_weight)  # refuse a bad config now
        if dp_policy is not None and dp_policy.distributed is not None:
            _check_distributed(dp_policy, federation=federation, opts=opts, n=len(enrolled), max_weight=max_weight,
                               dim=sum(m.size for m in initial.spec.shared))
    elif dp_policy is not None and dp_policy.distributed is not None:
        raise ConfigError(f"Distributed DP needs secure_mode = 'masked' (the noise shares add up inside the masked "
                          f"sum); this federation runs {federation.secure_mode!r}.")

    def plan_options(participants: tuple[str, ...]) -> dict[str, float | int | str | bool]:
        if mode.name == "masked":
            return {**static, **masked_options(federation, n=len(participants), max_weight=max_weight)}
        return dict(static)

    return FederationServer(
        federation_id=federation.id, spec=initial.spec, initial_state=initial.state(),
        dictionary_hash=initial.dictionary_hash, identity=identity, enrolled=enrolled,
        secure_mode=federation.secure_mode, strategy=strategy, min_clients=min(federation.min_clients, len(enrolled)),
        local_epochs=federation.local_epochs, dp_policy=dp_policy, audit=audit, environment=federation.environment,
        plan_options=plan_options, mode_server=mode_server)
