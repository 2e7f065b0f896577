"""The second demo job (``clinograph demo --concepts``): a concept model federated over ALARM
hospital tables with DAG voting, masked and audited.

The four demo hospitals of :mod:`clinograph.sdk.datasets.alarm` (own column names, units and missing blocks)
also export concept columns -- latent ALARM variables a clinician would chart (intubation
status, kinked tube, lung ventilation, pulmonary embolism) -- each hospital only the ones it
records. Their site schemas name those columns (``concepts = [...]``), so the labels come
through ingestion. Each hospital proposes the ALARM DAG over the concepts it supervises (one
proposes a wrong extra edge); the federation votes (``dag_voting``, masked), decides and
audits the DAG, builds a CGM on it and trains it module-wise over the runtime. The audit
directory is verified and rendered; the report's DAG section shows the voted DAG.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from clinograph.secure.audit import AuditTrail, render_report, verify_audit_dir
from clinograph.secure.runtime.config import FederationSection

from clinograph.core.identity import Identity

from ..concepts.encoders import MLPEncoder
from ..concepts.federation import ConceptSite, run_concept_federation
from ..concepts.labels import concept_labels
from ..concepts.modules import ConceptHParams
from ..concepts.task import ConceptTraining
from ..datasets import alarm as alarm_demo
from ..datasets import bnlearn
from ..federation.split import hospital_split
from ..ingest import ingest

TASK = "SHUNT"
CONCEPTS = ("INTUBATION", "KINKEDTUBE", "VENTLUNG", "PULMEMBOLUS", TASK)
#: the concept columns each hospital records (the task is every hospital's label column)
RECORDS = {"north": ("INTUBATION", "KINKEDTUBE", "VENTLUNG", "PULMEMBOLUS"),
           "south": ("INTUBATION", "KINKEDTUBE", "VENTLUNG"),
           "east": ("INTUBATION", "PULMEMBOLUS"),
           "west": ("KINKEDTUBE", "VENTLUNG", "PULMEMBOLUS")}
#: a wrong edge one hospital proposes (outvoted by the weighted majority)
WRONG = {"south": ("VENTLUNG", TASK)}


@dataclass
class ConceptsDemoResult:
    """The voted DAG, per-hospital test metrics, the audit verdict and the report."""

    edges: list[tuple[str, str]]
    truth: list[tuple[str, str]]
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    audit_dir: Path | None = None
    audit_ok: bool = False
    report: Path | None = None


def hospital_sites(*, seed: int, scale: float = 1.0) -> tuple[list[ConceptSite], dict[str, int], str]:
    """The demo hospitals as concept sites (tables -> ingestion -> features and concept labels)."""
    hospitals = tuple(dataclasses.replace(h, n_patients=max(60, int(h.n_patients * scale)))
                      for h in alarm_demo.DEFAULT_HOSPITALS)
    total = sum(h.n_patients for h in hospitals)
    states = alarm_demo.sample_alarm(total, seed=seed)  # the same draw make_hospital_tables renders
    tables = alarm_demo.make_hospital_tables(seed=seed, hospitals=hospitals)
    dictionary = alarm_demo.load_dictionary()
    net_states = bnlearn.network_states("alarm")
    cards = {c: len(net_states[c]) for c in CONCEPTS}
    truth = [(a, b) for a, b in bnlearn.network_edges("alarm") if a in CONCEPTS and b in CONCEPTS]
    sites, start = [], 0
    for h, (df, schema) in zip(hospitals, tables, strict=True):
        part = states.iloc[start:start + h.n_patients].reset_index(drop=True)
        start += h.n_patients
        cols = RECORDS[h.site]
        for c in cols:
            df[c] = part[c].to_numpy()
        schema = schema.model_copy(update={"concepts": cols})
        table = ingest(df, schema=schema, dictionary=dictionary)
        labels = concept_labels(df, schema=schema, table=table, states=net_states)
        labels[TASK] = torch.from_numpy(table.labels.astype(np.int64))  # outcome = SHUNT is HIGH
        values, seen = table.dense()
        x = torch.from_numpy(np.concatenate([np.nan_to_num(values), seen], axis=1).astype(np.float32))
        split = hospital_split(table.labels, site=h.site, test_fraction=0.3, validation_fraction=0.0, seed=seed)
        nodes = tuple(c for c in CONCEPTS if c in cols or c == TASK)
        edges = tuple(e for e in truth if e[0] in nodes and e[1] in nodes)
        if h.site in WRONG and all(v in nodes for v in WRONG[h.site]):
            edges = edges + (WRONG[h.site],)
        sites.append(ConceptSite(name=h.site, inputs=x, labels=labels, split=split, nodes=nodes, edges=edges))
    return sites, cards, dictionary.digest()


def run_concepts_demo(*, out_dir: Path, rounds: int = 10, seed: int = 0, secure_mode: str = "masked",
                      kind: str = "cgm", scale: float = 1.0) -> ConceptsDemoResult:
    """Vote, train, audit, verify, report (see the module docstring). Writes ``out_dir/audit``
    (must be new or empty) and ``out_dir/concepts_report.html``."""
    sites, cards, dictionary_hash = hospital_sites(seed=seed, scale=scale)
    in_dim = int(sites[0].inputs.shape[1])  # type: ignore[union-attr]
    fed = FederationSection(id="clinograph-concepts-demo", rounds=rounds, secure_mode=secure_mode, strategy="fedavg",
                            local_epochs=2, seed=seed, min_clients=len(sites))
    server_id = Identity.generate("server")
    audit_dir = Path(out_dir) / "audit"
    audit = AuditTrail(audit_dir, identity=server_id)
    try:
        run = run_concept_federation(sites=sites, concepts=CONCEPTS, task=TASK, cards=cards, kind=kind,
                                     encoder=lambda: MLPEncoder(in_dim, 32, (64,)), z_dim=32, federation=fed,
                                     audit=audit, server_identity=server_id, dictionary_hash=dictionary_hash,
                                     hp=ConceptHParams(hidden=32, emb=8),
                                     training=ConceptTraining(batch_size=128, lr=3e-3, seed=seed))
    finally:
        audit.close()
    truth = [(a, b) for a, b in bnlearn.network_edges("alarm") if a in CONCEPTS and b in CONCEPTS]
    result = ConceptsDemoResult(edges=run.outcome.edges(), truth=truth, audit_dir=audit_dir)
    result.metrics = {n: h.task.evaluate("test") for n, h in sorted(run.hospitals.items())}
    result.audit_ok = verify_audit_dir(audit_dir).ok
    result.report = render_report(audit_dir, out=Path(out_dir) / "concepts_report.html")
    return result

