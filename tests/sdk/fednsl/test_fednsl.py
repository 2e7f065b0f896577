"""FedNSL: rules, predicates, graph values, E-step (KL), generator M-step, strategy, runtime, audit."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from clinograph.sdk.fednsl import HospitalGraph, HospitalRules, Rule, RuleSpace, ScorerSettings
from clinograph.sdk.fednsl.client import EStepSettings
from clinograph.sdk.fednsl.federation import (
    insecure_per_hospital_posteriors,
    run_rules_federation,
    write_rule_space,
)
from clinograph.sdk.fednsl.generator import GeneratorPreset, RuleGenerator
from clinograph.sdk.fednsl.scorer import fit_head, sample_candidates
from clinograph.secure.aggregation.base import ModuleSums
from clinograph.secure.audit import AuditTrail
from clinograph.secure.audit.kinds import check_payload
from clinograph.secure.audit.report import render_report
from clinograph.secure.audit.verify import verify_audit_dir
from clinograph.secure.policy import InsecureOptionWarning
from clinograph.secure.runtime.config import FederationSection
from clinograph.secure.strategies import create_strategy
from clinograph.secure.strategies.rules import POSTERIOR_MODULE, PRIOR_MODULE, SUPPORT_MODULE

from clinograph.core.errors import ConfigError, SecurityPolicyError
from clinograph.core.identity import Identity

PREDS = ("lactate_high", "lactate_missing", "map_low", "map_normal", "pap_high")


def test_rule_string_form_is_stable_and_parses_back():
    r = Rule(head="shock", body=("map_low", "lactate_high"))
    assert str(r) == "lactate_high ∧ map_low → shock"
    assert r.ascii() == "lactate_high & map_low -> shock"
    assert Rule.parse(str(r)) == r == Rule.parse("map_low & lactate_high -> shock")
    assert hash(r) == hash(Rule.parse(r.ascii()))
    with pytest.raises(ConfigError, match="exactly one arrow"):
        Rule.parse("lactate_high ∧ map_low")
    with pytest.raises(ConfigError, match="not predicate names"):
        Rule(head="Shock!", body=("map_low",))


def test_rule_space_orders_bodies_and_skips_same_feature_pairs():
    space = RuleSpace.enumerate(heads=("shock",), predicates=PREDS, max_len=2)
    assert ("lactate_high", "lactate_missing") not in space.bodies
    assert ("lactate_high", "map_low") in space.bodies
    h, j = space.index(Rule.parse("map_low ∧ lactate_high → shock"))
    assert space.rule(h, j) == Rule(head="shock", body=("lactate_high", "map_low"))
    with pytest.raises(ConfigError, match="not in this rule space"):
        space.index(Rule(head="sepsis", body=("map_low",)))


def _graph(x: np.ndarray, k: int = 2) -> HospitalGraph:
    return HospitalGraph.from_values(x, x, predicates=PREDS, k=k)


def test_body_values_are_path_products_and_graph_search_only_adds():
    rng = np.random.default_rng(0)
    x = rng.random((30, len(PREDS)))
    g = _graph(x)
    own = g.body_values([("lactate_high", "map_low")], graph_search=False)[:, 0]
    np.testing.assert_allclose(own, x[:, 0] * x[:, 2])
    graph = g.body_values([("lactate_high", "map_low")], graph_search=True)[:, 0]
    assert (graph >= own - 1e-12).all() and (graph <= 1).all()


def test_fuzzy_values_follow_public_reference_ranges():
    import pandas as pd
    from clinograph.sdk.datasets.alarm import load_dictionary
    from clinograph.sdk.fednsl.predicates import fuzzy_values, predicate_names
    from clinograph.sdk.ingest import ingest
    from clinograph.sdk.ontology import SiteSchema
    from clinograph.sdk.ontology.schema import ColumnMap

    d = load_dictionary()
    df = pd.DataFrame({"pid": ["a", "b", "c"], "pap": [35.0, 15.0, np.nan], "y": [1, 0, 0]})
    pt = ingest(df, schema=SiteSchema(site="s", patient_id="pid", label="y",
                                      columns={"pap": ColumnMap(feature="pap", unit=d.get("pap").unit)}), dictionary=d)
    preds = ("pap_high", "pap_low", "pap_normal", "pap_missing")
    assert set(preds) <= set(predicate_names(d))
    x = fuzzy_values(pt, preds)
    assert x[0, 0] > 0.99 and x[1, 2] > 0.9 and x[2, 3] == 1.0 and x[2, :3].sum() == 0
    with pytest.raises(KeyError, match="not in the vocabulary"):
        fuzzy_values(pt, ("pap_sideways",))


def _rule_data(n: int = 400, seed: int = 0):
    """Head = pap_high (rule 0 fires on positives); rule 1 never fires here; rule 2 is noise."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.3).astype(int)
    values = np.stack([np.where(y == 1, 0.9, 0.05), np.zeros(n), rng.random(n)], axis=1)
    return values, y


