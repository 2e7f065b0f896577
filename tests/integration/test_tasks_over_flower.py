"""Survival, temporal, FedNSL and AGAT (with its plaintext attention tap) over Flower give what the
simulation gives: the ServerApp's ``run_federation`` over a loopback Grid (the real ClientApp,
relay, ``HospitalWorker`` and SuperNode factory reading each hospital's files) against
``simulate()`` of the same configuration. Asserted: every round's global state digest, the
``model_selected`` entry and the audit entry kinds are the same -- bit for bit in masked and
plaintext modes; under ckks, whose encryption noise differs from run to run (fresh keys and
randomness; the server holds no plaintext state to digest), the validation losses agree within
1e-6 and the kept rounds are the same (static NS-FL there: the four default candidates). (NS-FL static with the default
candidates: test_simulation_matches_flower.py; real processes: test_flower_one_run.py.)
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import tomli_w

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "secure" / "transport"))
pytest.importorskip("lifelines")
from loopback_run import entries, task_identity  # noqa: E402, F401 -- task_identity: the fixture

pytestmark = pytest.mark.usefixtures("task_identity")
SURVIVAL = {"kind": "survival", "time_unit": "mo", "breaks": [3, 6, 12, 24, 36], "horizon": 12}
CASES = {  # name -> (cohort form, hospital.toml settings, server [federation] settings)
    "survival": ("survival", {"target": SURVIVAL}, {"secure_mode": "masked", "strategy": "fedsgd"}),
    "temporal": ("binary", {"model": {"hidden": 8, "temporal": "attention"}}, {"secure_mode": "masked",
                                                                              "strategy": "fedavg"}),
    "static_ckks": ("binary", {"release": {"secure_modes": ["ckks"]}}, {"secure_mode": "ckks", "strategy": "fedavg"}),
    # FedNSL (task = "fednsl"): the rule space written by `model init`'s hook, pinned in server.toml
    "fednsl": ("binary", {"task": "fednsl", "fednsl": {"max_len": 2, "steps": 20, "draws": 32}},
               {"secure_mode": "masked", "strategy": "fednsl_rules"}),
    # the same, with the transformer M-step attached through the ServerApp's server-extension
    "fednsl_transformer": ("binary", {"task": "fednsl", "fednsl": {"max_len": 1, "steps": 20, "draws": 32}},
                           {"secure_mode": "masked", "strategy": "fednsl_rules",
                            "server-extension": "clinograph.sdk.fednsl.federation:attach_transformer"}),
    "agat_attention": ("binary", {"task": "agat", "agat": {"hidden": 8}, "release": {"insecure_accept_plaintext": True}},
                       {"secure_mode": "insecure_plaintext", "strategy": "insecure_attention",
                        "environment": "development"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_task_over_flower_matches_its_simulation(case, tmp_path):
    from clinograph.sdk.config import HospitalConfig
    from clinograph.sdk.datasets.real_tables import cohort_tables
    from clinograph.sdk.federation.build import run_models
    from clinograph.sdk.tasks import task_strategy
    from clinograph.secure.audit import verify_audit_dir
    from loopback_run import run_over_loopback, simulate_sites, write_sites

    form, hospital, federation = CASES[case]
    federation = dict(federation)
    extension = federation.pop("server-extension", None)  # a run-config key of the ServerApp, not [federation]
    cohort = cohort_tables("lung", form=form)
    hospital = {"dictionary": "dictionary.toml", "model": {"hidden": 8}, "graph": {"k_similar": 0},
                "training": {"lr": 0.02}, **hospital}
    sites = tmp_path / "sites"
    names = write_sites(sites, cohort, hospital)
    fed = {"id": "fed-tasks", "rounds": 2, "min_clients": 2, "local_epochs": 1, **federation}
    server = sites / "server"
    server.mkdir()
    config = HospitalConfig.from_toml(sites / names[0] / "data" / "hospital.toml")
    needed = task_strategy(config, dictionary=cohort.dictionary, directory=server)
    if needed is not None:  # as `clinograph model init` writes it: the server pins the task's public files
        fed["strategy_options"] = needed[1]
    (server / "initial_model.json").write_bytes(run_models(config, dictionary=cohort.dictionary).to_bytes())
    (server / "server.toml").write_text(tomli_w.dumps({"initial_model": "initial_model.json",
                                                       "audit_dir": str(tmp_path / "flower-audit"), "federation": fed}))
    run_over_loopback(sites=sites, names=names, server_toml=server / "server.toml", tmp_path=tmp_path,
                      federation_id="fed-tasks", port=19095,
                      extra={"server-extension": extension} if extension else None)
    simulate_sites(sites=sites, names=names, hospital=hospital, federation=fed, out=tmp_path / "sim",
                   audit_dir=tmp_path / "sim-audit")

    deployed, simulated = entries(tmp_path / "flower-audit"), entries(tmp_path / "sim-audit")

    def digests(entries):
        return [(e["payload"]["round"], e["payload"]["global_state_digest"]) for e in entries if e["kind"] == "aggregate"]

    assert len(digests(deployed)) >= 2
    selected = [e["payload"] for e in deployed if e["kind"] == "model_selected"]
    expected = [e["payload"] for e in simulated if e["kind"] == "model_selected"]
    if extension:  # the simulation keeps the built-in M-step: the priors differ from round 1 on
        generators = {e["payload"]["generator"] for e in deployed if e["kind"] == "rules"}
        assert generators == {"transformer"}
        assert {e["payload"]["generator"] for e in simulated if e["kind"] == "rules"} == {"categorical"}
    elif federation["secure_mode"] != "ckks":
        assert digests(deployed) == digests(simulated) and selected == expected
    else:
        assert len(selected) == len(expected) >= 1  # the default candidates: one model_selected each
        for got, want in zip(selected, expected, strict=True):
            assert got["round"] == want["round"] and got["losses"] == pytest.approx(want["losses"], abs=1e-6)
    ignore = ("envelope", "artefact")
    assert Counter(e["kind"] for e in deployed if e["kind"] not in ignore) == \
        Counter(e["kind"] for e in simulated if e["kind"] not in ignore)
    assert verify_audit_dir(tmp_path / "flower-audit").ok and verify_audit_dir(tmp_path / "sim-audit").ok
