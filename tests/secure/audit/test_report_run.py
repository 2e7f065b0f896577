"""report_run: model selection, the DP policy in words, links and faults from hand-written trails."""

from __future__ import annotations

import json

from clinograph.secure.audit import AuditTrail
from clinograph.secure.audit.report import render_report
from clinograph.secure.audit.report_run import dp_policy_words

from clinograph.core.identity import Identity


def test_model_selection_names_the_kept_round_and_the_chosen_candidate(tmp_path):
    d = tmp_path / "a"
    with AuditTrail(d, identity=Identity.generate("server")) as trail:
        trail.record("model_selected", {"round": 3, "validation_loss": 0.4321, "rounds_evaluated": 5, "patience": 2,
                                        "stopped_early": True, "losses": [0.6, 0.5, 0.45, 0.4321, 0.44],
                                        "disagreeing": {"hosp-b": 2}})
        trail.record("model_chosen", {"chosen": "wide", "rule": "lowest validation loss", "min_delta": 0.01,
                                      "candidates": [
                                          {"name": "base", "overrides": "{}", "validation_loss": 0.5, "round": 4,
                                           "rounds_run": 5},
                                          {"name": "wide", "overrides": json.dumps({"hidden": 64}),
                                           "validation_loss": 0.4321, "round": 3, "rounds_run": 5}]})
    html = render_report(d, out=tmp_path / "r.html").read_text()
    section = html[html.index('<section id="selection">'):]
    section = section[:section.index("</section>")]
    assert ("Kept round 3: the global model after 3 training round(s), with the lowest federated validation loss "
            "(0.4321) of the 5 models scored (the initial model and the model after each of 4 training round(s)); "
            "stopped early: no improvement for 2 round(s).") in section
    assert "hosp-b (round 2)" in section
    assert "Chosen candidate: wide. Rule: lowest validation loss (minimum improvement 0.01)." in section
    assert '<th scope="row">wide (chosen)</th><td>{&quot;hidden&quot;: 64}</td><td>0.4321</td><td>3</td>' in section


def test_no_selection_says_so(tmp_path):
    d = tmp_path / "a"
    with AuditTrail(d, identity=Identity.generate("server")):
        pass
    html = render_report(d, out=tmp_path / "r.html").read_text()
    assert 'id="selection-empty"' in html and 'id="faults-empty"' in html


def test_dp_policy_in_words():
    words = dp_policy_words({"required": True, "max_epsilon": 8.0, "delta": 1e-5, "min_noise_multiplier": 0.5,
                             "max_clip_norm": 1.0, "distributed": {"mechanism": "skellam", "noise_multiplier": 8.0,
                                                                   "sample_rate": 1.0, "min_honest": 2, "rounds": 5}})
    assert words == ("Every update must carry a privacy ledger entry within these bounds. Each hospital's cumulative "
                     "ε at most 8 at δ = 1e-05; noise multiplier σ at least 0.5; per-example clipping norm at most 1. "
                     "Distributed DP: skellam noise split across the hospitals, total noise multiplier 8, sampling "
                     "rate 1, calibrated for 5 round(s), assuming at least 2 honest hospital(s) add their share.")
    assert dp_policy_words(None).startswith("No DP policy")
    assert "{" not in words  # words, not a dict


def test_a_voided_round_and_the_hospital_it_named_are_in_the_report(tmp_path):
    """A masked federation with a hospital whose input voids rounds (secure/runtime/attribution.py):
    the faults section says the round was voided and who was named; the privacy table says the
    hospital is out of the run."""
    import sys
    from pathlib import Path

    from clinograph.secure.runtime import run_rounds

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from hostile_helpers import HOSTILE, federation

    server, transport, _ = federation(tmp_path, n=4, hospitals={"h2": HOSTILE["masked"]})
    run_rounds(server, transport, rounds=4)
    server.audit.close()
    html = render_report(tmp_path / "audit", out=tmp_path / "r.html").read_text()
    faults = html[html.index('<section id="faults">'):]
    faults = faults[:faults.index("</section>")]
    assert "voided by what went into it" in faults and "h2 was named by it and retired" in faults
    assert "out of the run: retired at round" in html and "the only hospital whose input was in every one" in html


