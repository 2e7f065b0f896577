"""`clinograph bench NAME`: runs a study script of a source checkout's research/ (not in the wheel)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from typer.testing import CliRunner

from clinograph.cli import app

RESEARCH = Path(__file__).resolve().parents[2] / "research"


def _bench(*args):
    return CliRunner().invoke(app, ["bench", *map(str, args)])


def test_bench_outside_a_checkout_says_where_the_studies_are(tmp_path):
    res = _bench("spine_rounds", "--dir", tmp_path / "research")
    assert res.exit_code != 0
    assert "does not exist" in res.output and "ships with the source repository, not the wheel" in res.output


def test_bench_lists_the_study_scripts_on_an_unknown_name():
    res = _bench("spine_round", "--dir", RESEARCH)
    assert res.exit_code != 0
    assert "Unknown study script 'spine_round'" in res.output and "runtime_speed/spine_rounds" in res.output
    assert "fcm_bnlearn/fcm_federation" not in res.output  # a shared module, not a script


def test_bench_runs_a_study_script_with_quick_and_out(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # bench sets the script's argv
    out = tmp_path / "candidate_sets.json"
    res = _bench("real_tables/candidate_sets", "--quick", "--out", out, "--dir", RESEARCH)
    assert res.exit_code == 0, res.output
    written = json.loads(out.read_text())
    assert set(written["cohorts"]) == {"gbsg2", "lung", "kidney", "diabetes"}
    assert written["machine"]["cpus"] >= 1 and len(written["machine"]["load_average_at_end"]) == 3
