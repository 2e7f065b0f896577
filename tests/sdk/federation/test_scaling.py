"""Federated robust scaling: histograms over public bins summed by the masked mode, quantiles."""

import json

import numpy as np
import pandas as pd
import pytest
from clinograph.sdk.config import ScalingSection, SimulationConfig
from clinograph.sdk.federation.scaling import (
    HISTOGRAM_MODULE,
    MAX_BIN_COUNT,
    local_histograms,
    public_bins,
    quantiles_from_histogram,
)
from clinograph.sdk.federation.setup import federated_scaling
from clinograph.sdk.ingest import ingest
from clinograph.sdk.ontology import Feature, FeatureDictionary, FeatureKind, SiteSchema
from clinograph.sdk.ontology.dictionary import apply_transform
from clinograph.secure.audit import AuditTrail
from clinograph.secure.hazmat import fixedpoint
from clinograph.secure.masking.messages import MaskedInput
from clinograph.secure.runtime.config import FederationSection
from clinograph.secure.wire import open_envelope, parse_envelope

from clinograph.core.errors import ConfigError
from clinograph.core.identity import Identity

D = FeatureDictionary(name="scaling", version=1, features=(
    Feature(id="crp", name="CRP", kind=FeatureKind.NUMERIC, unit="mg/L", reference_low=1, reference_high=10,
            transform="log", physical_min=0),
    Feature(id="hr", name="HR", kind=FeatureKind.NUMERIC, unit="/min", reference_low=60, reference_high=100,
            physical_min=0, physical_max=350),
    Feature(id="sex", name="Sex", kind=FeatureKind.BINARY),
))


def _tables(seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for k, (n, mu_crp, mu_hr) in enumerate(((150, 0.5, 70.0), (90, 2.0, 95.0), (60, 1.2, 80.0))):
        df = pd.DataFrame({"pid": [f"p{i}" for i in range(n)], "y": rng.integers(0, 2, n),
                           "crp": np.exp(rng.normal(mu_crp, 1.0, n)), "hr": rng.normal(mu_hr, 12.0, n),
                           "sex": rng.integers(0, 2, n)})
        df.loc[rng.random(n) < 0.2, "crp"] = np.nan
        out.append(ingest(df, schema=SiteSchema(site=f"h{k}", patient_id="pid", label="y"), dictionary=D))
    return out


def _run(tables, tmp_path, mode="masked", quantiles="iqr"):
    ids = {t.site: Identity.generate(t.site) for t in tables}
    audit = AuditTrail(tmp_path / "audit", identity=(server := Identity.generate("server")))
    try:
        out = federated_scaling(tables, D, scaling=ScalingSection(source="federated", quantiles=quantiles),
                                federation=FederationSection(id="scale-test", secure_mode=mode, min_clients=2),
                                server_identity=server, identities=ids, audit=audit)
    finally:
        audit.close()
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_histogram_quantiles_are_within_one_bin_of_the_data(seed):
    rng = np.random.default_rng(seed)
    x = rng.gamma(2.0, 1.5, 500) - 1.0
    edges = np.linspace(-2.0, 15.0, 171)
    counts, _ = np.histogram(x, bins=edges)
    qs = (0.05, 0.25, 0.5, 0.75, 0.95)
    np.testing.assert_array_less(np.abs(quantiles_from_histogram(counts, edges, qs) - np.quantile(x, qs)),
                                 edges[1] - edges[0] + 1e-12)


def test_federated_quantiles_equal_pooled_quantiles_within_a_bin_width(tmp_path):
    tables = _tables()
    derived, rescaled, rounds = _run(tables, tmp_path)
    bins = public_bins(D, bins=200, span=5.0)
    assert rounds == 1
    for i, fid in enumerate(bins.features):
        node = D.node_index()[fid]
        pooled = np.concatenate([apply_transform(D.get(fid).transform, t.value[t.node == node]) for t in tables])
        q25, q50, q75 = np.quantile(pooled, (0.25, 0.5, 0.75))
        f = derived.get(fid)
        assert f.scale_center == pytest.approx(q50, abs=bins.width(i))
        assert f.scale_half_width == pytest.approx((q75 - q25) / 2, abs=bins.width(i))
        # every hospital's values are re-standardised with the federation's statistics
        for t in rescaled:
            sel = t.node == node
            np.testing.assert_allclose(t.std_value[sel], f.standardise_array(t.value[sel]))
    assert derived.get("sex") == D.get("sex") and derived.digest() != D.digest()
    assert all(t.dictionary is derived for t in rescaled)


def test_the_server_sees_only_the_sum_never_one_hospitals_histogram(tmp_path, monkeypatch):
    from clinograph.sdk.federation import securesum

    tables = _tables()
    clients = {}
    real = securesum.HospitalClient

    class Spy(real):  # keeps each hospital's client: what it sent the server, its plan
        def __init__(self, **kw):
            super().__init__(**kw)
            clients[self.name] = self

    monkeypatch.setattr(securesum, "HospitalClient", Spy)
    derived, _, _ = _run(tables, tmp_path)
    bins = public_bins(D, bins=200, span=5.0)
    total = sum(local_histograms(t, bins) for t in tables)
    for t in tables:
        client = clients[t.site]
        inputs = [open_envelope(env, sender=client.identity.public, model=MaskedInput)
                  for env in map(parse_envelope, client.outgoing) if env.kind == "masked_input"]
        assert len(inputs) == 1
        seen = np.frombuffer(inputs[0].words, dtype="<u4")[:bins.length]
        opts = client.plan.options
        counts = local_histograms(t, bins)
        assert np.count_nonzero(counts) > 10
        plain = np.concatenate([counts.ravel(), [1.0]]) * float(opts["masked.clip"]) / MAX_BIN_COUNT
        unmasked, _ = fixedpoint.encode(plain, scale=float(opts["masked.scale"]), bound=float(opts["masked.clip"]),
                                        clip=False)
        assert np.mean(seen == unmasked) < 0.01  # the words the server got are not the hospital's histogram
        # ... while every hospital decoded the exact sum
        np.testing.assert_allclose(client.task.summed(contributors=3), total, atol=0.01)
    assert HISTOGRAM_MODULE in clients[tables[0].site].task.modules.names()


def test_the_audit_names_features_and_bins_never_counts(tmp_path):
    tables = _tables()
    _run(tables, tmp_path)
    entries = [json.loads(line) for line in (tmp_path / "audit" / "audit.jsonl").read_text().splitlines()]
    hist = [e for e in entries if e["kind"] == "scaling_histogram"]
    assert len(hist) == 1
    p = hist[0]["payload"]
    assert p["features"] == ["crp", "hr"] and p["bins"] == 200 and set(p["edges"]) == {"crp", "hr"}
    assert all(len(v) == 2 for v in p["edges"].values())
    assert any(e["kind"] == "scaling_derived" for e in entries)
    text = json.dumps([e for e in entries if e["kind"].startswith("scaling")])
    for t in tables:  # no hospital's histogram (nor any long count vector) in the scaling entries
        assert str(local_histograms(t, public_bins(D, bins=200, span=5.0))[0].astype(int).tolist())[:40] not in text


def test_ckks_and_distributed_dp_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="server never sees a sum"):
        _run(_tables(), tmp_path, mode="ckks")
    with pytest.raises(ConfigError, match="source = 'federated' under .privacy. mode = 'distributed'"):
        from clinograph.sdk.federation.simulate import build_simulation

        cfg = SimulationConfig.model_validate({
            "scaling": {"source": "federated"}, "graph": {"k_similar": 0},
            "privacy": {"enabled": True, "mode": "distributed", "sample_rate": 1.0, "min_honest": 2,
                        "noise_multiplier": 1.0}})
        build_simulation(_tables(), D, cfg, audit_dir=tmp_path / "a2")


