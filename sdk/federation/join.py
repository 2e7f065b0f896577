"""The integrator's entry point: turn a hospital's own table into a federation participant."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd
from clinograph.secure.identity import Identity, PublicIdentity

from ..ingest import PatientTable, ingest
from ..model.nsfl import NSFLConfig, NSFLModel
from ..model.nsfl_modules import nsfl_modules
from ..ontology import FeatureDictionary, SiteSchema
from ..training.local import TrainConfig
from .client import HospitalClient
from .simulation import stratified_split
from .trainer import GraphTrainer


def prepare_hospital(table: pd.DataFrame | PatientTable, *, schema: SiteSchema | None,
                     dictionary: FeatureDictionary, identity: Identity, server: PublicIdentity,
                     peers: Mapping[str, PublicIdentity], model: NSFLConfig, training: TrainConfig,
                     k_similar: int, release_metrics: bool, publish_feature_relevance: bool,
                     test_fraction: float = 0.3, seed: int = 0) -> HospitalClient:
    """Validate and map ``table`` (raises SchemaError listing every problem), build the
    hospital's graph and model, and return the client that answers the server's rounds.

    ``release_metrics`` and ``publish_feature_relevance`` are releases of information computed
    from patient data: they are required choices, not defaults.
    """
    pt = table if isinstance(table, PatientTable) else ingest(table, schema=schema, dictionary=dictionary)  # type: ignore[arg-type]
    train_idx, test_idx = stratified_split(pt.labels, test_fraction=test_fraction, seed=seed)
    net = NSFLModel(len(dictionary.node_ids()), model)
    trainer = GraphTrainer(pt, train_idx=train_idx, k_similar=k_similar, config=training)

    def evaluate() -> dict[str, float]:
        from ..training.metrics import binary_metrics

        return binary_metrics(pt.labels[test_idx], trainer.predict(net)[test_idx])

    return HospitalClient(identity=identity, server=server, peers=peers, dictionary=dictionary, model=net,
                          modules=nsfl_modules(net, dictionary.node_ids()), trainer=trainer,
                          num_samples=len(train_idx), observed_nodes=pt.observed_nodes(),
                          release_metrics=release_metrics, publish_feature_relevance=publish_feature_relevance,
                          evaluate=evaluate)
