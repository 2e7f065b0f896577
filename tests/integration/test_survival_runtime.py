"""A time-to-event federation end to end through the one runtime (secure/runtime, in process,
masked secure aggregation) under patient-level local DP: every hospital's ledger entry reaches
the server's audit trail each round, the hospitals score C-index and horizon AUROC, and each
hospital's exported survival model (loaded without the federation) gives the risks its task
gives (`clinograph predict`'s path)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.simulate import simulate
from clinograph.sdk.ingest import ingest
from clinograph.sdk.model.load import load_exported, predict_survival_exported
from clinograph.sdk.privacy import PrivacyLedger

pytest.importorskip("lifelines")


@pytest.mark.slow
def test_survival_federation_under_local_dp_through_the_runtime_then_export(tmp_path):
    from clinograph.sdk.datasets.real_tables import cohort_tables

    c = cohort_tables("lung", form="survival")
    tables = [ingest(df, schema=s, dictionary=c.dictionary) for df, s in c.hospitals]
    cfg = SimulationConfig.model_validate({
        "federation": {"rounds": 2, "secure_mode": "masked", "min_clients": 2, "local_epochs": 1},
        "model": {"hidden": 8}, "graph": {"k_similar": 0}, "training": {"lr": 0.02},
        "target": {"kind": "survival", "time_unit": "mo", "breaks": [3, 6, 12, 24, 36], "horizon": 12},
        "privacy": {"enabled": True, "epsilon_budget": 20.0, "noise_multiplier": 1.0, "batch_size": 16,
                    "state_dir": str(tmp_path / "state")},
        "output": str(tmp_path / "out")})
    result = simulate(tables, c.dictionary, cfg, audit_dir=tmp_path / "audit")
    audit = [json.loads(x) for x in (tmp_path / "audit" / "audit.jsonl").read_text().splitlines()]
    assert not [e for e in audit if e["kind"] == "update_rejected"]
    ledgers = [e["payload"] for e in audit if e["kind"] == "ledger"]
    sites = sorted(t.site for t in tables)
    assert sorted((p["client"], p["round"]) for p in ledgers) == sorted((s, r) for s in sites for r in range(2))
    for s in sites:  # the server's record is the hospital's own ledger; ε grows with the rounds
        mine = PrivacyLedger(tmp_path / "state" / s, site=s, budget_epsilon=20.0, delta=1e-5,
                             signer=result.hospitals[s].client.identity)
        assert result.epsilons[s][-1] == mine.epsilon() > result.epsilons[s][0] > 0
    for m in result.final.values():
        assert 0 <= m["cindex"] <= 1 and m["known"] <= m["n"]
    for s in sites:
        task = result.hospitals[s].client.task
        me = result.hospitals[s].client.identity
        path, _ = task.export(tmp_path / f"{s}.safetensors", signer=me)
        loaded = load_exported(path, trusted=me.public, audit_dir=tmp_path / "audit",
                               server=result.hospitals[s].client.server)  # the shared part is the released model
        assert loaded.released_round == loaded.description.release.round
        new = task.table.subset(task.split.test)
        _, surv, risk = predict_survival_exported(loaded, new)
        horizons = loaded.description.survival.horizons
        np.testing.assert_allclose(risk[:, horizons.index(12.0)], task.predict_table(new), atol=1e-9)
        np.testing.assert_allclose(surv, task.predict_survival_table(new), atol=1e-9)