def test_simulate_runs_the_histogram_round_before_training_in_one_verified_audit_trail(tmp_path):
    from clinograph.sdk.federation.simulate import build_simulation, simulate
    from clinograph.secure.audit import verify_audit_dir

    cfg = SimulationConfig.model_validate({
        "federation": {"id": "scale-sim", "rounds": 2, "min_clients": 2, "local_epochs": 1},
        "model": {"hidden": 8}, "graph": {"k_similar": 0}, "scaling": {"source": "federated"}})
    sim = build_simulation(_tables(), D, cfg, audit_dir=tmp_path / "built")
    assert sim.dictionary is not None and sim.dictionary.get("crp").scale_center is not None
    assert sim.server.round == 1  # training rounds follow the set-up round
    # every hospital derived the dictionary itself: the same digest everywhere
    assert all(h.task.table.dictionary.digest() == sim.dictionary.digest() for h in sim.hospitals.values())
    sim.audit.close()
    res = simulate(_tables(), D, cfg, audit_dir=tmp_path / "audit", choose=False)
    assert len(res.rounds) >= 1
    assert all(m.task.table.dictionary.get("crp").scale_center is not None for m in res.hospitals.values())
    assert verify_audit_dir(tmp_path / "audit").ok
    entries = [json.loads(line) for line in (tmp_path / "audit" / "audit.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in entries]
    assert kinds.index("scaling_histogram") < kinds.index("scaling_derived") < kinds.index("model_selected")
    assert min(e["payload"]["round"] for e in entries if e["kind"] == "round_plan") == 0  # the histogram round
    assert sorted({e["payload"]["round"] for e in entries if e["kind"] == "round_participation"})[:2] == [0, 1]
