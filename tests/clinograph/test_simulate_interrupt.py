"""`clinograph simulate` stopped with Ctrl-C: exit 130, no traceback, and what was written in words."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]


def test_ctrl_c_says_the_operator_interrupted_and_whether_the_audit_verifies(tmp_path, monkeypatch):
    import clinograph.sdk.federation.simulate as sim

    from clinograph.cli import app

    real = sim.simulate_from_config

    def interrupted_at_the_first_closed_round(config, *, on_round=None, on_event=None):
        def event(kind, data):
            on_event(kind, data)
            if kind == "round_closed":
                signal.raise_signal(signal.SIGINT)  # the operator's Ctrl-C, delivered to this process

        return real(config, on_round=on_round, on_event=event)

    monkeypatch.setattr(sim, "simulate_from_config", interrupted_at_the_first_closed_round)
    data = ROOT / "examples" / "data"
    cfg = tmp_path / "sim.toml"
    cfg.write_text(f'output = "out"\ndictionary = "{data / "dictionary.toml"}"\n'
                   '[federation]\nrounds = 3\n[simulation]\nworkers = 1\n'
                   + "".join(f'[[hospitals]]\nsite = "{s}"\ntable = "{data / (s + ".csv")}"\n'
                             f'schema = "{data / (s + "_schema.toml")}"\n' for s in ("north", "south")))
    # Python's own SIGINT handler, as in a terminal (a pytest-xdist worker ignores SIGINT)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        r = CliRunner().invoke(app, ["simulate", str(cfg)])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert r.exit_code == 130, r.output
    assert "Traceback" not in r.output and "KeyboardInterrupt" not in r.output
    assert "interrupted by the operator (Ctrl-C)" in r.output
    assert f"The audit directory {tmp_path / 'out' / 'audit'} is closed and verifies" in r.output
    assert "its last run ended failed after 1 of 3 training round(s): interrupted by the operator" in r.output
    ended = [json.loads(x)["payload"] for x in (tmp_path / "out" / "audit" / "audit.jsonl").read_text().splitlines()
             if json.loads(x)["kind"] == "run_ended"]
    assert ended[-1]["status"] == "failed" and ended[-1]["reason"].startswith("interrupted by the operator")
