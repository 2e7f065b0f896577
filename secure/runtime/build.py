"""The one place that builds a federation server. Torch-free: the server is a lean install.

Decided here, once, for every transport and every caller (simulation, demo, Flower ServerApp):

- **weights**: a hospital weighs its update by its training-patient count, capped at
  ``federation.max_weight`` (default 10 000, see :data:`.config.DEFAULT_MAX_WEIGHT`); a
  strategy that fixes normalised weights (DQ) uses the bound 1. The bound travels in every
  plan as ``weight.max`` and the hospital applies the cap itself.
- **the secure mode's parameters**: the mode's own set-up decides them
  (:meth:`clinograph.secure.aggregation.SecureMode.open_run`: ``secure/masking/setup.py`` --
  neighbours, threshold, clip, recomputed for every round's participants; ``secure/ckks/setup.py``
  -- the key ceremony's public context); nothing here branches on a mode's name.
- **min_clients**: the configured value, capped at the number of enrolled hospitals.
- **DP policy**: ``[dp_policy]`` when present (every report must carry a ledger within it); a
  distributed-DP policy is checked by the mode that carries it, or refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import numpy as np
from pydantic import Field

from clinograph.core.arguments import checked_arguments
from clinograph.core.codec import decode_array
from clinograph.core.errors import ConfigError, ProtocolError
from clinograph.core.identity import Identity, PublicIdentity
from clinograph.core.spec import ModelSpec, ModuleKind

from ..aggregation import ModeRun, create_mode
from ..aggregation.checks import encode_modules
from ..messages import DPPolicy, ModuleTensor, WireMessage
from ..server import AuditSink, FederationServer
from ..strategies import Strategy, create_strategy
from .config import FederationSection

MAX_INITIAL_MODEL_BYTES = 512 * 1024 * 1024
#: the plan option carrying :attr:`InitialModel.settings_sha256` (``clinograph.sdk.model.settings.PLAN_OPTION``)
MODEL_SETTINGS_OPTION = "model.settings"


class ResolvedDefault(WireMessage):
    """A model setting the hospital config left unwritten that a rule of the SDK resolved to a value
    an operator may not expect (the DP default model: ``model.deep`` = ``false`` under
    ``[privacy]``, ``clinograph.sdk.config.dp_default_model``). Written by ``clinograph model
    init`` into the initial model; the server audits it (``resolved_default``, after the manifest
    of every run it builds) and the ServerApp logs ``line``. Informational: the value itself is
    bound by the settings digest every plan carries."""

    kind: Literal["resolved_default"] = "resolved_default"
    setting: str = Field(pattern=r"^[a-z_]{1,32}\.[a-z_]{1,32}$")
    value: str = Field(min_length=1, max_length=64)
    rule: str = Field(pattern=r"^[a-z_]{1,64}$")
    line: str = Field(min_length=1, max_length=300)

    def payload(self) -> dict[str, str]:
        """The ``resolved_default`` audit entry."""
        return self.model_dump(exclude={"kind"})


class InitialModel(WireMessage):
    """The model a federation starts from: its spec and the shared modules' values.

    Written once with the hospital install (``clinograph model init``, or in process by
    :func:`clinograph.sdk.runtime.build.initial_model`), read by the server, which needs no
    torch to hold it. Its digest is the manifest's ``spec_digest`` plus the first plan's state
    digest, both in the audit trail. ``settings_sha256``: the digest of the weight-free model
    settings that decide the forward pass (:mod:`clinograph.sdk.model.settings`; None: the task
    declares none); every plan carries it as option ``model.settings`` and hospitals refuse
    another. ``defaults``: the settings a rule resolved (:class:`ResolvedDefault`), audited.
    """

    kind: Literal["initial_model"] = "initial_model"
    task: str = Field(max_length=64)
    dictionary_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    spec: ModelSpec
    modules: tuple[ModuleTensor, ...] = Field(max_length=100_000)
    settings_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    defaults: tuple[ResolvedDefault, ...] = Field(default=(), max_length=16)

    @classmethod
    def create(cls, *, task: str, dictionary_hash: str, spec: ModelSpec, state: Mapping[str, np.ndarray],
               settings_sha256: str | None = None, defaults: tuple[ResolvedDefault, ...] = ()) -> InitialModel:
        """Package ``state`` (every shared module of ``spec``) for the server."""
        shared = set(spec.names(ModuleKind.SHARED))
        if set(state) != shared:
            raise ConfigError(f"Initial state must hold exactly the shared modules of the spec; missing "
                              f"{sorted(shared - set(state))[:5]}, extra {sorted(set(state) - shared)[:5]}.")
        return cls(task=task, dictionary_hash=dictionary_hash, spec=spec, modules=encode_modules(state, "<f8"),
                   settings_sha256=settings_sha256, defaults=defaults)

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


def check_reads_sum(strategy: Strategy, federation: FederationSection) -> None:
    """ConfigError when ``strategy`` reads the summed update on the server (an M-step, a decision it
    audits) under a secure mode in which the server never sees the sum (ckks)."""
    if strategy.server_reads_sum and not create_mode(federation.secure_mode).server_sees_sum:
        raise ConfigError(f"strategy = {federation.strategy!r} reads the summed update on the server (its M-step or "
                          f"the decision it audits), but under secure_mode = {federation.secure_mode!r} the server "
                          "never sees the sum. Use secure_mode = 'masked'.")


def weight_bound(strategy: Strategy, federation: FederationSection) -> float:
    """The public bound on any hospital's weight (see the module docstring)."""
    return 1.0 if strategy.normalised_weights else float(federation.max_weight)


