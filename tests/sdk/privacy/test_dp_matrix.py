"""The DP matrix (issue 30; docs/privacy.md, "The DP matrix"): every task that trains with DP
against every ``[privacy]`` mode -- none, local, distributed without and with private selection.
Each cell either builds and runs one tiny round (masked, FedSGD, q = 1 under distributed DP),
with its ledger and, under distributed DP, its noise checks passed; or is refused with a
ConfigError / PrivacyError whose message states the reason. The expected outcome of each cell is
written down here, so a cell that starts or stops running fails the test until the table (and
the docs' table) is updated."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from clinograph.sdk.concepts.dp_training import concept_dp_trainer
from clinograph.sdk.concepts.encoders import MLPEncoder
from clinograph.sdk.concepts.graph import ConceptGraph
from clinograph.sdk.concepts.model import ConceptModel
from clinograph.sdk.concepts.modules import ConceptHParams
from clinograph.sdk.concepts.registration import problems
from clinograph.sdk.concepts.task import ConceptTask, ConceptTraining
from clinograph.sdk.config import HospitalConfig, PrivacySection, SimulationConfig
from clinograph.sdk.datasets import timeseries as ts
from clinograph.sdk.federation.modality_task import build_modality_task
from clinograph.sdk.federation.simulate import simulate
from clinograph.sdk.federation.split import Split
from sdk_helpers import SURVIVAL_TARGET, lung_survival, timeseries_sites

from clinograph.core.errors import ConfigError, PrivacyError
from clinograph.core.identity import Identity

TASKS = ("static", "temporal", "survival", "modalities", "concepts")
MODES = ("none", "local", "distributed", "distributed+selection")

#: the matrix: "runs", or the reason the refusal's message must state (a regular expression)
CONCEPT_NO_CHOICE = r"\[selection\] enabled = true: a concept run has no model choice to make, with or without DP"
EXPECTED = {(t, m): "runs" for t in TASKS for m in MODES} | {
    ("concepts", "distributed+selection"): CONCEPT_NO_CHOICE,
}


def _privacy(mode: str, state: Path) -> dict:
    if mode == "none":
        return {"enabled": False}
    common = {"enabled": True, "epsilon_budget": 50.0, "noise_multiplier": 1.0, "clip_norm": 1.0,
              "state_dir": str(state)}
    if mode == "local":
        return {**common, "batch_size": 16}
    return {**common, "mode": "distributed", "sample_rate": 1.0, "min_honest": 2}


def _config(task: str, mode: str, tmp_path: Path) -> SimulationConfig:
    model: dict = {"hidden": 8}
    extra: dict = {}
    if task == "temporal":
        model |= {"temporal": "attention", "temporal_window": 4}
    if task == "modalities":
        model |= {"modalities": ["waveform"]}
        extra["dictionary"] = str(ts.DICTIONARY_PATH)
    if task == "survival":
        extra["target"] = SURVIVAL_TARGET
    return SimulationConfig.model_validate({
        "federation": {"rounds": 1, "secure_mode": "masked", "local_epochs": 1, "min_clients": 2, "strategy": "fedsgd"},
        "model": model, "graph": {"k_similar": 0}, "privacy": _privacy(mode, tmp_path / "state"),
        "selection": {"enabled": mode == "distributed+selection", "candidates": []},
        "output": str(tmp_path / "out"), **extra})


@pytest.fixture(scope="module")
def ts_sites():
    return timeseries_sites((replace(ts.DEFAULT_TS_HOSPITALS[0], n_patients=30),
                      replace(ts.DEFAULT_TS_HOSPITALS[7], n_patients=26)), seed=1)


@pytest.fixture(scope="module")
def modal_sites():
    return timeseries_sites(tuple(replace(ts.MODALITY_GAP_HOSPITALS[i], n_patients=30) for i in (0, 4)), seed=2)


def _federation(task: str, tables, dictionary, ts_sites, modal_sites):
    """(tables, dictionary, task_factory) of the row's federation."""
    if task == "static":
        return list(tables), dictionary, None
    if task == "temporal":
        d, sites = ts_sites
        return [t for t, _ in sites], d, None
    if task == "survival":
        pytest.importorskip("lifelines")
        d, lung = lung_survival()
        return list(lung), d, None
    d, sites = modal_sites
    signals = {t.site: s for t, s in sites}

    def factory(table, hconf):  # the modality task needs the hospital's signals (not in its table)
        return build_modality_task(table, dictionary=d, config=hconf, signals=signals[table.site],
                                   state_dir=Path(hconf.privacy.state_dir or hconf.output) / table.site,
                                   identity=Identity.generate(table.site))

    return [t for t, _ in sites], d, factory


def _run_nsfl(task: str, mode: str, tmp_path: Path, tables, dictionary, ts_sites, modal_sites) -> None:
    cfg = _config(task, mode, tmp_path)
    tabs, d, factory = _federation(task, tables, dictionary, ts_sites, modal_sites)
    simulate(tabs, d, cfg, audit_dir=tmp_path / "audit", task_factory=factory)
    _check_audit(mode, tmp_path / "audit", hospitals=len(tabs), scoring=mode == "distributed+selection")


