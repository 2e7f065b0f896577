"""A simulation every hospital refuses before round 1 (here: the first round would spend more ε than
their budget) released nothing. Before, it returned the untrained model's 'final metrics' and left
<output>/audit behind, so running it again said 'already holds a run'. Its audit log holds the plan
and the hospitals' signed refusals, which the hospitals anchored in their state: it is kept, moved
aside, and the refusal says where and that the same command runs again."""

import re
from pathlib import Path

import pytest
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.simulate import simulate_from_config
from clinograph.secure.audit import verify_audit_dir

from clinograph.core.errors import ProtocolError

DATA = Path(__file__).resolve().parents[3] / "examples" / "data"


def _budget_refused_config(tmp_path: Path) -> SimulationConfig:
    return SimulationConfig.model_validate({
        "output": str(tmp_path / "out"), "dictionary": str(DATA / "dictionary.toml"),
        "federation": {"id": "refused", "rounds": 2, "local_epochs": 1}, "model": {"deep": False},
        "selection": {"candidates": []},
        "privacy": {"enabled": True, "epsilon_budget": 0.01, "noise_multiplier": 1.0, "state_dir": str(tmp_path / "s")},
        "hospitals": [{"site": s, "table": str(DATA / f"{s}.csv"), "schema": str(DATA / f"{s}_schema.toml")}
                      for s in ("north", "south")]})


def test_a_run_refused_before_round_1_keeps_its_audit_aside_and_runs_again(tmp_path):
    cfg = _budget_refused_config(tmp_path)
    refusal = (r"The run was refused before round 1: .*north: PrivacyBudgetExceeded: .*No round closed and nothing "
               r"was released\. Its audit log \(\d+ entries: the plan and the hospitals' signed refusals, "
               r"which they anchored\) is kept in (\S+); .*out/audit is free: fix the cause and run the same command "
               r"again\.")
    for attempt in (1, 2):  # the second run is refused for the same reason, not for the first one's audit
        with pytest.raises(ProtocolError, match=refusal) as err:
            simulate_from_config(cfg)
        kept = Path(re.search(refusal, str(err.value), re.S).group(1))
        assert not (tmp_path / "out" / "audit").exists() and kept.parent == tmp_path / "out"
        assert verify_audit_dir(kept).ok, attempt
    assert len(list((tmp_path / "out").glob("audit-refused-*"))) == 2


def test_simulate_called_directly_raises_the_refusal_instead_of_untrained_metrics(tmp_path):
    """``simulate()`` (what an integrator and the Flower ServerApp's studies call) returned the
    untrained model's metrics for a run every hospital refused; it raises the refusal, and leaves the
    audit log where the caller put it."""
    from clinograph.sdk.federation.simulate import load_tables, simulate

    cfg = _budget_refused_config(tmp_path)
    tables, dictionary = load_tables(cfg)
    with pytest.raises(ProtocolError, match=r"refused before round 1: .*north: PrivacyBudgetExceeded.* is kept in "
                                            r"\S+/mine; .*another audit directory"):
        simulate(tables, dictionary, cfg, audit_dir=tmp_path / "mine")
    assert verify_audit_dir(tmp_path / "mine").ok