def masked_options(federation: FederationSection, *, n: int, max_weight: float) -> dict[str, float | int | str | bool]:
    """The masked mode's plan options for ``n`` participants (:func:`clinograph.secure.masking.setup.masked_options`)."""
    from ..masking.setup import masked_options as options

    return options(federation, n=n, max_weight=max_weight)


@checked_arguments
def build_server(*, federation: FederationSection, identity: Identity, enrolled: Mapping[str, PublicIdentity],
                 initial: InitialModel, audit: AuditSink, dp_policy: DPPolicy | None,
                 ckks_context: object | None = None, mode_run: ModeRun | None = None) -> FederationServer:
    """The federation server, with every parameter decided here (see the module docstring).

    ``mode_run``: the secure mode's set-up for this run (:meth:`SecureMode.open_run`, which
    :class:`~.assemble.ServerSide` runs over the transport); without it the mode is set up here
    from ``ckks_context`` (a CKKS ceremony run by the caller) or needs none.

    Raises:
        ConfigError: CKKS without a ceremony context, an insecure mode in production, too few
            hospitals for the mode, distributed DP the mode cannot carry.
    """
    from ..strategies.attention import check_secure_mode

    check_secure_mode(federation.strategy, federation.secure_mode)  # a plaintext-only rule under a secure mode
    strategy = build_strategy(federation)
    max_weight = weight_bound(strategy, federation)
    mode = create_mode(federation.secure_mode)
    check_reads_sum(strategy, federation)
    if mode_run is None:
        mode_run = mode.open_run(federation=federation, transport=None, run_id=federation.id, enrolled=enrolled,
                                 max_weight=max_weight, context=ckks_context)
    if dp_policy is not None and dp_policy.distributed is not None:
        if mode_run.check_distributed is None:
            raise ConfigError(f"Distributed DP needs a secure mode whose sum carries the hospitals' noise shares "
                              f"(masked); this federation runs {federation.secure_mode!r}.")
        mode_run.check_distributed(dp_policy, dim=sum(m.size for m in initial.spec.shared))
    static: dict[str, float | int | str | bool] = {"weight.max": max_weight}
    if initial.settings_sha256 is not None:  # the model settings every hospital must hold (signed with the plan)
        static[MODEL_SETTINGS_OPTION] = initial.settings_sha256

    def plan_options(participants: tuple[str, ...]) -> dict[str, float | int | str | bool]:
        return {**static, **mode_run.options(participants)}

    server = FederationServer(
        federation_id=federation.id, spec=initial.spec, initial_state=initial.state(),
        dictionary_hash=initial.dictionary_hash, identity=identity, enrolled=enrolled,
        secure_mode=federation.secure_mode, strategy=strategy, min_clients=min(federation.min_clients, len(enrolled)),
        local_epochs=federation.local_epochs, dp_policy=dp_policy, audit=audit, environment=federation.environment,
        plan_options=plan_options, mode_server=mode_run.server)
    for kind, payload in mode_run.audit:  # what the mode's set-up records (CKKS: who holds the secret key)
        audit.record(kind, payload)
    for resolved in initial.defaults:  # settings a rule of the SDK resolved (the DP default model)
        audit.record("resolved_default", resolved.payload())
    return server
