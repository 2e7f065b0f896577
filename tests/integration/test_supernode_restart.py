"""A hospital whose SuperNode restarts between two rounds rejoins its run: the new worker rebuilds the
run's participant from the state directory (the run it was greeted for, the candidate it trains, the
client's checkpoint), and the run ends exactly as without the restart -- the same candidates'
global models every round, the same choice, the same audit entry kinds -- over a loopback Grid
through the real ClientApp, relay, workers and SuperNode factory, against ``simulate()``."""

from __future__ import annotations

from collections import Counter

import pytest
import tomli_w
from loopback_run import entries, run_over_loopback, simulate_sites, task_identity, write_sites  # noqa: F401 -- task_identity: the fixture

pytest.importorskip("lifelines")
HOSPITAL = {"dictionary": "dictionary.toml", "model": {"hidden": 8}, "graph": {"k_similar": 0},
            "training": {"lr": 0.02}, "personal": {"modules": ["head/task"], "fine_tune_epochs": 1},
            "selection": {"candidates": [{"name": "small"}, {"name": "wider", "model": {"hidden": 12}}],
                          "patience": 0}}
FEDERATION = {"id": "fed-restart", "rounds": 3, "min_clients": 2, "local_epochs": 1, "secure_mode": "masked",
              "strategy": "fedavg"}


pytestmark = pytest.mark.usefixtures("task_identity")


def test_a_restarted_supernode_rejoins_its_run_and_the_run_ends_as_without_it(tmp_path):
    from clinograph.sdk.config import HospitalConfig
    from clinograph.sdk.datasets.real_tables import cohort_tables
    from clinograph.sdk.federation.build import run_models

    cohort = cohort_tables("lung", form="binary")
    sites = tmp_path / "sites"
    names = write_sites(sites, cohort, HOSPITAL)
    server = sites / "server"
    server.mkdir()
    config = HospitalConfig.from_toml(sites / names[0] / "data" / "hospital.toml")
    (server / "initial_model.json").write_bytes(run_models(config, dictionary=cohort.dictionary).to_bytes())
    (server / "server.toml").write_text(tomli_w.dumps({"initial_model": "initial_model.json",
                                                       "audit_dir": str(tmp_path / "flower-audit"),
                                                       "federation": FEDERATION}))
    plans: Counter[int] = Counter()
    restarted: list[int] = []

    def on_deliver(message, node, restart):
        stage = message.content.config_records["clinograph"]["stage"]
        if node == 401 and stage == "plan":
            plans[node] += 1
            if plans[node] in (2, 5):  # the first candidate's second round, the second candidate's second
                restart(node)
                restarted.append(plans[node])

    run_over_loopback(sites=sites, names=names, server_toml=server / "server.toml", tmp_path=tmp_path,
                      federation_id=FEDERATION["id"], port=19097, on_deliver=on_deliver)
    assert restarted == [2, 5]
    simulate_sites(sites=sites, names=names, hospital=HOSPITAL, federation=FEDERATION, out=tmp_path / "sim",
                   audit_dir=tmp_path / "sim-audit")
    deployed, simulated = entries(tmp_path / "flower-audit"), entries(tmp_path / "sim-audit")

    def digests(entries):
        return [(e["payload"]["round"], e["payload"]["global_state_digest"]) for e in entries if e["kind"] == "aggregate"]

    def payloads(entries, kind):
        return [e["payload"] for e in entries if e["kind"] == kind]

    assert len(digests(deployed)) >= 4 and digests(deployed) == digests(simulated)
    assert payloads(deployed, "model_selected") == payloads(simulated, "model_selected")
    assert [p["chosen"] for p in payloads(deployed, "model_chosen")] == \
        [p["chosen"] for p in payloads(simulated, "model_chosen")]
    for kind in ("round_aborted", "hospital_refused"):  # nothing lost to the restarts
        assert not payloads(deployed, kind)
    assert all(sorted(p["contributors"]) == sorted(names) for p in payloads(deployed, "aggregate"))
    ignore = ("envelope", "artefact")
    assert Counter(e["kind"] for e in deployed if e["kind"] not in ignore) == \
        Counter(e["kind"] for e in simulated if e["kind"] not in ignore)
