"""FedNSLRules under the crash journal: the pooled M-step counts survive a restart exactly."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import numpy as np
import pytest
from clinograph.secure.aggregation.base import ModuleSums
from clinograph.secure.runtime.resume import check_journalable
from clinograph.secure.strategies.rules import (
    POSTERIOR_MODULE,
    PRIOR_MODULE,
    SUPPORT_MODULE,
    FedNSLRules,
)

from clinograph.core.errors import ConfigError

HEADS, BODIES = ["shunt"], [["a_high"], ["b_low"], ["a_high", "b_low"]]


def _strategy(tmp_path, seed: int = 3) -> FedNSLRules:
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"heads": HEADS, "bodies": BODIES}))
    return FedNSLRules(str(path), hashlib.sha256(path.read_bytes()).hexdigest(), seed=seed)


def _round(strategy: FedNSLRules, round_: int, posterior: list[float]) -> np.ndarray:
    state = {PRIOR_MODULE: np.full(3, 1 / 3), POSTERIOR_MODULE: np.zeros(3), SUPPORT_MODULE: np.zeros(6)}
    sums = ModuleSums(sums={POSTERIOR_MODULE: 2.0 * np.array(posterior), SUPPORT_MODULE: np.full(6, 0.2)},
                      weights={POSTERIOR_MODULE: 2.0, SUPPORT_MODULE: 2.0},
                      counts={POSTERIOR_MODULE: 2, SUPPORT_MODULE: 2}, contributors=("h1", "h2"))
    strategy.observe(round_=round_, metrics={})
    return strategy.apply(state, sums)[PRIOR_MODULE]


def test_restored_strategy_continues_exactly_like_the_uninterrupted_one(tmp_path):
    straight = _strategy(tmp_path)
    _round(straight, 1, [0.6, 0.3, 0.1])
    saved = json.loads(json.dumps(straight.state_dict()))  # what the journal stores
    expected = _round(straight, 2, [0.2, 0.2, 0.6])
    restarted = _strategy(tmp_path)
    restarted.load_state_dict(saved)
    assert np.array_equal(_round(restarted, 2, [0.2, 0.2, 0.6]), expected)
    fresh = _strategy(tmp_path)  # without the journal the pooled counts of round 1 are lost
    assert not np.allclose(_round(fresh, 2, [0.2, 0.2, 0.6]), expected)


def test_a_state_of_another_rule_space_or_shape_is_refused(tmp_path):
    s = _strategy(tmp_path)
    good = s.state_dict()
    for bad in ({**good, "rule_space_sha256": "0" * 64}, {**good, "counts": [[1.0, 2.0]]},
                {**good, "counts": [[1.0, -1.0, 0.0]]}):
        with pytest.raises(ConfigError, match="not for this rule space"):
            s.load_state_dict(bad)


def test_an_attached_generator_cannot_be_journalled(tmp_path):
    s = _strategy(tmp_path)
    s.attach_m_step(lambda mixture, seed: mixture, generator="transformer")
    with pytest.raises(ConfigError, match="cannot be journalled"):
        s.state_dict()
    with pytest.raises(ConfigError, match="cannot be journalled"):  # refused before round 1, not at a boundary
        check_journalable(SimpleNamespace(strategy=s))
    check_journalable(SimpleNamespace(strategy=_strategy(tmp_path)))  # the built-in M-step is journalled
