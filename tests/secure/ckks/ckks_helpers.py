"""Shared builders for the ckks-mode tests: a key ceremony, plans, realistic updates, a relay."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from clinograph.secure.aggregation import LocalUpdate, ModuleSums
from clinograph.secure.ckks import (
    CkksClient,
    CkksKeyring,
    CkksPreset,
    CkksServer,
    ckks_plan_options,
)
from clinograph.secure.ckks.ceremony import in_process_ceremony
from clinograph.secure.messages import RoundPlan
from clinograph.secure.wire import parse_envelope

from clinograph.core.errors import IntegrityError, ProtocolError
from clinograph.core.identity import Identity
from clinograph.core.spec import ModelSpec, ModuleKind, ModuleSpec

FED = "fed-ckks"
SPEC = ModelSpec(version=2, modules=(
    ModuleSpec(name="feature_embedding/heart_rate", shape=(16,), kind=ModuleKind.SHARED),
    ModuleSpec(name="gnn/layer1/has_feature", shape=(64, 96), kind=ModuleKind.SHARED),  # 6144: spans 2 ciphertexts
    ModuleSpec(name="concept/dysp", shape=(5,), kind=ModuleKind.SHARED),
    ModuleSpec(name="head/task", shape=(8,), kind=ModuleKind.PERSONAL),
))


def names(n: int) -> list[str]:
    return [f"hosp{i:02d}" for i in range(n)]


@lru_cache(maxsize=None)
def identity(name: str) -> Identity:
    return Identity.generate(name)


SERVER = identity("server")


class Ceremony:
    """The key ceremony for one federation: hosp00 deals; everyone else unwraps."""

    def __init__(self, hospitals: list[str], *, preset: CkksPreset = CkksPreset.ADD_ONLY_128, fed: str = FED):
        cer = in_process_ceremony(identities={h: identity(h) for h in hospitals}, dealer=hospitals[0],
                                  federation_id=fed, preset=preset)
        self.dealer = cer.dealer
        self.keyrings: dict[str, CkksKeyring] = dict(cer.keyrings)
        self.context = cer.context


@lru_cache(maxsize=None)
def ceremony(n: int, preset: CkksPreset = CkksPreset.ADD_ONLY_128) -> Ceremony:
    return Ceremony(names(n), preset=preset)


def make_plan(cer: Ceremony, n: int, *, round_: int = 4, min_clients: int = 2, spec: ModelSpec = SPEC,
              dictionary_hash: str = "d" * 64) -> RoundPlan:
    return RoundPlan(federation_id=FED, round=round_, participants=tuple(names(n)), spec=spec,
                     dictionary_hash=dictionary_hash, secure_mode="ckks", strategy="fedavg",
                     min_clients=min_clients, local_epochs=1, global_state_digest="0" * 64,
                     options=ckks_plan_options(cer.context))


def make_updates(plan: RoundPlan, *, seed: int = 0, scale: float = 0.05) -> dict[str, LocalUpdate]:
    """Realistic weighted deltas (float32 precision), weights ~ sample counts / 1000, uneven
    module coverage (hosp i skips module j when (i + j) % 3 == 0, except module 0)."""
    rng = np.random.default_rng(seed)
    out = {}
    for i, c in enumerate(plan.participants):
        w = float(rng.integers(200, 5000)) / 1000.0
        trained = [m for j, m in enumerate(plan.spec.shared) if j == 0 or (i + j) % 3 != 0]
        mods = {m.name: w * rng.normal(0.0, scale, m.size).astype(np.float32).astype(np.float64) for m in trained}
        out[c] = LocalUpdate(modules=mods, weight=w)
    return out


def server_for(cer: Ceremony, plan: RoundPlan) -> CkksServer:
    peers = {c: identity(c).public for c in plan.participants}
    return CkksServer.with_context(cer.context)(plan=plan, peers=peers, identity=SERVER)


def client_for(cer: Ceremony, plan: RoundPlan, name: str, update: LocalUpdate) -> CkksClient:
    peers = {c: identity(c).public for c in plan.participants}
    return CkksClient.with_keyring(cer.keyrings[name])(plan=plan, identity=identity(name), server=SERVER.public,
                                                       peers=peers, update=update)


def relay(server: CkksServer, clients: dict[str, CkksClient], first: dict[str, bytes] | None = None,
          ) -> tuple[dict[str, ModuleSums], dict[str, str]]:
    """Drive one round in process: deliver first messages (rejections recorded by the server),
    relay the aggregate, return each hospital's decrypted sums and the server's rejections."""
    first = first if first is not None else {c: cl.first_message() for c, cl in clients.items()}
    for _, data in first.items():
        try:
            server.receive(parse_envelope(data))
        except (ProtocolError, IntegrityError):
            pass
    results = {}
    for c, data in (server.next_stage() or {}).items():
        clients[c].handle(data)
        results[c] = clients[c].decrypted_result()
    assert server.next_stage() is None
    return results, server.rejected()


class ThresholdHospital:
    """A hospital of the ``ckks_threshold`` tests: its key holder, answering the set-up steps;
    ``rule``: the smallest t it accepts (its ``[release] tckks_threshold``; None: N-of-N only)."""

    def __init__(self, identity: Identity, peers, federation_id: str, rule: int | None = None):
        from clinograph.secure.ckks.holder import CkksKeyHolder

        self.name = identity.name
        self.keys = CkksKeyHolder(identity=identity, peers=peers, federation_id=federation_id, tckks_threshold=rule)

    def on_setup(self, step, parts):
        return self.keys.on_setup(step, parts)
