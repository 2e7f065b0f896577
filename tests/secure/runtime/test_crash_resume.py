"""A server SIGKILLed at every stage boundary resumes from its journal to the uninterrupted model.

Each run is a real child process (``crash_harness.run_in_child``) that kills itself with SIGKILL right
after the named journal boundary (the harness's explicit ``--kill`` hook); the next run resumes
from the journal, the audit trail and the hospitals' state directories in the same folder.
Masked mode is exact, so the final model must equal an uninterrupted run's bit for bit; CKKS
within its precision. The audit chain must verify (``clinograph audit verify``), each
interrupted round be aborted once with reason ``server restart`` and never aggregated, and
every hospital's DP ledger hold exactly the rounds it trained for (aborted ones included).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import crash_harness  # noqa: E402

MASKED_KILLS = ("open", "plan", "stage 1", "stage 2", "stage 3", "stage 4", "close", "end")


def _run(work: Path, *args: str) -> int:
    """One harness run in a child process (:func:`crash_harness.run_in_child`); its exit code."""
    return crash_harness.run_in_child(work, *args)


def _entries(work: Path) -> list[dict]:
    return [json.loads(x) for x in (work / "audit" / "audit.jsonl").read_text().splitlines() if x.strip()]


def _verify(work: Path) -> None:
    cli = Path(sys.executable).parent / "clinograph"
    out = subprocess.run([str(cli), "audit", "verify", str(work / "audit")], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def _check_run(work: Path, *, aborted: int, rounds: int) -> dict:
    result = json.loads((work / "result.json").read_text())
    entries = _entries(work)
    aborts = [e["payload"] for e in entries if e["kind"] == "round_aborted"]
    assert len(aborts) == aborted and all(a["reason"].startswith("server restart") for a in aborts)
    aggregated = [e["payload"]["round"] for e in entries if e["kind"] == "aggregate"]
    assert len(aggregated) == rounds and len(set(aggregated)) == rounds  # no round counted twice
    assert not {a["round"] for a in aborts} & set(aggregated)
    assert result["history"] == aggregated and result["hospital_globals_equal"]
    for name, trained in result["ledger_rounds"].items():
        accepted = [e["payload"]["round"] for e in entries
                    if e["kind"] == "update_accepted" and e["payload"]["client"] == name]
        assert trained == accepted == sorted(set(accepted))  # each trained round once, none lost
        assert result["ledger_steps"][name] == len(trained)
        assert result["server_ledger_rounds"][name] == trained[-1]  # the server's view survived the crashes
    return result


@pytest.mark.slow
def test_masked_run_killed_at_every_stage_boundary_ends_with_the_uninterrupted_model(tmp_path):
    assert _run(tmp_path / "ref", "--rounds", "2") == 0
    reference = json.loads((tmp_path / "ref" / "result.json").read_text())
    work = tmp_path / "crash"
    for stage in MASKED_KILLS:
        assert _run(work, "--rounds", "2", "--kill", stage) == -signal.SIGKILL, stage
    assert _run(work, "--rounds", "2") == 0
    result = _check_run(work, aborted=6, rounds=2)  # open, plan and the four masked stages interrupted a round
    assert result["global"] == reference["global"]  # exact, bit for bit
    kinds = [e["kind"] for e in _entries(work)]
    assert kinds.count("audit_reopen") == len(MASKED_KILLS) and kinds[-1] == "run_ended"
    _verify(work)


@pytest.mark.slow
def test_ckks_run_killed_mid_round_ends_within_precision(tmp_path):
    assert _run(tmp_path / "ref", "--rounds", "2", "--mode", "ckks") == 0
    reference = json.loads((tmp_path / "ref" / "result.json").read_text())
    work = tmp_path / "crash"
    assert _run(work, "--rounds", "2", "--mode", "ckks", "--kill", "stage 1") == -signal.SIGKILL
    assert _run(work, "--rounds", "2", "--mode", "ckks") == 0
    result = _check_run(work, aborted=1, rounds=2)

    def values(r: dict) -> np.ndarray:
        return np.array([float.fromhex(x) for v in r["global"].values() for x in v])

    np.testing.assert_allclose(values(result), values(reference), rtol=0, atol=1e-6)
    _verify(work)


@pytest.mark.slow
def test_a_run_resumed_after_it_ended_is_refused(tmp_path):
    from clinograph.core.errors import ConfigError

    assert _run(tmp_path, "--rounds", "1") == 0
    with pytest.raises(ConfigError, match="run has ended"):
        crash_harness.main([str(tmp_path), "--rounds", "1"])


@pytest.mark.slow
def test_ckks_threshold_run_killed_at_decryption_resumes_with_a_new_collective_key(tmp_path):
    """Killed after the reveal stage (stages: commit, reveal, decrypt; before the holders'
    decryption shares): the restart runs
    key generation again (no share survives a process: they refuse to pickle) and redoes the round."""
    assert _run(tmp_path / "ref", "--rounds", "2", "--mode", "ckks_threshold") == 0
    reference = json.loads((tmp_path / "ref" / "result.json").read_text())
    work = tmp_path / "crash"
    assert _run(work, "--rounds", "2", "--mode", "ckks_threshold", "--kill", "stage 2") == -signal.SIGKILL
    assert _run(work, "--rounds", "2", "--mode", "ckks_threshold") == 0
    result = _check_run(work, aborted=1, rounds=2)
    assert sum(e["kind"] == "tckks_key_holders" for e in _entries(work)) == 2  # one key generation per start

    def values(r: dict) -> np.ndarray:
        return np.array([float.fromhex(x) for v in r["global"].values() for x in v])

    np.testing.assert_allclose(values(result), values(reference), rtol=0, atol=1e-6)
    _verify(work)
