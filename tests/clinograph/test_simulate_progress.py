"""`clinograph simulate` shows each stage's answers and slowest hospital (the progress bar's text) and
prints each round's time and ETA."""

from __future__ import annotations

from clinograph.demo_view import simulation_progress


def test_simulate_prints_stage_progress_and_the_eta():
    now = [0.0]
    lines: list[str] = []
    shown: list[str] = []
    show = simulation_progress(3, lines.append, status=shown.append, clock=lambda: now[0])
    show("run_started", {"candidate": "wide", "index": 0, "count": 1})
    show("round_opened", {"round": 0, "participants": ["a", "b"]})
    show("stage_progress", {"round": 0, "stage": "plan", "answered": 2, "asked": 2, "missing": [],
                            "slowest": "b", "slowest_s": 2.0})
    now[0] = 20.0
    show("round_closed", {"round": 0, "contributors": ["a", "b"]})
    assert shown == ["round 0 plan: 2 of 2 hospital(s) answered; slowest b (2.0 s)"]  # the bar's live text
    assert lines == ["round 0 closed: 2 contributor(s) (round took 20 s; ETA at most 40 s for 2 round(s) left)"]


def test_with_several_candidate_models_each_line_names_the_one_that_runs():
    lines: list[str] = []
    shown: list[str] = []
    show = simulation_progress(3, lines.append, status=shown.append, clock=lambda: 0.0)
    for name in ("wide", "shape"):
        show("run_started", {"candidate": name, "index": 0, "count": 2})
        show("round_opened", {"round": 0, "participants": ["a"]})
        show("stage_progress", {"round": 0, "stage": "plan", "answered": 1, "asked": 1, "missing": [],
                                "slowest": "a", "slowest_s": 1.0})
        show("round_closed", {"round": 0, "contributors": ["a"]})
    assert [x.split(":")[0] for x in shown] == ["wide", "shape"]
    assert [x.split(": round 0 closed")[0] for x in lines] == ["wide", "shape"]


def test_a_resumed_candidate_names_itself_not_the_last_one_started():
    """Early elimination: every candidate starts, then a kept one resumes -- its rounds carry its name
    (they said "shape:" for linear's rounds 2..4, the last candidate started)."""
    lines: list[str] = []
    show = simulation_progress(4, lines.append, status=lambda line: None, clock=lambda: 0.0)
    for i, name in enumerate(("linear", "shape")):
        show("run_started", {"candidate": name, "index": i, "count": 2})
    show("run_resumed", {"candidate": "linear", "rung": 1, "next_round": 2, "rounds_completed": 2})
    show("round_opened", {"round": 2, "participants": ["a"]})
    show("round_closed", {"round": 2, "contributors": ["a"]})
    assert lines and lines[-1].startswith("linear: round 2 closed")
    show("round_closed", {"round": 4, "contributors": ["a"], "scoring": True})
    assert lines[-1].startswith("linear: round 4 closed (scoring round: the last model evaluated, no training): ")


def test_the_final_table_shows_a_survival_targets_c_index_and_a_binary_ones_auroc():
    from rich.console import Console

    from clinograph.demo_view import final_table

    def rendered(final):
        console = Console(width=120, record=True)
        console.print(final_table(final, title="t"))
        return console.export_text()

    survival = rendered({"a": {"cindex": 0.712, "auroc": float("nan"), "auprc": 0.4}})
    assert "C-index" in survival and "0.712" in survival and "n/a" in survival
    binary = rendered({"a": {"auroc": 0.8, "auprc": 0.5}})
    assert "C-index" not in binary and "0.800" in binary and "0.500" in binary and "mean" not in binary
    several = rendered({"a": {"auroc": 0.8, "auprc": 0.5}, "b": {"auroc": float("nan"), "auprc": 0.3},
                        "c": {"auroc": 0.6, "auprc": 0.1}})
    mean_row = next(line for line in several.splitlines() if "mean" in line)
    assert "0.700" in mean_row and "0.300" in mean_row  # AUROC over a and c (b's is undefined), AUPRC over all


def test_a_one_class_hospital_is_a_warning_line():
    lines: list[str] = []
    show = simulation_progress(3, lines.append, status=lambda _: None, clock=lambda: 0.0)
    show("hospital_one_class", {"site": "nord", "label": 0, "patients": 63})
    assert lines == ["warning: hospital nord: every one of its 63 patients has label 0; it cannot be evaluated alone "
                     "(AUROC n/a) and pulls the shared model towards one class. Check its label column and coding "
                     "(`clinograph check`)."]


