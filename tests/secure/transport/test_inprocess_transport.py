"""The in-process driver runs any registered mode, relays stages and models dropouts."""

from __future__ import annotations

import numpy as np
import pytest
from clinograph.secure.aggregation import LocalUpdate
from clinograph.secure.masking import masked_plan_options
from clinograph.secure.messages import RoundPlan
from clinograph.secure.transport import run_aggregation

from clinograph.core.errors import ConfigError, ProtocolError
from clinograph.core.identity import Identity
from clinograph.core.spec import ModelSpec, ModuleKind, ModuleSpec

N = 6
NAMES = [f"site{i}" for i in range(N)]
IDS = {c: Identity.generate(c) for c in NAMES}
SERVER = Identity.generate("server")
SPEC = ModelSpec(version=1, modules=(ModuleSpec(name="gnn/w", shape=(40,), kind=ModuleKind.SHARED),
                                     ModuleSpec(name="concept/c", shape=(3,), kind=ModuleKind.SHARED)))


def plan(mode: str) -> RoundPlan:
    opts = masked_plan_options(n_clients=N, threshold=3, clip=2.0) if mode == "masked" else {}
    return RoundPlan(federation_id="fed", round=0, participants=tuple(NAMES), spec=SPEC, dictionary_hash="a" * 64,
                     secure_mode=mode, strategy="fedavg", min_clients=2, local_epochs=1,
                     global_state_digest="b" * 64, options=opts)


def updates() -> dict[str, LocalUpdate]:
    rng = np.random.default_rng(3)
    out = {}
    for i, c in enumerate(NAMES):
        w = 0.5 + 0.1 * i
        mods = {"gnn/w": w * rng.normal(0, 0.1, 40)}
        if i % 2 == 0:
            mods["concept/c"] = w * rng.normal(0, 0.1, 3)
        out[c] = LocalUpdate(modules=mods, weight=w)
    return out


@pytest.mark.parametrize("mode", ["insecure_plaintext", "masked"])
@pytest.mark.parametrize("drop", [{}, {"site1": 0}])
def test_both_modes_give_the_survivors_weighted_sums(mode, drop):
    ups = updates()
    res, rejected = run_aggregation(mode=mode, plan=plan(mode), server_identity=SERVER, client_identities=IDS,
                                    updates=ups, drop=drop)
    alive = [c for c in NAMES if c not in drop]
    assert rejected == {} and res.contributors == tuple(alive)
    np.testing.assert_allclose(res.sums["gnn/w"], sum(ups[c].modules["gnn/w"] for c in alive), atol=1e-6)
    assert res.weights["gnn/w"] == pytest.approx(sum(ups[c].weight for c in alive), rel=1e-6)
    assert res.counts == {"gnn/w": len(alive), "concept/c": sum(1 for c in alive if NAMES.index(c) % 2 == 0)}


def test_masked_mode_survives_a_dropout_after_masking():
    ups = updates()
    res, _ = run_aggregation(mode="masked", plan=plan("masked"), server_identity=SERVER, client_identities=IDS,
                             updates=ups, drop={"site2": 2, "site4": 3})
    assert "site2" not in res.contributors and "site4" in res.contributors


def test_participant_without_update_stays_silent_and_unknown_update_is_refused():
    ups = updates()
    del ups["site5"]
    res, _ = run_aggregation(mode="masked", plan=plan("masked"), server_identity=SERVER, client_identities=IDS,
                             updates=ups)
    assert "site5" not in res.contributors
    ups["intruder"] = ups["site0"]
    with pytest.raises(ConfigError, match="intruder"):
        run_aggregation(mode="masked", plan=plan("masked"), server_identity=SERVER, client_identities=IDS,
                        updates=ups)


@pytest.mark.parametrize("mode", ["insecure_plaintext", "masked"])
def test_too_few_clients_aborts(mode):
    p = plan(mode).model_copy(update={"min_clients": 5})
    with pytest.raises(ProtocolError, match="nothing published"):
        run_aggregation(mode=mode, plan=p, server_identity=SERVER, client_identities=IDS, updates=updates(),
                        drop={"site0": 0, "site1": 0})
