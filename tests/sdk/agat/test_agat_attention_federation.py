"""Attention-weighted aggregation (AGAT eq. 1) in real federations of AGAT hospitals."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from clinograph.sdk.agat.federation import agat_simulation
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.simulate import build_simulation
from clinograph.secure.messages import ClientUpdate
from clinograph.secure.policy import InsecureOptionWarning
from clinograph.secure.strategies.attention import InsecureAttention, PlaintextUpdateTap
from clinograph.secure.wire import load_payload, parse_envelope
from sdk_helpers import small_tables

from clinograph.core.codec import decode_array
from clinograph.core.errors import ConfigError
from clinograph.core.spec import ModuleKind


def cfg(mode, strategy, rounds=1):
    return SimulationConfig.model_validate({
        "task": "agat", "agat": {"hidden": 16, "k_neighbours": 4},
        "federation": {"rounds": rounds, "secure_mode": mode, "min_clients": 2, "local_epochs": 1,
                       "strategy": strategy},
        "training": {"lr": 0.01, "batch_size": 32}})


def one_round(mode, strategy, tmp_path):
    tables = small_tables()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureOptionWarning)
        sim = agat_simulation(tables, tables[0].dictionary, cfg(mode, strategy), audit_dir=tmp_path / f"{mode}-{strategy}")
    initial = {n: v.copy() for n, v in sim.server.state.items()}
    sim.run_round()
    sim.audit.close()
    return sim, initial


def individual_updates(sim):
    """Each hospital's (weight, module -> Δ) from its signed plaintext update."""
    out = {}
    for name, h in sim.hospitals.items():
        for data in h.outgoing:
            env = parse_envelope(data)
            if env.kind == "client_update":
                upd = load_payload(env, ClientUpdate)
                mods = {t.name: decode_array(t.data, dtype=t.dtype, length=sim.server.spec.module(t.name).size,
                                             what=t.name) / upd.weight for t in upd.modules}
                out[name] = (upd.weight, mods)
    return out


def test_masked_secure_attention_equals_the_plaintext_attention_weighted_mean_of_the_same_logits(tmp_path):
    plain, initial = one_round("insecure_plaintext", "agat_secure_attention", tmp_path)
    masked, _ = one_round("masked", "agat_secure_attention", tmp_path)
    logits = {n: h.task.attention_logit for n, h in plain.hospitals.items()}
    assert logits == {n: h.task.attention_logit for n, h in masked.hospitals.items()}  # same training, same logits
    assert len({round(v, 6) for v in logits.values()}) == len(logits)  # the attention is not uniform
    ups = individual_updates(plain)
    for n, (w, _) in ups.items():
        assert w == pytest.approx(math.exp(logits[n]))  # the weight slot carries exp(logit)
    # the plaintext attention-weighted mean, from the individual updates and the logits alone
    expected = {}
    for name, theta in initial.items():
        contrib = {n: mods[name] for n, (_, mods) in ups.items() if name in mods}
        if not contrib:
            expected[name] = theta
            continue
        e = {n: math.exp(logits[n]) for n in contrib}
        beta = {n: v / sum(e.values()) for n, v in e.items()}
        expected[name] = theta - sum(beta[n] * contrib[n] for n in contrib)
    got = masked.hospitals["north"].task.modules.state(ModuleKind.SHARED)  # the masked run's new global model
    for name, ref in expected.items():
        if name == "metric/validation":
            continue  # selection's encoded sums, compared through the plaintext state below
        assert np.max(np.abs(got[name] - ref)) <= 1e-4, name  # masked fixed point (scale of this plan)
    for name, ref in plain.server.state.items():
        assert np.max(np.abs(got[name] - ref)) <= 1e-4 * max(1.0, float(np.max(np.abs(ref)))), name
    uniform = {n: np.mean([m[n] for _, m in ups.values() if n in m], axis=0) for n in ("gat/layer1",)}
    assert np.max(np.abs((initial["gat/layer1"] - uniform["gat/layer1"]) - got["gat/layer1"])) > 1e-4


def test_insecure_attention_runs_under_plaintext_with_the_tap_and_is_layer_wise_fedatt(tmp_path):
    sim, initial = one_round("insecure_plaintext", "insecure_attention", tmp_path)
    assert isinstance(sim.transport, PlaintextUpdateTap)
    strategy = sim.server.strategy
    assert isinstance(strategy, InsecureAttention)
    ups = individual_updates(sim)
    beta = strategy.history[-1]["gat/layer1"]
    scores = {n: float(np.linalg.norm(m["gat/layer1"])) for n, (_, m) in ups.items()}
    e = {n: math.exp(s - max(scores.values())) for n, s in scores.items()}
    assert beta == pytest.approx({n: v / sum(e.values()) for n, v in e.items()})
    expected = initial["gat/layer1"] - sum(beta[n] * ups[n][1]["gat/layer1"] for n in ups)
    assert sim.server.state["gat/layer1"] == pytest.approx(expected, rel=1e-6, abs=1e-8)  # updates travel as float32


@pytest.mark.parametrize("mode", ["masked", "ckks"])
def test_insecure_attention_is_refused_before_anything_is_built(mode, tmp_path):
    tables = small_tables()
    with pytest.raises(ConfigError, match=f"'insecure_attention' is refused under secure_mode = '{mode}'"):
        agat_simulation(tables, tables[0].dictionary, cfg(mode, "insecure_attention"), audit_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_the_one_server_builder_refuses_insecure_attention_under_a_secure_mode(tmp_path):
    """Every path to a server (simulation, ServerApp) goes through build_server, which refuses it."""
    tables = small_tables()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureOptionWarning)
        with pytest.raises(ConfigError, match="'insecure_attention' is refused under secure_mode = 'masked'"):
            build_simulation(tables, tables[0].dictionary, cfg("masked", "insecure_attention"), audit_dir=tmp_path / "y")
    assert not (tmp_path / "y").exists()  # refused before any audit directory is written


def test_a_plaintext_attention_run_ends_its_audit_and_verifies(tmp_path):
    from clinograph.sdk.agat.federation import run_agat_simulation
    from clinograph.secure.audit import verify_audit_dir

    tables = small_tables()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureOptionWarning)
        res = run_agat_simulation(tables, tables[0].dictionary, cfg("insecure_plaintext", "insecure_attention", rounds=2),
                                  audit_dir=tmp_path / "audit")
    assert len(res.rounds) == 2 and set(res.final) == {t.site for t in tables}
    assert verify_audit_dir(tmp_path / "audit").ok
    assert '"run_ended"' in (tmp_path / "audit" / "audit.jsonl").read_text()
