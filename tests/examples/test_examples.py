"""Every examples/*.py runs (as an integrator would run it) and says what it should."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def run(script, *args, timeout=600):
    out = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout,
                         cwd=ROOT, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_every_example_has_a_test_here():
    assert {p.name for p in EXAMPLES} == {"map_and_join.py", "simulate_from_toml.py", "write_a_task.py"}


@pytest.mark.slow  # the example's federation in a subprocess
def test_map_and_join():
    out = run(ROOT / "examples" / "map_and_join.py", "--rounds", "2")
    assert "the broken export is refused" in out and "Column 'Sodium' is not in the feature dictionary" in out
    assert "round 1: mine AUROC" in out and "st_anne AUROC" in out and "riverside AUROC" in out
    assert "audit verifies: True" in out


@pytest.mark.slow  # the example's federation in a subprocess
@pytest.mark.parametrize("rounds", [2])
def test_simulate_from_toml(tmp_path, rounds):
    out = run(ROOT / "examples" / "simulate_from_toml.py", "--rounds", str(rounds), "--out", str(tmp_path / "sim"))
    assert "round 1: east AUROC" in out
    assert "verified" in out


def test_map_and_join_fits_on_one_screen():
    assert len((ROOT / "examples" / "map_and_join.py").read_text().splitlines()) <= 40


@pytest.mark.slow  # the example's federation in a subprocess
def test_write_a_task(tmp_path):
    out = run(ROOT / "examples" / "write_a_task.py", "--rounds", "2", "--out", str(tmp_path / "logistic"))
    assert "round 1: east AUROC" in out
    assert "task 'logistic', secure mode masked: audit verified" in out
    entries = (tmp_path / "logistic" / "audit" / "audit.jsonl").read_text()
    assert '"logistic/weights"' in entries  # the aggregate's module coverage names the task's own modules
