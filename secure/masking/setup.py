"""The masked mode's server side for a run: its plan options, its checks (distributed DP).

Called through :meth:`clinograph.secure.aggregation.SecureMode.open_run`; the run's assembly
(:mod:`clinograph.secure.runtime.assemble`) and :func:`clinograph.secure.runtime.build_server`
never branch on the mode's name.

- **Plan options**: neighbours and threshold from :func:`.params.masked_defaults` for the round's
  participant count (or ``[federation] masked_threshold``), clip = ``max_weight * masked_clip``,
  the ring's word bits; recomputed every round, so a round with fewer participants gets
  parameters that fit it. A configuration that no participant count could satisfy is refused
  at set-up, for the enrolled count.
- **Distributed DP**: the noise shares add up inside the masked sum; :func:`check_distributed`
  refuses a policy the ring cannot carry (every reason at once).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from clinograph.core.errors import ConfigError

from ..aggregation import ModeRun
from . import params


def masked_options(federation: Any, *, n: int, max_weight: float) -> dict[str, float | int | str | bool]:
    """The masked mode's plan options for ``n`` participants (threshold from the security argument)."""
    if federation.masked_threshold is not None:
        threshold = federation.masked_threshold
    else:
        threshold = params.masked_defaults(n).threshold
    return params.masked_plan_options(n_clients=n, threshold=threshold, clip=max_weight * federation.masked_clip,
                                      max_weight=max_weight, word_bits=federation.masked_word_bits)


def check_distributed(policy: Any, *, federation: Any, n: int, max_weight: float, dim: int) -> None:
    """Refuse a distributed-DP configuration that cannot keep its promise (every reason at once)."""
    from ..dp import DistributedPolicy, check_configuration

    d = policy.distributed
    if federation.masked_word_bits != 32:
        raise ConfigError("Distributed DP needs the 32-bit masked ring: set [federation] masked_word_bits = 32.")
    if federation.strategy != "fedsgd":
        raise ConfigError("Distributed DP is one DP-SGD step a round: it needs strategy = 'fedsgd'.")
    opts = masked_options(federation, n=n, max_weight=max_weight)
    check_configuration(DistributedPolicy(mechanism=d.mechanism, noise_multiplier=d.noise_multiplier,
                                          clip_norm=policy.max_clip_norm, sample_rate=d.sample_rate,
                                          min_honest=d.min_honest, rounds=d.rounds,
                                          max_epsilon=policy.max_epsilon, delta=policy.delta),
                        n_hospitals=n, masked_threshold=int(opts["masked.threshold"]),
                        scale=float(opts["masked.scale"]), hospital_bound=float(opts["masked.clip"]),
                        max_batch=max_weight, dim=dim, planned_rounds=federation.rounds)


def prepare_masked(*, federation: Any, transport: Any, run_id: str, enrolled: Mapping[str, Any], max_weight: float,
                   context: object | None, on_event: Callable[[str, Mapping[str, Any]], None]) -> ModeRun:
    """No exchange before the first round: the pairwise keys are agreed inside each round."""
    masked_options(federation, n=len(enrolled), max_weight=max_weight)  # refuse a bad config now

    def options(participants: tuple[str, ...]) -> dict[str, float | int | str | bool]:
        return masked_options(federation, n=len(participants), max_weight=max_weight)

    def check(policy: Any, *, dim: int) -> None:
        check_distributed(policy, federation=federation, n=len(enrolled), max_weight=max_weight, dim=dim)

    return ModeRun(options=options, check_distributed=check)