def test_kl_keeps_mass_on_rules_no_local_patient_fired():
    values, y = _rule_data()
    log_prior = np.log(np.array([0.2, 0.6, 0.2]))
    cand = np.arange(3)
    with_kl = fit_head(values, y, log_prior, candidates=cand, settings=ScorerSettings(kl_weight=1.0))
    without = fit_head(values, y, log_prior, candidates=cand, settings=ScorerSettings(kl_weight=0.0))
    assert without.posterior[1] < with_kl.posterior[1]  # the rule seen elsewhere keeps its prior mass with KL
    assert without.kl > with_kl.kl
    assert with_kl.posterior.sum() == pytest.approx(1.0)
    p = without.predict(values)
    assert ((p >= 0.5) == (y == 1)).mean() > 0.9


def test_candidates_are_shared_for_a_public_seed():
    prior = np.full(50, 1 / 50)
    a = sample_candidates(prior, draws=20, seed=7)
    assert np.array_equal(a, sample_candidates(prior, draws=20, seed=7)) and len(set(a)) == len(a)


def test_generator_m_step_raises_the_likelihood_of_sampled_rules():
    space = RuleSpace.enumerate(heads=("shock",), predicates=PREDS, max_len=2)
    gen = RuleGenerator(space, preset=GeneratorPreset(epochs=40, samples_per_head=256), seed=0)
    before = gen.prior()
    assert before.shape == (1, space.n_bodies) and before.sum() == pytest.approx(1.0)
    j = space.index(Rule.parse("lactate_high ∧ map_low → shock"))[1]
    mixture = np.zeros((1, space.n_bodies))
    mixture[0, j] = 1.0
    gen.m_step(mixture, rng=np.random.default_rng(0))
    after = gen.prior()
    assert after[0, j] > 0.5 > before[0, j]


def _strategy(tmp_path: Path):
    space = RuleSpace.enumerate(heads=("shock",), predicates=PREDS, max_len=2)
    sha = write_rule_space(space, tmp_path / "space.json")
    return space, create_strategy("fednsl_rules", rule_space=str(tmp_path / "space.json"), rule_space_sha256=sha)


def test_strategy_turns_the_sum_into_the_mixture_and_records_rules(tmp_path):
    space, strat = _strategy(tmp_path)
    n = space.size
    p1, p2 = np.zeros(n), np.zeros(n)
    p1[0], p2[1] = 1.0, 1.0
    state = {PRIOR_MODULE: np.full(n, 1 / n), POSTERIOR_MODULE: np.zeros(n), SUPPORT_MODULE: np.zeros(2 * n)}
    sup = np.full(2 * n, 0.1)
    sums = ModuleSums(sums={POSTERIOR_MODULE: 300 * p1 + 100 * p2, SUPPORT_MODULE: 400 * sup},
                      weights={POSTERIOR_MODULE: 400.0, SUPPORT_MODULE: 400.0},
                      counts={POSTERIOR_MODULE: 2, SUPPORT_MODULE: 2}, contributors=("a", "b"))
    out = strat.apply(state, sums)
    np.testing.assert_allclose(out[POSTERIOR_MODULE][:2], [0.75, 0.25])
    assert out[PRIOR_MODULE][0] > out[PRIOR_MODULE][1] > out[PRIOR_MODULE][5]
    (kind, payload), = strat.audit_records(0)
    assert kind == "rules" and check_payload("rules", payload) is None
    assert payload["heads"][0]["rules"][0]["rule"] == str(space.rule(0, 0))


