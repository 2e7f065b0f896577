"""A real audit directory written the way the server writes one (three hospitals, three rounds)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from clinograph.secure.audit import AuditTrail
from clinograph.secure.messages import ClientReport, LedgerEntry
from clinograph.secure.wire import seal

from clinograph.core.identity import Identity

DICT_HASH = hashlib.sha256(b"dictionary v1").hexdigest()
FED = "fed-test"


@dataclass
class Federation:
    directory: Path
    server: Identity
    hospitals: dict[str, Identity]


def manifest(server: Identity, hospitals: dict[str, Identity], **over) -> dict:
    body = {
        "federation_id": FED,
        "server": {"name": server.name, "public_key": server.public.b64()},
        "hospitals": {n: h.public.b64() for n, h in sorted(hospitals.items())},
        "dictionary_hash": DICT_HASH, "secure_mode": "masked", "strategy": "module_wise",
        "dp_policy": {"required": True, "max_epsilon": 8.0, "delta": 1e-5,
                      "min_noise_multiplier": 0.5, "max_clip_norm": 1.0},
        "spec_digest": hashlib.sha256(b"spec").hexdigest(),
        "insecure_options": [], "environment": "development",
    }
    body.update(over)
    return body


def write_federation(directory: Path, *, rounds: int = 3) -> Federation:
    """Write a full, valid audit directory; returns the identities used."""
    server = Identity.generate("server")
    hospitals = {n: Identity.generate(n) for n in ("hosp-a", "hosp-b", "hosp-c")}
    tick = iter(range(10_000))
    trail = AuditTrail(directory, identity=server, clock=lambda: 1_700_000_000.0 + next(tick))
    trail.record("manifest", manifest(server, hospitals))
    concepts = ["age", "smoker", "dysp", "lung"]
    for r in range(rounds):
        names = sorted(hospitals)
        plan_bytes = json.dumps({"round": r}).encode()  # stands in for the sealed plan
        trail.record("round_plan", {"round": r, "participants": names,
                                    "plan_sha256": hashlib.sha256(plan_bytes).hexdigest(),
                                    "secure_mode": "masked", "strategy": "module_wise",
                                    "weights": {n: 1.0 for n in names}, "spec_version": 0})
        trail.publish(f"round-{r:04d}/plan.json", plan_bytes, kind="round_plan")
        per_client = {}
        for i, (name, ident) in enumerate(sorted(hospitals.items())):
            if name == "hosp-c" and r == 1:
                trail.record("update_rejected", {"round": r, "client": name,
                                                 "reason": "ProtocolError: ledger entry is for round 0, not 1"})
                continue
            ledger = LedgerEntry(round=r, noise_multiplier=1.0, sample_rate=0.01, steps=100 * (r + 1),
                                 clip_norm=1.0, accountant="rdp", epsilon=1.2 * (r + 1) + 0.3 * i,
                                 delta=1e-5, budget_epsilon=4.0 + i)
            report = ClientReport(federation_id=FED, round=r, client=name, dictionary_hash=DICT_HASH,
                                  ledger=ledger, metrics={"auroc": 0.7 + 0.05 * r + 0.01 * i})
            digest = trail.store_envelope(seal(report, ident), kind="client_report", sender=name)
            trail.record("update_accepted", {"round": r, "client": name, "report_sha256": digest})
            trail.record("ledger", {"client": name, **ledger.model_dump(mode="json")})
            per_client[name] = dict(report.metrics)
            if name != "hosp-b":
                trail.record("feature_relevance", {"client": name, "round": r,
                                                   "features": {c: 0.1 * (k + i + 1) for k, c in enumerate(concepts)}})
        coverage = {"feature_embedding/age": len(per_client), "gnn/layer1/has_feature": len(per_client),
                    "head/task": 2}
        trail.record("aggregate", {"round": r, "contributors": sorted(per_client), "module_coverage": coverage,
                                   "global_state_digest": hashlib.sha256(bytes([r])).hexdigest(),
                                   "modules_updated": len(coverage)})
        trail.record("metrics", {"round": r, "per_client": per_client})
        strength = [[0, 2.5, 0, 0], [0, 0, 1, 2], [0, 0, 0, 0], [0, 0, 3, 0]]
        trail.record("dag_outcome", {"kind": "dag_outcome", "round": r, "concepts": concepts, "task": "lung",
                                     "active": [True] * 4,
                                     "adjacency": [[0, 1, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 1, 0]],
                                     "dropped_cycle_edges": [["dysp", "smoker"]], "added_task_parent": None,
                                     "tallies": {"strength": strength, "none": [[0.5] * 4] * 4,
                                                 "observers": [[3.0] * 4] * 4, "support": [[3.0] * 4]}})
        trail.publish(f"round-{r:04d}/global_model.json", f"model {r}".encode(), kind="global_model",
                      meta={"round": r})
    trail.close()
    return Federation(directory=directory, server=server, hospitals=hospitals)


@pytest.fixture(scope="session")
def federation_dir(tmp_path_factory) -> Federation:
    """A pristine audit directory; copy it before changing anything."""
    return write_federation(tmp_path_factory.mktemp("audit") / "run")


def write_second_run(directory: Path, fed: Federation) -> str:
    """Reopen ``directory`` as a second run (ckks mode) with what the round loop writes: a drop
    with its wait, a signed refusal, participation, release and the run's end. Returns the run id."""
    tick = iter(range(10_000))
    trail = AuditTrail(directory, identity=fed.server, clock=lambda: 1_700_100_000.0 + next(tick))
    trail.record("manifest", manifest(fed.server, fed.hospitals, secure_mode="ckks"))
    names = sorted(fed.hospitals)
    for r in range(2):
        trail.record("round_plan", {"round": r, "participants": names, "plan_sha256": hashlib.sha256(bytes([r])).hexdigest(),
                                    "secure_mode": "ckks", "strategy": "fedavg", "weights": {n: 1.0 for n in names},
                                    "spec_version": 0})
        contributed = ["hosp-a", "hosp-b"] if r == 0 else ["hosp-a"]
        for i, name in enumerate(contributed):
            trail.record("ledger", {"client": name, "round": r, "epsilon": 0.5 * (r + 1) + 0.1 * i, "delta": 1e-5,
                                    "budget_epsilon": 2.0, "noise_multiplier": 1.0})
        refused = {"hosp-c": {"stage": "plan", "reason": "PrivacyBudgetExceeded: budget spent", "signed": True,
                              "final": True}}
        dropped = {} if r == 0 else {"hosp-b": {"stage": "stage 1",
                                                "reason": "no reply to 'stage' within 60 s (timeout 60 s)"}}
        trail.record("hospital_refused", {"round": r, "stage": "plan", "client": "hosp-c",
                                          "reason": "PrivacyBudgetExceeded: budget spent", "signed": True,
                                          "final": True, "refusal_sha256": "c" * 64})
        trail.record("aggregate", {"round": r, "contributors": contributed, "module_coverage": {},
                                   "global_state_digest": "0" * 64, "modules_updated": 0})
        trail.record("round_participation", {
            "round": r, "secure_mode": "ckks", "outcome": "aggregated", "invited": names,
            "answered": [n for n in names if n != "hosp-c"], "contributed": contributed, "dropped": dropped,
            "refused": refused, "rejected": {}})
    trail.record("release", {"round": 1, "secure_mode": "ckks", "global_state_digest": "0" * 64, "model_sha256": None})
    trail.record("run_ended", {"status": "too_few_hospitals", "reason": "1 hospital(s) can still take part",
                               "rounds_completed": 2, "rounds_planned": 5})
    run = trail.run_id
    trail.close()
    return run


@pytest.fixture(scope="session")
def two_runs_dir(tmp_path_factory) -> tuple[Federation, str]:
    """The pristine federation directory plus a second run (see write_second_run)."""
    fed = write_federation(tmp_path_factory.mktemp("audit2") / "run")
    return fed, write_second_run(fed.directory, fed)