def test_the_runs_table_names_the_scoring_round_of_a_one_round_run(tmp_path):
    """rounds = 1 with model selection: round 0 trains, round 1 only scores the last model (its signed
    plan's ``run.phase`` is ``score``). The table said ``0-1`` beside "1 of 1 planned" (an apparent off-by-one)."""
    import hashlib

    from clinograph.secure.messages import RoundPlan
    from clinograph.secure.wire import seal

    from clinograph.core.spec import ModelSpec, ModuleKind, ModuleSpec

    server = Identity.generate("server")
    spec = ModelSpec(version=1, modules=(ModuleSpec(name="gnn/w", shape=(4,), kind=ModuleKind.SHARED),))
    d = tmp_path / "a"
    with AuditTrail(d, identity=server) as trail:
        for r, phase in ((0, "train"), (1, "score")):
            plan = seal(RoundPlan(federation_id="fed", round=r, participants=("a", "b"), spec=spec,
                                  dictionary_hash="0" * 64, secure_mode="masked", strategy="fedsgd", min_clients=2,
                                  local_epochs=1, global_state_digest="0" * 64, options={"run.phase": phase}), server)
            trail.record("round_plan", {"round": r, "participants": ["a", "b"], "secure_mode": "masked",
                                        "plan_sha256": hashlib.sha256(plan).hexdigest(), "strategy": "fedsgd",
                                        "weights": {}, "spec_version": 1})
            trail.publish(f"round-{r:04d}/plan.json", plan, kind="round_plan")
        trail.record("model_selected", {"round": 1, "validation_loss": 0.46, "rounds_evaluated": 2, "patience": 5,
                                        "stopped_early": False, "losses": [0.69, 0.46]})
        trail.record("run_ended", {"status": "completed", "reason": "all 1 planned round(s) ran",
                                   "rounds_completed": 1, "rounds_planned": 1})
    html = render_report(d, out=tmp_path / "r.html").read_text()
    runs = html[html.index('<section id="runs">'):]
    assert "<td>0-1 (round 1: scoring the last model, no training)</td>" in runs[:runs.index("</section>")]
    assert ("Kept round 1: the global model after 1 training round(s), with the lowest federated validation loss "
            "(0.46) of the 2 models scored (the initial model and the model after each of 1 training round(s)); "
            "all planned rounds ran.") in html


def test_a_fifo_in_place_of_a_round_plan_artefact_is_a_finding_not_a_hang(tmp_path):
    """`clinograph audit report` on a folder whose round-plan artefact was replaced by a FIFO blocked
    for ever in open() (the verifier refuses it; the report's secure-mode section read it with
    read_bytes). Found by fuzzing audit folders through the CLI. Now: the report is written and the
    verifier's finding names the file."""
    import os
    import signal

    from clinograph.secure.messages import RoundPlan
    from clinograph.secure.wire import seal

    from clinograph.core.spec import ModelSpec, ModuleKind, ModuleSpec

    server = Identity.generate("server")
    spec = ModelSpec(version=1, modules=(ModuleSpec(name="gnn/w", shape=(4,), kind=ModuleKind.SHARED),))
    d = tmp_path / "a"
    with AuditTrail(d, identity=server) as trail:
        plan = seal(RoundPlan(federation_id="fed", round=0, participants=("a", "b"), spec=spec,
                              dictionary_hash="0" * 64, secure_mode="masked", strategy="fedsgd", min_clients=2,
                              local_epochs=1, global_state_digest="0" * 64, options={}), server)
        trail.publish("round-0000/plan.json", plan, kind="round_plan")
    (artefact,) = (d / "artefacts").iterdir()
    artefact.unlink()
    os.mkfifo(artefact)

    class Hung(Exception):  # not an OSError, which the report's reader catches
        pass

    def hung(*_):
        raise Hung("render_report blocked on the FIFO")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        html = render_report(d, out=tmp_path / "r.html").read_text()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert "not a regular file" in html
