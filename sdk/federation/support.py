"""What runs where: every task x secure mode x transport, as the code decides it (docs/matrix.md).

The registered tasks (``nsfl`` static, temporal and survival; ``agat``; ``fednsl``) run through the one run
(:func:`clinograph.secure.runtime.run.run_federation`), in process and over Flower alike, so a
cell's status is decided by running it: :func:`run_cell` trains one round of a tiny federation
in process and reports ``runs`` or the ConfigError that refused it. Over Flower the same run
carries the same status; :data:`REAL_PROCESS_TESTS` names the cells that also have their own
real-process test, the others rest on the equivalence test
(``tests/integration/test_simulation_matches_flower.py``, ``test_tasks_over_flower.py``).

Rows whose hospitals need more than a table and a shared config (concepts: each hospital's concept
columns and its own DAG proposal; ``simulate()`` refuses it, ``run_concept_federation`` runs it in
process) are stated with the rule that decides them (:data:`STATED`). ``tests/sdk/federation/
test_support.py`` runs every runnable cell and checks that docs/matrix.md is :func:`render`'s
output.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

MODES: dict[str, dict[str, Any]] = {
    "masked": {"secure_mode": "masked"},
    "masked16": {"secure_mode": "masked", "masked_word_bits": 16},
    "ckks": {"secure_mode": "ckks"},
    "ckks_threshold": {"secure_mode": "ckks_threshold"},
}
#: task row -> config overrides (every row runs one round, no selection, on the given tables)
TASKS: dict[str, dict[str, Any]] = {
    "NS-FL static": {},
    "NS-FL temporal": {"model": {"temporal": "attention", "hidden": 8}},
    "NS-FL survival": {"target": {"kind": "survival", "time_unit": "mo", "breaks": [3, 6, 12, 24, 36],
                                  "horizon": 12}},
    "NS-FL modalities": {"model": {"modalities": ["waveform"]}},
    "AGAT": {"task": "agat", "agat": {"hidden": 8}},
    "FedNSL (rules)": {"task": "fednsl", "fednsl": {"max_len": 1, "steps": 10, "draws": 16},
                       "federation": {"strategy": "fednsl_rules"}},
}
#: rows whose hospitals need more than a table and a config: how the Flower column reads
NEEDS_FACTORY = {"NS-FL modalities": "runs (the same run) with a --participant-factory that loads each hospital's "
                                     "signals; the built-in SuperNode factory builds a task from a table and a config"}
#: cells (task, mode) with their own real-process Flower test (SuperLink, SuperNodes, TLS, node auth)
REAL_PROCESS_TESTS: dict[tuple[str, str], str] = {
    ("NS-FL static", "masked"): "tests/integration/test_flower_deployment.py (DP), test_flower_one_run.py "
                                "(default candidates), test_flower_resume.py; loopback equivalence, bit for bit",
    ("NS-FL static", "ckks"): "tests/integration/test_flower_deployment.py (DP); loopback equivalence within CKKS noise",
    ("NS-FL static", "ckks_threshold"): "tests/integration/test_flower_deployment.py (DP, 2-of-3: a key holder killed "
                                        "before its decryption share, two others decrypt)",
}
#: cells whose Flower run is compared with the simulation over a loopback Grid (the real ClientApp,
#: relay, workers and SuperNode factory): tests/integration/test_simulation_matches_flower.py and
#: test_tasks_over_flower.py
EQUIVALENCE: dict[tuple[str, str], str] = {
    ("NS-FL static", "ckks"): "+ loopback equivalence (4 candidates, within CKKS noise)",
    ("NS-FL temporal", "masked"): "loopback equivalence, bit for bit",
    ("NS-FL survival", "masked"): "loopback equivalence, bit for bit",
    ("AGAT", "masked"): "the same run; AGAT's plaintext attention tap (insecure_plaintext) loopback-equivalent",
    ("FedNSL (rules)", "masked"): "loopback equivalence, bit for bit (the built-in categorical M-step; the "
                                  "transformer M-step through the ServerApp's server-extension)",
}
#: rows decided by a stated rule: (in-process status per mode, Flower status, where it is tested)
STATED: dict[str, tuple[Mapping[str, str], str, str]] = {
    "concepts (F-CMs, DAG vote)": (
        {"masked": "runs", "masked16": "not tested", "ckks": "refused: the server must see the vote tally it audits",
         "ckks_threshold": "runs"},
        "runs (the same voted run, run_voted; each hospital built from its files by the SuperNode factory)",
        "tests/integration/test_concepts_over_flower.py: real processes (TLS, node authentication) and loopback, "
        "each bit for bit with run_concept_federation (masked); tests/sdk/concepts/ (ckks_threshold: "
        "test_voted_run.py, in process)"),
}


def _config(task: str, mode: str, *, output: Path) -> Any:
    from ..config import SimulationConfig, merge_sections

    base = {"federation": {"rounds": 1, "min_clients": 2, "local_epochs": 1, "strategy": "fedavg", **MODES[mode]},
            "model": {"hidden": 8}, "graph": {"k_similar": 0}, "selection": {"enabled": False},
            "output": str(output)}
    return SimulationConfig.model_validate(merge_sections(base, TASKS[task]))


def run_cell(task: str, mode: str, tables: Sequence[Any], task_factory: Callable[..., Any] | None = None) -> str:
    """``runs`` if one round of the cell's federation completes in process over ``tables``
    (and its audit verifies), else ``refused: <the ConfigError's message>``. ``task_factory``:
    as :func:`.simulate.simulate`'s (the modality row's signals)."""
    from clinograph.secure.audit import verify_audit_dir

    from clinograph.core.errors import ConfigError

    from .simulate import simulate

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            simulate(tables, tables[0].dictionary, _config(task, mode, output=Path(tmp) / "out"),
                     audit_dir=Path(tmp) / "audit", choose=False, task_factory=task_factory)
        except ConfigError as exc:
            return f"refused: {exc}"
        if not verify_audit_dir(Path(tmp) / "audit").ok:
            return "audit does not verify"
        left = _left_out(Path(tmp) / "audit")
        return "runs" if not left else f"runs without {left}"


def _left_out(audit: Path) -> str:
    """The hospitals a round of the audit trail did not count (refused, dropped, rejected), with the
    first reason each: a cell whose round completed without some of its hospitals does not run as
    configured (a strategy's weights that one hospital refuses, say)."""
    from clinograph.secure.audit.read import payloads

    out: dict[str, str] = {}
    for p in payloads(audit, "round_participation"):
        for what in ("refused", "dropped", "rejected"):
            for name, why in sorted((p.get(what) or {}).items()):
                reason = why.get("reason") if isinstance(why, dict) else why
                out.setdefault(name, f"{what}: {str(reason)[:200]}")
    return "; ".join(f"{n} ({why})" for n, why in sorted(out.items()))


def matrix(tables_for: Callable[[str], Sequence[Any]],
           factory_for: Callable[[str], Callable[..., Any] | None] = lambda task: None) -> list[dict[str, str]]:
    """Every row: task, mode, in-process status, Flower status, evidence."""
    rows = []
    for task in TASKS:
        for mode in MODES:
            status = run_cell(task, mode, tables_for(task), factory_for(task))
            flower = status if status != "runs" else NEEDS_FACTORY.get(task, "runs (the same run)")
            rows.append({"task": task, "mode": mode, "in_process": status, "flower": flower,
                         "evidence": REAL_PROCESS_TESTS.get((task, mode), EQUIVALENCE.get((task, mode),
                                                                                           "the same run"))})
    for task, (modes, flower, where) in STATED.items():
        for mode in MODES:
            rows.append({"task": task, "mode": mode, "in_process": modes[mode],
                         "flower": flower if modes[mode] == "runs" else modes[mode], "evidence": where})
    return rows


def render(rows: Sequence[Mapping[str, str]]) -> str:
    """docs/matrix.md's table."""
    out = ["| task | secure mode | in process (`simulate`) | over Flower | Flower evidence |", "|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['task']} | {r['mode']} | {r['in_process']} | {r['flower']} | {r['evidence']} |")
    return "\n".join(out) + "\n"
