"""build_server refuses distributed-DP configurations whose promise the federation would outrun."""

from __future__ import annotations

import pytest
from clinograph.sdk.config import HospitalConfig
from clinograph.sdk.federation.build import initial_model_for
from clinograph.secure.audit import AuditTrail
from clinograph.secure.runtime import build_server
from clinograph.secure.runtime.config import DPPolicySection, FederationSection

from clinograph.core.errors import ConfigError
from clinograph.core.identity import Identity


def _build(tables, dictionary, tmp_path, *, rounds: int, delta: float = 1e-5):
    cfg = HospitalConfig.model_validate({"model": {"hidden": 8}, "graph": {"k_similar": 0}})
    ids = {t.site: Identity.generate(t.site).public for t in tables}
    server_id = Identity.generate("server")
    policy = DPPolicySection(max_epsilon=3.0, delta=delta, max_clip_norm=1.0, min_noise_multiplier=0.0,
                             mode="distributed", mechanism="skellam", noise_multiplier=20.0, sample_rate=1.0,
                             min_honest=2, rounds=30)
    audit = AuditTrail(tmp_path / f"audit-{rounds}-{delta}", identity=server_id)
    try:
        return build_server(federation=FederationSection(secure_mode="masked", strategy="fedsgd", rounds=rounds),
                            identity=server_id, enrolled=ids, initial=initial_model_for(cfg, dictionary=dictionary),
                            audit=audit, dp_policy=policy.policy())
    finally:
        audit.close()


def test_a_federation_planning_more_rounds_than_the_promise_covers_is_refused(tables, dictionary, tmp_path):
    assert _build(tables, dictionary, tmp_path, rounds=30) is not None  # full batch, σ = 20, 30 rounds: ε < 3
    with pytest.raises(ConfigError, match=r"the federation plans 31 rounds but the ε promise covers \[dp_policy\] "
                                          r"rounds = 30"):
        _build(tables, dictionary, tmp_path, rounds=31)


def test_a_delta_too_large_for_a_guarantee_is_refused(tables, dictionary, tmp_path):
    with pytest.raises(ConfigError, match=r"δ = 0.01 must be in \(0, 0.001\]"):
        _build(tables, dictionary, tmp_path, rounds=30, delta=0.01)


def test_the_demo_calibration_is_what_build_server_accepts(tables, dictionary, tmp_path):
    """σ from distributed_noise_multiplier meets the server's ε check; 0.9·σ does not."""
    from clinograph.sdk.demo.run import demo_distributed_config
    from clinograph.sdk.privacy.calibration import distributed_noise_multiplier

    cfg = demo_distributed_config(rounds=15, seed=0, epsilon=3.0)
    initial = initial_model_for(cfg.hospital_config(), dictionary=dictionary)
    sigma = distributed_noise_multiplier(cfg, dim=sum(m.size for m in initial.spec.shared), n_hospitals=len(tables),
                                         target_epsilon=3.0)
    ids = {t.site: Identity.generate(t.site).public for t in tables}
    server_id = Identity.generate("server")
    for s, ok in ((sigma, True), (0.9 * sigma, False)):
        policy = DPPolicySection(max_epsilon=3.0, delta=1e-5, max_clip_norm=cfg.privacy.clip_norm,
                                 min_noise_multiplier=0.0, mode="distributed", noise_multiplier=s,
                                 sample_rate=cfg.privacy.sample_rate, min_honest=2, rounds=15)
        audit = AuditTrail(tmp_path / f"calib-{ok}", identity=server_id)
        try:
            def build(p=policy, a=audit):
                return build_server(federation=cfg.federation, identity=server_id, enrolled=ids, initial=initial,
                                    audit=a, dp_policy=p.policy())
            if ok:
                assert build() is not None
            else:
                with pytest.raises(ConfigError, match=r"give ε = .* > max_epsilon = 3"):
                    build()
        finally:
            audit.close()
