"""The hospital's privacy ledger file cannot be edited into admitting a round past the budget.

Before: ε values were read back from a cache in privacy_ledger.json, so changing one number
admitted a round whose true ε was far past the budget; nothing detected edits to the history;
two processes committing to one state dir silently lost steps.
"""

from __future__ import annotations

import json

import pytest
from clinograph.sdk.privacy import PrivacyLedger
from clinograph.secure.errors import PrivacyBudgetExceeded, PrivacyError
from clinograph.secure.identity import Identity

DELTA = 1e-5
SIGMA, Q = 0.6, 0.05
SIGNER = Identity.generate("alpha")


def _ledger(path, **kw) -> PrivacyLedger:
    return PrivacyLedger(path, site="alpha", budget_epsilon=10.0, delta=DELTA, **kw)


def _spend(ledger: PrivacyLedger, steps: int, round_: int = 0):
    history = [*ledger.history, (SIGMA, Q, steps)]
    return ledger.commit(round_=round_, history=history, noise_multiplier=SIGMA, sample_rate=Q, clip_norm=1.0)


def test_an_edited_epsilon_number_is_not_trusted(tmp_path):
    ledger = _ledger(tmp_path)
    _spend(ledger, 300)
    planned = 400
    true = ledger.project(noise_multiplier=SIGMA, sample_rate=Q, steps=planned)
    assert true > 10.0  # the round must be refused
    # The attacker writes a small ε under the exact key the next check looks up.
    state = json.loads(ledger.path.read_text())
    hist = [[repr(s), repr(q), t] for s, q, t in [(SIGMA, Q, 300 + planned)]]
    state["epsilon_cache"] = {json.dumps(["rdp", repr(DELTA), hist]): 1.0}
    ledger.path.write_text(json.dumps(state))
    with pytest.raises(PrivacyBudgetExceeded, match=f"to {true:.3f}"):
        _ledger(tmp_path).check_round(round_=1, noise_multiplier=SIGMA, sample_rate=Q, steps=planned)


def test_a_signed_ledger_detects_an_edited_history(tmp_path):
    ledger = _ledger(tmp_path, signer=SIGNER)
    _spend(ledger, 300)
    assert _ledger(tmp_path, signer=SIGNER).history == [(SIGMA, Q, 300)]  # round trip verifies
    state = json.loads(ledger.path.read_text())
    state["history"] = [[SIGMA, Q, 3]]  # 297 steps "forgotten"
    ledger.path.write_text(json.dumps(state))
    with pytest.raises(PrivacyError, match=r"privacy_ledger\.json was modified outside Clinograph .*invalid.*"
                                           r"restore the file from backup"):
        _ledger(tmp_path, signer=SIGNER)


def test_a_signed_ledger_refuses_a_stripped_signature(tmp_path):
    _spend(_ledger(tmp_path, signer=SIGNER), 10)
    state = json.loads((tmp_path / "privacy_ledger.json").read_text())
    del state["signature"]
    (tmp_path / "privacy_ledger.json").write_text(json.dumps(state))
    with pytest.raises(PrivacyError, match="signature by hospital 'alpha' is missing"):
        _ledger(tmp_path, signer=SIGNER)


def test_another_hospitals_key_does_not_verify(tmp_path):
    _spend(_ledger(tmp_path, signer=SIGNER), 10)
    with pytest.raises(PrivacyError, match="invalid"):
        _ledger(tmp_path, signer=Identity.generate("alpha"))


def test_a_second_writer_cannot_overwrite_steps_it_did_not_see(tmp_path):
    a, b = _ledger(tmp_path), _ledger(tmp_path)  # two processes on one state dir
    _spend(a, 100)
    with pytest.raises(PrivacyError, match="changed since this process loaded it"):
        _spend(b, 50)
    assert _ledger(tmp_path).history == [(SIGMA, Q, 100)]
