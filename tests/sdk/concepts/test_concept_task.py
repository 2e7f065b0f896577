"""ConceptTask over the runtime: DAG voting masked == plaintext, dag_outcome audited, and a
hospital without a concept's labels sends nothing for that concept's module (F-CMs 4.2.3)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from clinograph.sdk.concepts.encoders import MLPEncoder
from clinograph.sdk.concepts.federation import ConceptSite, run_concept_federation
from clinograph.sdk.concepts.modules import ConceptHParams
from clinograph.sdk.concepts.task import ConceptTraining
from clinograph.sdk.federation.split import Split
from clinograph.secure.audit import AuditTrail
from clinograph.secure.audit.verify import scan_audit_dir
from clinograph.secure.dag_voting import VOTE_MODULE
from clinograph.secure.runtime.config import FederationSection

from clinograph.core.identity import Identity

CONCEPTS = ("a", "b", "c", "y")
CARDS = {v: 2 for v in CONCEPTS}
DICT_HASH = hashlib.sha256(b"concept-test").hexdigest()
# proposals: two sites agree on a -> b -> y; the third (no labels for b) proposes a -> c -> y
PROPOSALS = {"h1": (("a", "b", "y"), (("a", "b"), ("b", "y"))),
             "h2": (("a", "b", "c", "y"), (("a", "b"), ("b", "y"), ("c", "y"), ("a", "c"))),
             "h3": (("a", "c", "y"), (("a", "c"), ("c", "y")))}


def _site(name: str, k: int, n: int = 120) -> ConceptSite:
    rng = np.random.default_rng(k)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    a = (x[:, 0] > 0).astype(np.int64)
    b = (x[:, 1] + a > 0.5).astype(np.int64)
    c = (x[:, 2] - a > -0.5).astype(np.int64)
    y = ((b + c) > 1).astype(np.int64)
    nodes, edges = PROPOSALS[name]
    full = {"a": a, "b": b, "c": c, "y": y}
    labels = {v: torch.from_numpy(full[v]) for v in nodes}
    idx = rng.permutation(n)
    split = Split(train=idx[:80], validation=idx[80:90], test=idx[90:])
    return ConceptSite(name=name, inputs=torch.from_numpy(x), labels=labels, split=split, nodes=nodes, edges=edges)


def _run(mode: str, audit_dir: Path, rounds: int = 1):
    sites = [_site(n, k) for k, n in enumerate(sorted(PROPOSALS))]
    fed = FederationSection(id="concepts-test", rounds=rounds, secure_mode=mode, strategy="fedavg", local_epochs=1,
                            seed=3, max_weight=1000.0, min_clients=3)
    server_id = Identity.generate("server")
    audit = AuditTrail(audit_dir, identity=server_id)
    try:
        with pytest.warns(UserWarning) if mode.startswith("insecure") else _nothing():
            out = run_concept_federation(sites=sites, concepts=CONCEPTS, task="y", cards=CARDS, kind="cgm",
                                         encoder=lambda: MLPEncoder(6, 8, (16,)), z_dim=8, federation=fed,
                                         audit=audit, server_identity=server_id, dictionary_hash=DICT_HASH,
                                         hp=ConceptHParams(hidden=8, emb=4), training=ConceptTraining(batch_size=32))
    finally:
        audit.close()
    return out, audit_dir


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {m: _run(m, tmp_path_factory.mktemp(m)) for m in ("masked", "insecure_plaintext")}


def test_masked_run_gives_the_plaintext_dag_and_parameters(runs):
    (masked, _), (plain, _) = runs["masked"], runs["insecure_plaintext"]
    assert masked.outcome.adjacency == plain.outcome.adjacency
    assert ("a", "b") in masked.outcome.edges() and ("b", "y") in masked.outcome.edges()
    assert masked.graph == plain.graph
    # One training round: identical local training, so the global models differ only by the
    # masked mode's fixed point. (Over more rounds Adam amplifies 1e-7 differences in the
    # loaded model; that is training, not aggregation.)
    ms, ps = masked.server.state, plain.server.state
    assert set(ms) == set(ps) and VOTE_MODULE not in ms
    worst = max(float(np.max(np.abs(ms[n] - ps[n]))) for n in ms)
    assert worst < 1e-6, worst
    # the voting tally itself: masked within fixed-point precision of the plaintext sum
    np.testing.assert_allclose(masked.vote_server.state[VOTE_MODULE], plain.vote_server.state[VOTE_MODULE],
                               atol=1e-3)


def test_dag_outcome_is_audited_and_verifies(runs, tmp_path):
    fed, audit_dir = runs["masked"]
    report, entries = scan_audit_dir(audit_dir)
    assert report.ok, report.problems
    dags = [e.payload for e in entries if e.kind == "dag_outcome"]
    assert len(dags) == 1 and dags[0]["adjacency"] == [list(r) for r in fed.outcome.adjacency]
    arts = [e.payload for e in entries if e.kind == "artefact" and e.payload["kind"] == "dag_outcome"]
    assert [a["name"] for a in arts] == ["round-0000/dag_outcome.json"]
    from typer.testing import CliRunner

    from clinograph.cli import app

    result = CliRunner().invoke(app, ["audit", "verify", str(audit_dir)])
    assert result.exit_code == 0, result.output


def test_hospital_without_a_concepts_labels_sends_nothing_for_it(runs):
    fed, audit_dir = runs["masked"]
    h1, h3 = fed.hospitals["h1"], fed.hospitals["h3"]
    assert "concept/c" not in h1.task.trained_modules(h1.last)  # h1 has no label for c
    assert "concept/b" not in h3.task.trained_modules(h3.last)  # h3 has no label for b
    assert "head/task" in h1.task.trained_modules(h1.last)
    # zero gradient: its module stays bit-exactly the global value after local training
    h3.task.modules.load(h3._global)
    before = h3.task.modules.get("concept/b")
    h3.task.train(round_=99, epochs=1, plan_options={})
    assert np.array_equal(h3.task.modules.get("concept/b"), before)
    # and the server saw two contributors for concept/b (h1, h2), three for the encoder
    agg = [e for e in scan_audit_dir(audit_dir)[1] if e.kind == "aggregate"][-1].payload
    assert agg["module_coverage"]["concept/b"] == 2 and agg["module_coverage"]["concept/c"] == 2
    assert agg["module_coverage"]["encoder/mlp"] == 3

