"""The payload schemas match what the producers really emit (guards against drift)."""

from __future__ import annotations

import numpy as np
import pytest
from clinograph.secure.audit import AuditTrail, render_report, verify_audit_dir
from clinograph.secure.audit.kinds import KINDS, RESERVED, check_payload
from clinograph.secure.messages import DPPolicy, LedgerEntry

from clinograph.core.identity import Identity

from .conftest import manifest


def test_real_dag_outcome_is_recorded_and_rendered(tmp_path):
    dag_voting = pytest.importorskip("clinograph.secure.dag_voting")
    concepts = ["asia", "tub", "either", "dysp"]
    votes = [dag_voting.encode_vote(concepts=concepts, local_nodes=concepts, weight=w,
                                    scores=np.array([[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]]))
             for w in (10.0, 20.0)]
    tally = dag_voting.tally_from_sum(concepts=concepts, summed=np.sum(votes, axis=0))
    outcome = dag_voting.decide_dag(tally, task="dysp", seed=0, round_=2)
    d = tmp_path / "a"
    with AuditTrail(d, identity=Identity.generate("server")) as trail:
        trail.record("dag_outcome", outcome.model_dump(mode="json"))
    assert verify_audit_dir(d).ok
    html = render_report(d, out=tmp_path / "r.html").read_text()
    assert 'id="img-dag"' in html and "Task: dysp." in html


def test_ledger_and_dp_policy_models_fit_their_audit_kinds():
    server, hosp = Identity.generate("server"), Identity.generate("hosp-a")
    entry = LedgerEntry(round=0, noise_multiplier=1.0, sample_rate=0.01, steps=10, clip_norm=1.0,
                        accountant="rdp", epsilon=0.5, delta=1e-5, budget_epsilon=3.0)
    assert check_payload("ledger", {"client": "hosp-a", **entry.model_dump(mode="json")}) is None
    policy = DPPolicy(required=True, max_epsilon=8.0, delta=1e-5, min_noise_multiplier=0.5, max_clip_norm=1.0)
    assert check_payload("manifest", manifest(server, {"hosp-a": hosp},
                                              dp_policy=policy.model_dump(mode="json"))) is None
    bad = manifest(server, {"hosp-a": hosp})
    bad["hospitals"] = {"hosp-a": "c2hvcnQ="}  # not a 32-byte key
    assert "hospitals.hosp-a" in check_payload("manifest", bad)


def test_every_kind_is_documented():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[3] / "docs" / "audit.md").read_text()
    for kind, model in KINDS.items():
        assert model.__doc__ and f"`{kind}`" in doc, kind
    assert RESERVED <= set(KINDS)
