"""The server's side of a distributed-DP simulation: its ``[dp_policy]`` and the check of its promise.

The hospitals' side is their NS-FL task's trainer
(:mod:`clinograph.sdk.privacy.distributed_trainer`). :func:`.simulate.build_simulation` builds a
whole federation in process with them when ``[privacy] mode = "distributed"`` (the same server
builder, transport and loop as every federation), after checking the policy with
:func:`check_simulation` (:func:`clinograph.secure.dp.check_configuration`).
"""

from __future__ import annotations

from collections.abc import Sequence

from clinograph.secure.dp import check_configuration, wrap_free
from clinograph.secure.runtime.build import masked_options, weight_bound
from clinograph.secure.runtime.config import DPPolicySection

from clinograph.core.errors import ConfigError

from ..config import SimulationConfig
from ..ingest.table import PatientTable
from .candidates import distributed_rounds


def distributed_policy(config: SimulationConfig) -> DPPolicySection:
    """The server's [dp_policy] for a simulation whose hospitals share ``config.privacy``."""
    p = config.privacy
    return DPPolicySection(max_epsilon=p.epsilon_budget, delta=p.delta, max_clip_norm=p.clip_norm,
                           min_noise_multiplier=0.0, mode="distributed", mechanism=p.mechanism,
                           noise_multiplier=p.noise_multiplier, sample_rate=p.sample_rate, min_honest=p.min_honest,
                           rounds=distributed_rounds(config))  # the whole choice with private selection


def with_public_parameters(config: SimulationConfig, *, n_hospitals: int, dim: int) -> SimulationConfig:
    """A distributed-DP simulation's public mechanism parameters, filled in where ``[privacy]`` leaves
    them out (one operator configures every party of a simulation; a deployment writes them in every
    hospital.toml and the server.toml, docs/privacy.md): ``sample_rate`` q = 1 (full-batch rounds, the
    presets' q: no subsampling bound), and ``noise_multiplier`` σ calibrated to ``target_epsilon`` (else
    ``epsilon_budget``) over the rounds the promise covers (:func:`.candidates.distributed_rounds`), as
    the server checks it (:func:`clinograph.sdk.privacy.calibration.distributed_noise_multiplier`). The
    ledger entries and the server's audited policy carry the σ used. ``min_honest`` h is the trust
    assumption and is not filled in: refused with the fix (before, the refusal named [dp_policy], a
    section a simulation config does not use for these)."""
    p = config.privacy
    if not (p.enabled and p.mode == "distributed"):
        return config
    if p.min_honest is None:
        raise ConfigError("[privacy] mode = 'distributed' needs min_honest (h): the number of honest hospitals, "
                          "surviving each round, that the guarantee relies on -- each adds 1/h of the noise. Set "
                          f"[privacy] min_honest = 2 (the demo's; at most the masked threshold t, and at most the "
                          f"{n_hospitals} hospitals).")
    update: dict[str, float] = {}
    if p.sample_rate is None:
        update["sample_rate"] = 1.0
    if p.noise_multiplier is None:
        from ..privacy.calibration import distributed_noise_multiplier

        resolved = config.model_copy(update={"privacy": p.model_copy(update=update)})
        update["noise_multiplier"] = distributed_noise_multiplier(
            resolved, dim=dim, n_hospitals=n_hospitals, target_epsilon=p.target_epsilon or p.epsilon_budget,
            rounds=distributed_rounds(resolved))
    if not update:
        return config
    return config.model_copy(update={"privacy": p.model_copy(update=update)})


def check_simulation(config: SimulationConfig, tables: Sequence[PatientTable], *, dim: int) -> float:
    """The configuration-time check of the federation's policy (:func:`check_configuration`);
    returns the promised ε. What build_server should run (hook: see docs/privacy.md)."""
    fed = config.federation
    from clinograph.secure.aggregation import create_mode

    if not create_mode(fed.secure_mode).distributed_dp or fed.strategy != "fedsgd":
        raise ConfigError(f"Distributed DP needs a secure mode whose sum carries the hospitals' noise shares (masked; "
                          f"this config has {fed.secure_mode!r}) and strategy = 'fedsgd' (it has {fed.strategy!r}).")
    from clinograph.secure.runtime.build import build_strategy

    n = len(tables)
    max_weight = weight_bound(build_strategy(fed), fed)
    opts = masked_options(fed, n=n, max_weight=max_weight)
    policy = distributed_policy(config).distributed()
    if not wrap_free(n_clients=n, bound=float(opts["masked.clip"]), scale=float(opts["masked.scale"])):
        raise ConfigError("masked scale not wrap-free")  # pragma: no cover - masked_options guarantees it
    return check_configuration(policy, n_hospitals=n, masked_threshold=int(opts["masked.threshold"]),
                               scale=float(opts["masked.scale"]), hospital_bound=float(opts["masked.clip"]),
                               max_batch=max_weight, dim=dim)
