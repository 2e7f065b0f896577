"""The server checks each hospital's privacy ledger across rounds (secure/dp_checks.py).

Before: cumulative ε going 6.0 -> 0.2, ε rising with zero steps, a declared budget above the
policy maximum and an ε below what the declared (σ, q, steps) imply were all accepted.
"""

from __future__ import annotations

import numpy as np
import pytest
from clinograph.secure.audit import verify_audit_dir
from clinograph.secure.dp_checks import ORDERS, epsilon_from_rdp, rdp_per_step
from clinograph.secure.messages import ClientReport, DPPolicy, LedgerEntry
from clinograph.secure.runtime import run_round
from hostile_helpers import audit_entries, federation

POLICY = DPPolicy(required=True, max_epsilon=10.0, delta=1e-5, min_noise_multiplier=0.5, max_clip_norm=1.0)
Q, SIGMA, STEPS = 0.02, 1.1, 50


@pytest.mark.parametrize(("q", "sigma", "steps"), [(0.01, 1.0, 100), (0.02, 1.1, 50), (0.1, 0.7, 7),
                                                   (0.005, 2.5, 2000), (1.0, 3.0, 3)])
def test_rdp_bound_matches_opacus(q, sigma, steps):
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = [(sigma, q, steps)]
    ours = epsilon_from_rdp(steps * np.asarray(rdp_per_step(q=q, sigma=sigma)), delta=1e-5)
    assert ours == pytest.approx(acc.get_epsilon(delta=1e-5), rel=1e-9)
    assert len(ORDERS) == len(RDPAccountant.DEFAULT_ALPHAS)


def honest_epsilon(rounds: int) -> float:
    return epsilon_from_rdp(rounds * STEPS * np.asarray(rdp_per_step(q=Q, sigma=SIGMA)), delta=1e-5)


def ledger_report(script=None):
    """Report function: an honest ledger (STEPS steps at (σ, q) every round) unless ``script``
    overrides fields for a round."""
    def make(h, p):
        fields = {"round": p.round, "noise_multiplier": SIGMA, "sample_rate": Q, "steps": STEPS, "clip_norm": 1.0,
                  "accountant": "rdp", "epsilon": honest_epsilon(p.round + 1), "delta": 1e-5, "budget_epsilon": 8.0}
        fields.update((script or {}).get(p.round, {}))
        return ClientReport(federation_id=p.federation_id, round=p.round, client=h.name,
                            dictionary_hash=p.dictionary_hash, ledger=LedgerEntry(**fields))
    return make


def run(tmp_path, script, rounds):
    hospitals = {c: {"report": ledger_report(script if c == "h3" else None)} for c in ("h0", "h1", "h2", "h3")}
    server, transport, _ = federation(tmp_path, dp_policy=POLICY, hospitals=hospitals)
    outcomes = [run_round(server, transport) for _ in range(rounds)]
    assert verify_audit_dir(tmp_path / "audit").ok
    return outcomes


def test_honest_ledgers_are_accepted_round_after_round(tmp_path):
    outcomes = run(tmp_path, None, 3)
    assert all(o.result.contributors == ("h0", "h1", "h2", "h3") for o in outcomes)


CASES = {
    "epsilon_decreases": ({0: {"epsilon": 6.0}, 1: {"epsilon": 0.2}}, 1, "went down from 6 to 0.2"),
    "epsilon_rises_without_steps": ({1: {"steps": 0, "epsilon": 3.0}}, 1, "with zero steps"),
    "budget_above_policy": ({0: {"budget_epsilon": 50.0}}, 0, "budget ε = 50 exceeds the federation's maximum 10"),
    "epsilon_below_rdp_bound": ({0: {"epsilon": 0.01}}, 0, "below .* the RDP bound"),
    "epsilon_above_own_budget": ({0: {"epsilon": 9.0, "budget_epsilon": 8.0}}, 0, "exceeds the hospital's own"),
    "delta_changes": ({1: {"delta": 1e-6}}, 1, "δ changed"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_inconsistent_ledger_is_refused_and_audited(tmp_path, case):
    script, bad_round, match = CASES[case]
    outcomes = run(tmp_path, script, bad_round + 1)
    bad = outcomes[bad_round].result
    assert bad.contributors == ("h0", "h1", "h2") and "h3" in bad.rejected
    rejected = [e["payload"] for e in audit_entries(tmp_path) if e["kind"] == "update_rejected"]
    assert [(r["client"], r["round"]) for r in rejected] == [("h3", bad_round)]
    import re
    assert re.search(match, rejected[0]["reason"]), rejected[0]["reason"]


def test_a_ledger_kept_with_an_unchecked_accountant_is_refused_unless_named():
    """Before: a hospital declaring accountant 'prv' (or any name but 'rdp') skipped the RDP floor,
    so any small ε passed. Now refused unless the policy names insecure_unchecked_prv."""
    from clinograph.secure.dp_checks import check_ledger

    entry = LedgerEntry(round=0, noise_multiplier=SIGMA, sample_rate=Q, steps=STEPS, clip_norm=1.0, accountant="prv",
                        epsilon=0.001, delta=1e-5, budget_epsilon=10.0)
    problems, _ = check_ledger(entry, previous=None, policy=POLICY)
    assert any("accountant 'prv'" in p for p in problems)
    problems, _ = check_ledger(entry.model_copy(update={"accountant": "made-up"}), previous=None, policy=POLICY)
    assert any("accountant 'made-up'" in p for p in problems)
    lenient = POLICY.model_copy(update={"insecure_unchecked_prv": True})
    assert check_ledger(entry, previous=None, policy=lenient)[0] == []


def test_the_unchecked_prv_policy_warns_when_the_server_is_built(tmp_path):
    from clinograph.secure.policy import InsecureOptionWarning
    from clinograph.secure.runtime.config import DPPolicySection

    policy = DPPolicySection(insecure_unchecked_prv=True).policy()
    assert policy.insecure_unchecked_prv
    with pytest.warns(InsecureOptionWarning, match="insecure_unchecked_prv"):
        federation(tmp_path, dp_policy=policy, hospitals={c: {} for c in ("h0", "h1")})


@pytest.mark.parametrize(("mode", "policy", "option"), [
    ("masked", POLICY.model_copy(update={"insecure_unchecked_prv": True}), "insecure_unchecked_prv"),
    ("insecure_plaintext", None, "insecure_plaintext"),
])
def test_an_insecure_option_is_refused_in_production(tmp_path, mode, policy, option):
    """secure/policy.py: every insecure_* option is refused with environment = "production". The
    plaintext mode was; [dp_policy] insecure_unchecked_prv = true was accepted (warned only)."""
    from clinograph.core.errors import SecurityPolicyError

    with pytest.raises(SecurityPolicyError, match=option):
        federation(tmp_path, mode=mode, dp_policy=policy, environment="production",
                   hospitals={c: {} for c in ("h0", "h1")})


def test_the_unchecked_prv_policy_is_marked_in_the_manifest(tmp_path):
    lenient = POLICY.model_copy(update={"insecure_unchecked_prv": True})
    federation(tmp_path, dp_policy=lenient, hospitals={c: {} for c in ("h0", "h1")})
    manifest = next(e for e in audit_entries(tmp_path) if e["kind"] == "manifest")["payload"]
    assert "insecure_unchecked_prv" in manifest["insecure_options"]
    assert manifest["dp_policy"]["insecure_unchecked_prv"] is True
