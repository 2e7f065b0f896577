"""docs/matrix.md is what the code does: every runnable cell (task x secure mode) is run for one
round in process, and the rendered table must be the one in the docs."""

import warnings
from dataclasses import replace
from pathlib import Path

import pytest
from clinograph.sdk.federation.support import MODES, STATED, TASKS, matrix, render
from sdk_helpers import lung_survival, small_tables

pytest.importorskip("lifelines")
ROOT = Path(__file__).resolve().parents[3]


def _modality_sites():
    from clinograph.sdk.datasets import timeseries as ts
    from clinograph.sdk.ingest import ingest

    hospitals = tuple(replace(ts.MODALITY_GAP_HOSPITALS[i], n_patients=40) for i in (0, 2, 4))
    tables, signals = [], {}
    for s in ts.make_timeseries_sites(seed=2, hospitals=hospitals):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = ingest(s.table, schema=s.schema, dictionary=ts.load_dictionary())
        w, has = ts.waveform_matrix(s, t.patient_ids)
        tables.append(t)
        signals[t.site] = {"waveform": (w, has)} if has.any() else {}
    return tables, signals


@pytest.mark.slow  # every task in every secure mode
def test_the_matrix_in_the_docs_is_what_the_code_does():
    from clinograph.sdk.federation.modality_task import build_modality_task

    modality_tables, signals = _modality_sites()

    def tables_for(task):
        return {"NS-FL survival": lung_survival()[1], "NS-FL modalities": modality_tables}.get(task, small_tables())

    def factory_for(task):
        if task != "NS-FL modalities":
            return None
        return lambda t, hconf: build_modality_task(t, dictionary=t.dictionary, config=hconf, signals=signals[t.site])

    rows = matrix(tables_for, factory_for)
    assert len(rows) == (len(TASKS) + len(STATED)) * len(MODES)
    # every registered task runs in every mode, but FedNSL under ckks: its server must read the mixture it samples from
    refused = {(r["task"], r["mode"]) for r in rows if r["task"] in TASKS and r["in_process"] != "runs"}
    assert refused == {("FedNSL (rules)", "ckks")}
    fednsl_ckks = next(r for r in rows if (r["task"], r["mode"]) == ("FedNSL (rules)", "ckks"))
    assert "never sees the sum" in fednsl_ckks["in_process"] and fednsl_ckks["flower"] == fednsl_ckks["in_process"]
    doc = (ROOT / "docs" / "matrix.md").read_text()
    assert render(rows) in doc, "docs/matrix.md is stale: regenerate it (docs/matrix.md says how)"


def test_a_cell_whose_round_left_a_hospital_out_is_not_reported_as_runs(tmp_path):
    """A round that completes without one of its hospitals (refused, dropped, rejected) is not the
    configured federation running: the matrix says who was left out and why (a dq_weighted plan that
    its best hospital refused every round completed, and showed as "runs")."""
    import json

    from clinograph.sdk.federation.support import _left_out

    rows = [{"kind": "round_participation", "payload": {"round": 0, "refused": {}, "dropped": {}, "rejected": {}}},
            {"kind": "round_participation", "payload": {"round": 1, "dropped": {"east": "timed out at stage 2"},
                                                         "refused": {"north": {"stage": "plan", "reason": "weight"}},
                                                         "rejected": {}}}]
    (tmp_path / "audit.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert _left_out(tmp_path) == "east (dropped: timed out at stage 2); north (refused: weight)"
    (tmp_path / "audit.jsonl").write_text(json.dumps(rows[0]))
    assert _left_out(tmp_path) == ""
