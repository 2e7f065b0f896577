"""Early elimination of candidates in a federation run (secure/runtime/elimination.py, run.py):
the default successive halving trains at most 2× one model's rounds, audits every cut, keeps the
eliminated candidates' rounds in their own (paused) runs, and the choice is ``choose`` among the
survivors."""

import json
import re

from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.simulate import simulate
from clinograph.sdk.model.load import load_exported
from clinograph.secure.audit import render_report, verify_audit_dir
from clinograph.secure.runtime.run import choose
from sdk_helpers import small_tables

ROUNDS = 12
CANDIDATES = [{"name": "frozen", "training": {"lr": 1e-7}}, {"name": "a"},
              {"name": "b", "training": {"lr": 0.01}}, {"name": "c", "model": {"linear_shape": True}}]


def cfg(elimination, **extra):
    return SimulationConfig.model_validate({**extra,
        "federation": {"rounds": ROUNDS, "secure_mode": "masked", "min_clients": 2, "local_epochs": 1},
        "model": {"hidden": 8}, "graph": {"k_similar": 0}, "training": {"lr": 0.03, "batch_size": 32},
        # patience 0: no early stop, so every candidate uses its whole budget (the bound is then exact)
        "selection": {"patience": 0, "candidates": CANDIDATES, **({} if elimination is None else
                                                                  {"elimination": elimination})}})


def entries(audit):
    return [json.loads(x) for x in (audit / "audit.jsonl").read_text().splitlines()]


def training_rounds(es):
    """Training rounds that aggregated, over every candidate's runs (scoring rounds not counted)."""
    return sum(1 for e in es if e["kind"] == "round_plan") - sum(1 for e in es if e["kind"] == "model_selected")


def test_the_default_halves_the_candidates_within_twice_one_model_audited(tmp_path):
    tables = small_tables()
    res = simulate(tables, tables[0].dictionary, cfg(None, output=str(tmp_path / "out")), audit_dir=tmp_path / "audit")
    es = entries(tmp_path / "audit")
    kinds = [e["kind"] for e in es]
    cuts = [e["payload"] for e in es if e["kind"] == "candidates_eliminated"]
    # 4 candidates of 12 rounds: 4 train 3 rounds, the best 2 go on to 6, the best 1 to 12 (4·3 + 2·3 + 1·6 = 24)
    assert [(c["rung"], c["rounds"], len(c["kept"])) for c in cuts] == [(0, 3, 2), (1, 6, 1)]
    assert cuts[0]["schedule"] == [[3, 2], [6, 1], [12, 1]] and cuts[0]["cost"] == 24 and cuts[0]["eta"] == 2
    assert [c["name"] for c in cuts[0]["candidates"]] == ["frozen", "a", "b", "c"]
    assert [c["name"] for c in cuts[1]["candidates"]] == cuts[0]["kept"]
    for cut in cuts:  # each cut is the choice's rule on the losses it lists
        losses = [c["validation_loss"] for c in cut["candidates"]]
        best = cut["candidates"][choose(losses, min_delta=cut["min_delta"])]["name"]
        assert best in cut["kept"] and set(cut["kept"]) | set(cut["eliminated"]) == {c["name"] for c in cut["candidates"]}
    assert training_rounds(es) == 24 <= 2 * ROUNDS
    assert kinds.count("run_paused") == 4 + 2  # every rung but the last ends in a pause; 3 eliminated stay paused
    assert kinds.count("run_resumed") == 2 + 1
    assert kinds.count("run_ended") == 1 and kinds.count("model_selected") == 1  # the one run that went the distance
    # the choice: choose among the survivors of the last cut; model_chosen lists every candidate with its rounds
    chosen = [e["payload"] for e in es if e["kind"] == "model_chosen"][0]
    rows = {r["name"]: r for r in chosen["candidates"]}
    survivors = cuts[-1]["kept"]
    assert chosen["chosen"] == survivors[choose([rows[n]["validation_loss"] for n in survivors], min_delta=1e-4)]
    assert res.choice["chosen"] == chosen["chosen"]
    assert sum(r["rounds_run"] for r in rows.values()) == 24
    assert {n: r.get("eliminated_after_rung") for n, r in rows.items() if n not in survivors} == {
        **{n: 0 for n in cuts[0]["eliminated"]}, **{n: 1 for n in cuts[1]["eliminated"]}}
    assert "frozen" in cuts[0]["eliminated"]  # it barely moves from the initial model
    assert rows[chosen["chosen"]]["rounds_run"] == ROUNDS
    assert res.selection["validation_loss"] == rows[chosen["chosen"]]["validation_loss"]
    assert set(res.metrics_by_candidate) == {chosen["chosen"]}  # the eliminated kept no model to score
    verdict = verify_audit_dir(tmp_path / "audit")
    assert verdict.ok, verdict.problems
    # each hospital's export of the chosen model passes the release check, although its run was paused
    # and resumed across the other candidates' runs (sdk/model/release.py follows its own federation)
    for name, member in res.hospitals.items():
        client = member.client
        loaded = load_exported(client.model_path, trusted=client.identity.public, audit_dir=tmp_path / "audit",
                               server=client.server)
        assert loaded.description.release.round == loaded.released_round, name
    html = render_report(tmp_path / "audit", out=tmp_path / "report.html").read_text()
    assert "Early elimination, rung 0" in html and "Early elimination, rung 1" in html
    # the report links each of the 3 resumed runs to the run that paused it
    assert len(set(re.findall(r"Resumes run (\d+), paused by early elimination", html))) == 3


def test_without_elimination_every_candidate_trains_the_whole_run(tmp_path):
    tables = small_tables()
    res = simulate(tables, tables[0].dictionary, cfg("none"), audit_dir=tmp_path / "audit")
    es = entries(tmp_path / "audit")
    kinds = [e["kind"] for e in es]
    assert "candidates_eliminated" not in kinds and "run_paused" not in kinds
    assert training_rounds(es) == 4 * ROUNDS and kinds.count("run_ended") == 4
    assert res.choice["chosen"] == res.choice["candidates"][
        choose([r["validation_loss"] for r in res.choice["candidates"]], min_delta=1e-4)]["name"]