def _check_audit(mode: str, audit: Path, *, hospitals: int, scoring: bool) -> None:
    """The run's audit: every round ran with every hospital, each DP round accounted within the
    budget and, under distributed DP, its noise check passed (``scoring``: + the scoring round)."""
    entries = [json.loads(x) for x in (audit / "audit.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in entries]
    assert "hospital_refused" not in kinds and "update_rejected" not in kinds and "round_aborted" not in kinds
    assert "aggregate" in kinds and kinds.count("update_accepted") >= hospitals  # the round ran, all took part
    ledgers = [e["payload"] for e in entries if e["kind"] == "ledger"]
    checks = [e["payload"] for e in entries if e["kind"] == "noise_check"]
    if mode == "none":
        assert not ledgers and not checks
        return
    assert ledgers and all(0 < p["epsilon"] <= 50.0 for p in ledgers)  # every DP round accounted
    if mode.startswith("distributed"):
        rounds = 1 + scoring  # + the scoring round
        assert len(checks) == rounds and all(c["passed"] and c["contributors"] == hospitals for c in checks)
    else:
        assert not checks


def _concept_data(seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.normal(size=(30, 4)).astype(np.float32))
    a = (x[:, 0] > 0).long()
    return x, {"a": a, "y": (x[:, 1] + a > 0.5).long()}


def _concept_federation(mode: str, tmp_path: Path, split: Split) -> None:
    """Distributed DP: a voted run of two hospitals (vote, derive, one training round; masked, FedSGD)."""
    from clinograph.sdk.concepts.federation import ConceptSite, run_concept_federation
    from clinograph.secure.audit import AuditTrail
    from clinograph.secure.runtime.config import FederationSection

    sites = [ConceptSite(name=f"h{k}", inputs=x, labels=labels, split=split, nodes=("a", "y"), edges=(("a", "y"),))
             for k, (x, labels) in enumerate(map(_concept_data, (0, 1)))]
    fed = FederationSection(id="matrix-concepts", rounds=1, secure_mode="masked", strategy="fedsgd", local_epochs=1,
                            max_weight=1000.0, min_clients=2)
    server_id = Identity.generate("server")
    audit = AuditTrail(tmp_path / "audit", identity=server_id)
    try:
        run_concept_federation(sites=sites, concepts=("a", "y"), task="y", cards={"a": 2, "y": 2}, kind="c2bm",
                               encoder=lambda: MLPEncoder(4, 8, (8,)), z_dim=8, federation=fed, audit=audit,
                               server_identity=server_id, dictionary_hash="0" * 64,
                               hp=ConceptHParams(hidden=8, emb=4), privacy=PrivacySection(**_privacy(mode, tmp_path)))
    finally:
        audit.close()
    _check_audit(mode, tmp_path / "audit", hospitals=2, scoring=False)


def _concept_round(mode: str, tmp_path: Path) -> None:
    """One round of a small concept task (the matrix's concept row), or the refusal; under
    distributed DP a whole voted run (the round needs the masked sum)."""
    privacy = PrivacySection(**_privacy(mode, tmp_path))
    found = problems(HospitalConfig.model_validate({"task": "concepts", "concepts": {
        "concepts": ["a", "y"], "task": "y", "states": {"a": ["0", "1"]}}, "privacy": _privacy(mode, tmp_path),
        "selection": {"enabled": mode == "distributed+selection"}}))
    if found:
        raise ConfigError("; ".join(found))
    split = Split(train=np.arange(20), validation=np.arange(20, 25), test=np.arange(25, 30))
    if mode == "distributed":
        _concept_federation(mode, tmp_path, split)
        return
    x, labels = _concept_data(0)
    torch.manual_seed(0)
    graph = ConceptGraph.from_edges(nodes=["a", "y"], edges=[("a", "y")], task="y", cards={"a": 2, "y": 2})
    model = ConceptModel(kind="c2bm", encoder=MLPEncoder(4, 8, (8,)), graph=graph, z_dim=8,
                         hp=ConceptHParams(hidden=8, emb=4))
    dp = None
    if privacy.enabled:
        dp = concept_dp_trainer(privacy=privacy, n_train=20, site="h1", state_dir=tmp_path / "state",
                                signer=Identity.generate("h1"))
    task = ConceptTask(model=model, inputs=x, labels=labels, task="y", split=split,
                       training=ConceptTraining(lr=0.01, p_intervention=0.0), privacy=dp)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = task.train(round_=0, epochs=1, plan_options={})
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert (out.ledger is not None and out.ledger.epsilon > 0) == (mode == "local")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("task", TASKS)
def test_every_dp_cell_runs_or_is_refused_for_its_stated_reason(task, mode, tmp_path, tables, dictionary,
                                                                ts_sites, modal_sites):
    expected = EXPECTED[(task, mode)]

    def cell() -> None:
        if task == "concepts":
            _concept_round(mode, tmp_path)
        else:
            _run_nsfl(task, mode, tmp_path, tables, dictionary, ts_sites, modal_sites)

    if expected == "runs":
        cell()
        return
    with pytest.raises((ConfigError, PrivacyError, ValueError)) as err:
        cell()
    assert re.search(expected, str(err.value), flags=re.S), str(err.value)


def test_the_docs_table_lists_every_cell_as_the_test_expects():
    """docs/privacy.md's "The DP matrix" row per task: "runs" or "refused" per mode, as EXPECTED."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "privacy.md").read_text()
    table = text.split("## The DP matrix", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.splitlines()
            if line.startswith("|") and not set(line) <= set("|-: ")]
    by_task = {r[0].split()[0].strip("`*").lower(): r[1:1 + len(MODES)] for r in rows[1:]}
    assert set(by_task) == set(TASKS)
    for t in TASKS:
        for m, cell in zip(MODES, by_task[t], strict=True):
            want = "runs" if EXPECTED[(t, m)] == "runs" else "refused"
            assert cell.lower().startswith(want), (t, m, cell)