def test_a_hospitals_missing_columns_are_a_warning_line():
    lines: list[str] = []
    show = simulation_progress(3, lines.append, status=lambda _: None, clock=lambda: 0.0)
    show("hospital_missing_columns", {"site": "inst33", "absent": [], "empty": ["meal.cal"]})
    show("hospital_missing_columns", {"site": "h2", "absent": ["ECOG"], "empty": ["a", "b"]})
    assert lines == [
        "warning: hospital inst33: mapped column(s) without a value in any row: 'meal.cal'; their features are "
        "missing for every patient there (`clinograph check` shows its table).",
        "warning: hospital h2: mapped column(s) not in its table: 'ECOG'; without a value in any row: 'a', 'b'; "
        "their features are missing for every patient there (`clinograph check` shows its table)."]


def test_a_hospitals_columns_far_from_their_reference_ranges_are_a_warning_line():
    lines: list[str] = []
    show = simulation_progress(3, lines.append, status=lambda _: None, clock=lambda: 0.0)
    show("hospital_far_from_reference", {"site": "h3", "columns": ["KPS"]})
    assert lines == ["warning: hospital h3: the values of column(s) 'KPS' look like another unit (far outside their "
                     "features' reference ranges) or like dates: `clinograph check` says why."]


def test_a_hospital_refusal_is_shown_once_with_its_reason_and_named_on_each_round_line():
    """A refusal used to show only as one contributor fewer ("2 contributor(s)"): a dq_weighted run
    lost its best hospital every round and `clinograph simulate` said nothing of it."""
    lines: list[str] = []
    show = simulation_progress(3, lines.append, status=lambda _: None, clock=lambda: 0.0)
    for r in (1, 2):
        show("refused", {"round": r, "hospital": "north", "stage": "plan", "reason": f"Round {r}: weight too high"})
        show("round_closed", {"round": r, "contributors": ["east", "south"], "refused": ["north"]})
    assert lines[0] == ("warning: round 1: hospital north refused (at plan; signed, in the audit log as "
                        "hospital_refused): Round 1: weight too high")
    assert [x.split(" (round took")[0] for x in lines[1:]] == ["round 1 closed: 2 contributor(s); refused: north",
                                                                "round 2 closed: 2 contributor(s); refused: north"]


def test_a_dropped_hospital_an_aborted_round_and_a_retired_hospital_are_shown():
    lines: list[str] = []
    show = simulation_progress(3, lines.append, status=lambda _: None, clock=lambda: 0.0)
    show("dropped", {"round": 0, "hospital": "a", "reason": "no answer at stage 2 within 30 s"})
    show("round_closed", {"round": 0, "contributors": ["b", "c"], "dropped": ["a"]})
    show("dropped", {"round": 1, "hospital": "a", "reason": "no answer at stage 2 within 30 s"})  # said once
    show("round_aborted", {"round": 1, "reason": "the masked sum did not open"})
    show("model_caught_up", {"round": 2, "hospitals": ["a"]})
    show("hospital_retired", {"round": 3, "client": "c", "reason": "its input voided rounds 1, 2"})
    assert lines[0] == "warning: round 0: hospital a dropped out of the round: no answer at stage 2 within 30 s"
    assert lines[1].split(" (round took")[0] == "round 0 closed: 2 contributor(s); dropped: a"
    assert lines[2:] == ["warning: round 1 aborted, nothing of it applied: the masked sum did not open",
                         "round 2: the current global model sent with the plan to a (missed the last round)",
                         "warning: hospital c retired from the run: its input voided rounds 1, 2"]


def test_simulate_prints_each_hospitals_epsilon_from_its_last_ledger_entry(tmp_path):
    """A DP simulation printed its AUROC table and nothing of the privacy spent."""
    import json

    from clinograph.demo_view import privacy_lines

    def ledger(client, round_, eps, share=None):
        return {"kind": "ledger", "payload": {"client": client, "round": round_, "epsilon": eps, "delta": 1e-5,
                                              "budget_epsilon": 8.0, "share": share}}

    rows = [ledger("b", 0, 1.0), ledger("a", 0, 1.5), {"kind": "aggregate", "payload": {}}, ledger("b", 1, 2.25),
            ledger("c", 1, 3.0, {"epsilon_alone": 40.5, "min_honest": 2})]
    log = tmp_path / "audit.jsonl"
    log.write_text("\n".join(json.dumps(r) for r in rows))
    assert [x.split(" (its ledger")[0] for x in privacy_lines(tmp_path)] == [
        "privacy: a: ε = 1.500 (δ = 1e-05) after round 0; budget 8.0",
        "privacy: b: ε = 2.250 (δ = 1e-05) after round 1; budget 8.0",
        "privacy: c: ε = 3.000 (δ = 1e-05) after round 1 while at least 2 hospitals add their share and survive; "
        "ε = 40.500 if the others' noise were absent (its own share alone); budget 8.0"]
    assert privacy_lines(tmp_path / "absent") == []
