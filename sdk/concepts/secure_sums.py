"""Run the F-CMs federation's sums -- DAG votes and module updates -- through a secure mode.

:class:`FCMFederation` adds things up in two places (the vote tally, section 4.2.1, and the
module-wise update sums, section 4.2.3). By default it does so in plaintext, in process. A
:class:`SecureSums` instead runs each sum as one round of a registered secure-aggregation
mode (``masked`` by default) over :func:`clinograph.secure.transport.run_aggregation`,
with a signing identity per hospital, so the server side only ever holds what the mode
reveals: per-module sums over contributors.

The masked mode bounds every weighted value by ``clip`` and every weight by
``max_weight`` (fixed-point encoding); values outside are an error, never silently clipped.
Votes carry ``n_k`` in each slot, so ``max_weight`` must be at least the largest client.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from clinograph.secure.aggregation.base import LocalUpdate, ModuleSums
from clinograph.secure.errors import ConfigError
from clinograph.secure.identity import Identity
from clinograph.secure.masking import masked_plan_options, neighbour_count
from clinograph.secure.messages import RoundPlan
from clinograph.secure.spec import ModelSpec
from clinograph.secure.transport import run_aggregation


class SecureSums:
    """A callable ``(purpose, spec, updates) -> ModuleSums`` backed by the ``masked`` mode.

    Args:
        federation_id: goes into every round plan.
        max_weight: public bound on any client's weight ``n_k`` (and on any vote slot).
        delta_bound: public bound on ``|Delta|`` of one parameter in one round; weighted values
            are bounded by ``max_weight * delta_bound``.
    """

    def __init__(self, *, federation_id: str, max_weight: float, delta_bound: float = 1.0):
        if not max_weight > 0 or not delta_bound > 0:
            raise ConfigError(f"SecureSums needs max_weight > 0 and delta_bound > 0, got {max_weight}, {delta_bound}.")
        self.federation_id, self.max_weight, self.delta_bound = federation_id, float(max_weight), float(delta_bound)
        self.server = Identity.generate("server")
        self.identities: dict[str, Identity] = {}
        self.rounds = 0

    def __repr__(self) -> str:
        return f"SecureSums(federation_id={self.federation_id!r}, rounds={self.rounds})"

    def __call__(self, purpose: str, spec: ModelSpec, updates: Mapping[str, LocalUpdate]) -> ModuleSums:
        """One masked round over ``updates``; refuses to return a partial sum."""
        names = tuple(sorted(updates))
        for c in names:
            if c not in self.identities:
                self.identities[c] = Identity.generate(c)
        k = neighbour_count(len(names))
        clip = self.max_weight * (self.delta_bound if purpose == "updates" else 1.0)
        plan = RoundPlan(federation_id=self.federation_id, round=self.rounds, participants=names, spec=spec,
                         dictionary_hash=hashlib.sha256(purpose.encode()).hexdigest(), secure_mode="masked",
                         strategy="fedavg", min_clients=len(names), local_epochs=1,
                         global_state_digest=hashlib.sha256(f"{purpose}:{self.rounds}".encode()).hexdigest(),
                         options=masked_plan_options(n_clients=len(names), threshold=(k + 1) // 2 + 1, clip=clip,
                                                     max_weight=self.max_weight))
        self.rounds += 1
        sums, rejected = run_aggregation(mode="masked", plan=plan, server_identity=self.server,
                                         client_identities={c: self.identities[c] for c in names},
                                         updates=dict(updates))
        if rejected or set(sums.contributors) != set(names):
            raise ConfigError(f"Secure {purpose} sum lost contributors: {sorted(rejected)}; check max_weight "
                              f"({self.max_weight}) and delta_bound ({self.delta_bound}) against the clients' values.")
        return sums
