"""ckks mode end to end: the hospitals' decrypted sums equal the plaintext mode's sums."""

from __future__ import annotations

import numpy as np
import pytest
from ckks_helpers import (
    SERVER,
    ceremony,
    client_for,
    identity,
    make_plan,
    make_updates,
    relay,
    server_for,
)
from clinograph.secure.aggregation import create_mode
from clinograph.secure.aggregation.plaintext import PlaintextClient, PlaintextServer
from clinograph.secure.ckks import CkksClient, CkksPreset, CkksServer
from clinograph.secure.wire import parse_envelope

from clinograph.core.errors import ConfigError, ProtocolError


def _plaintext_sums(plan, updates):
    peers = {c: identity(c).public for c in plan.participants}
    server = PlaintextServer(plan=plan, peers=peers, identity=SERVER)
    for c, u in updates.items():
        client = PlaintextClient(plan=plan, identity=identity(c), server=SERVER.public, peers=peers, update=u)
        server.receive(parse_envelope(client.first_message()))
    return server.result()


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("preset", [CkksPreset.ADD_ONLY_128, CkksPreset.ADD_ONLY_128_COMPACT])
def test_secure_aggregate_equals_plaintext_aggregate(preset):
    cer = ceremony(4, preset)
    plan = make_plan(cer, 4)
    updates = make_updates(plan, seed=1)
    server = server_for(cer, plan)
    results, rejected = relay(server, {c: client_for(cer, plan, c, u) for c, u in updates.items()})
    assert rejected == {}
    reference = _plaintext_sums(plan, updates)
    assert set(results) == set(plan.participants)
    for got in results.values():
        assert got.contributors == reference.contributors
        assert got.counts == reference.counts
        assert set(got.sums) == set(reference.sums) == {m.name for m in plan.spec.shared}
        for name, ref in reference.sums.items():
            assert _rel(got.sums[name], ref) < 1e-5
            assert np.max(np.abs(got.sums[name] - ref)) < 1e-5 * np.max(np.abs(ref))
            assert got.weights[name] == pytest.approx(reference.weights[name], rel=1e-8)
            assert _rel(got.mean(name), reference.mean(name)) < 1e-5
    # every hospital decrypts the same thing
    first = next(iter(results.values()))
    for got in results.values():
        for name in first.sums:
            np.testing.assert_allclose(got.sums[name], first.sums[name], rtol=0, atol=1e-6)


def test_module_trained_by_nobody_is_absent_and_counts_follow_coverage():
    cer = ceremony(3)
    plan = make_plan(cer, 3)
    updates = make_updates(plan, seed=2)
    only = "feature_embedding/heart_rate"
    updates = {c: type(u)(modules={only: u.modules[only]}, weight=u.weight) for c, u in updates.items()}
    updates.pop("hosp02")
    results, _ = relay(server_for(cer, plan), {c: client_for(cer, plan, c, u) for c, u in updates.items()})
    got = results["hosp00"]
    assert set(got.sums) == {only}
    assert got.counts == {only: 2}
    assert got.contributors == ("hosp00", "hosp01")
    expected = updates["hosp00"].modules[only] + updates["hosp01"].modules[only]
    assert _rel(got.sums[only], expected) < 1e-5


def test_server_never_returns_the_sum_and_registry_says_so():
    mode = create_mode("ckks")
    assert mode.server is CkksServer and mode.client is CkksClient and mode.server_sees_sum is False
    cer = ceremony(3)
    plan = make_plan(cer, 3)
    server = server_for(cer, plan)
    relay(server, {c: client_for(cer, plan, c, u) for c, u in make_updates(plan).items()})
    with pytest.raises(ProtocolError, match="server never sees the sum.*decrypted_result"):
        server.result()


def test_server_aborts_below_min_clients_and_sends_nothing():
    cer = ceremony(3)
    plan = make_plan(cer, 3, min_clients=3)
    updates = make_updates(plan)
    updates.pop("hosp01")
    server = server_for(cer, plan)
    clients = {c: client_for(cer, plan, c, u) for c, u in updates.items()}
    for cl in clients.values():
        server.receive(parse_envelope(cl.first_message()))
    with pytest.raises(ProtocolError, match="Only 2 ckks update.*needs 3"):
        server.next_stage()
    assert server.next_stage() is None
    with pytest.raises(ProtocolError, match="No CKKS aggregate has been decrypted"):
        clients["hosp00"].decrypted_result()


def test_constructors_require_key_material_and_matching_plan_options():
    cer = ceremony(3)
    plan = make_plan(cer, 3)
    peers = {c: identity(c).public for c in plan.participants}
    upd = make_updates(plan)["hosp00"]
    with pytest.raises(ConfigError, match="needs the hospital's CKKS keyring"):
        CkksClient(plan=plan, identity=identity("hosp00"), server=SERVER.public, peers=peers, update=upd)
    with pytest.raises(ConfigError, match="needs the federation's public CKKS context"):
        CkksServer(plan=plan, peers=peers, identity=SERVER)
    other = ceremony(3, CkksPreset.ADD_ONLY_128_COMPACT)
    with pytest.raises(ConfigError, match="do not match the context"):
        client_for(other, plan, "hosp00", upd)
    with pytest.raises(ConfigError, match="do not match the context"):
        server_for(other, plan)


def test_client_refuses_values_that_could_wrap_the_aggregate():
    cer = ceremony(3)
    plan = make_plan(cer, 3)
    upd = make_updates(plan)["hosp00"]
    big = type(upd)(modules=dict(upd.modules), weight=1.0e5)  # 3 * 1e5 > 2^18
    with pytest.raises(ConfigError, match="exceeds the per-hospital bound.*Scale every weight"):
        client_for(cer, plan, "hosp00", big).first_message()
    nan = type(upd)(modules={k: v * np.nan for k, v in upd.modules.items()}, weight=1.0)
    with pytest.raises(ConfigError, match="NaN or infinity"):
        client_for(cer, plan, "hosp00", nan).first_message()