def test_strategy_refuses_an_edited_rule_space(tmp_path):
    space, _ = _strategy(tmp_path)
    sha = write_rule_space(space, tmp_path / "space.json")
    (tmp_path / "space.json").write_text('{"heads": ["shock"], "bodies": [["map_low"]]}')
    with pytest.raises(Exception, match="does not match rule_space_sha256"):
        create_strategy("fednsl_rules", rule_space=str(tmp_path / "space.json"), rule_space_sha256=sha)


def _hospitals(space: RuleSpace, *, n: int = 120, seed: int = 0):
    out, tests = {}, {}
    for i, name in enumerate(("north", "south", "east")):
        rng = np.random.default_rng(seed + i)
        y = (rng.random(n) < 0.4).astype(int)
        x = rng.random((n, len(PREDS))) * 0.2
        x[:, 0] = np.where(y == 1, 0.9, 0.1)  # lactate_high marks the head everywhere
        out[name] = HospitalRules(space=space, graph=_graph(x), labels={"shock": y}, train=np.arange(80),
                                  settings=EStepSettings(draws=40, scorer=ScorerSettings(steps=40)))
        tests[name] = np.arange(80, n)
    return out, tests


def test_masked_federation_sums_posteriors_and_publishes_a_verifiable_rules_artefact(tmp_path):
    space = RuleSpace.enumerate(heads=("shock",), predicates=PREDS, max_len=2)
    hospitals, tests = _hospitals(space)
    sid = Identity.generate("server")
    audit = AuditTrail(tmp_path / "audit", identity=sid)
    gen = RuleGenerator(space, preset=GeneratorPreset(epochs=5, samples_per_head=128))
    res = run_rules_federation(hospitals=hospitals, tests=tests, space=space, audit=audit, server_identity=sid,
                               federation=FederationSection(id="fednsl-test", rounds=2, secure_mode="masked"),
                               dictionary_hash="0" * 64, workdir=tmp_path, generator=gen)
    audit.close()
    assert len(res.priors) == 3
    # every hospital holds the same new prior, read from the signed global model
    priors = [t.prior() for t in res.tasks.values()]
    assert all(np.allclose(p, priors[0]) for p in priors)
    # the server's mixture is the weighted mean of the hospitals' posteriors (masked: only the sum)
    mixture = res.server.state[POSTERIOR_MODULE]
    assert mixture.sum() == pytest.approx(1.0, abs=1e-3)
    assert verify_audit_dir(tmp_path / "audit").ok
    html = render_report(tmp_path / "audit", out=tmp_path / "report.html").read_text()
    assert 'id="rules"' in html and "→ shock" in html and "Top rules for shock" in html
    assert all(t.evaluate("test")["acc_shock"] > 0.8 for t in res.tasks.values())


def test_ckks_is_refused(tmp_path):
    space = RuleSpace.enumerate(heads=("shock",), predicates=PREDS, max_len=1)
    hospitals, tests = _hospitals(space)
    sid = Identity.generate("server")
    with pytest.raises(ConfigError, match="masked"):
        run_rules_federation(hospitals=hospitals, tests=tests, space=space, audit=None, server_identity=sid,
                             federation=FederationSection(id="x", rounds=1, secure_mode="ckks"),
                             dictionary_hash="0" * 64, workdir=tmp_path, generator=None)


def test_insecure_per_hospital_posteriors_warns_and_is_refused_in_production(tmp_path):
    space = RuleSpace.enumerate(heads=("shock",), predicates=PREDS, max_len=1)
    hospitals, tests = _hospitals(space)
    with pytest.warns(InsecureOptionWarning, match="insecure_per_hospital_posteriors"):
        res = insecure_per_hospital_posteriors(hospitals=hospitals, tests=tests, space=space, rounds=1, seed=0,
                                               environment="development", generator=None)
    assert len(res.priors) == 2 and res.server is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(SecurityPolicyError, match="production"):
            insecure_per_hospital_posteriors(hospitals=hospitals, tests=tests, space=space, rounds=1, seed=0,
                                             environment="production", generator=None)
