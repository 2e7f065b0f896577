"""Build one hospital inside its SuperNode (``--participant-factory``).

The node config names the hospital's folders and keys::

    hospital='h1' data-dir='/srv/h1/data' state-dir='/srv/h1/state'
    key-file='/srv/h1/keys/h1.ed25519.pem' federation-file='/srv/h1/keys/federation.toml'

``data-dir`` holds ``table.csv`` (the hospital's own columns and units), ``schema.toml`` (its
SiteSchema) and ``clinograph.toml`` (the hospital's own model/training/privacy settings, in
the ``clinograph simulate`` format). Privacy settings are the hospital's, never the server's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clinograph.sdk.data.alarm_demo import load_dictionary
from clinograph.sdk.federation.client import HospitalClient
from clinograph.sdk.federation.config import SimulationConfig
from clinograph.sdk.federation.simulation import stratified_split
from clinograph.sdk.federation.trainer import GraphTrainer
from clinograph.sdk.ingest.validate import ingest, read_table
from clinograph.sdk.model.nsfl import NSFLModel
from clinograph.sdk.model.nsfl_modules import nsfl_modules
from clinograph.sdk.ontology.dictionary import FeatureDictionary
from clinograph.sdk.ontology.schema import SiteSchema
from clinograph.secure.identity import Identity
from clinograph.secure.transport.flower.enrolment import load_federation


def _trainer(table, train_idx, cfg: SimulationConfig, *, site: str, state_dir: Path):
    if not cfg.privacy.enabled:
        return GraphTrainer(table, train_idx=train_idx, k_similar=cfg.graph.k_similar, config=cfg.training)
    # Patient-level DP-SGD (issue 4); the privacy ledger persists in this hospital's state dir,
    # so epsilon composes across rounds and runs and survives a restart of the SuperNode.
    from clinograph.sdk.privacy import dp_trainer_factory

    return dp_trainer_factory(table=table, train_idx=train_idx, config=cfg, site=site,
                              state_root=state_dir / "privacy")


def make_hospital(*, node_config: Mapping[str, Any], run_config: Mapping[str, Any], run_id: int,
                  identity: Identity) -> HospitalClient:
    """A HospitalClient over this node's data, keys and settings."""
    data = Path(str(node_config["data-dir"]))
    cfg = SimulationConfig.from_toml(data / "clinograph.toml")
    federation = load_federation(Path(str(node_config["federation-file"])))
    dictionary = FeatureDictionary.from_toml(cfg.dictionary) if cfg.dictionary else load_dictionary()
    table = ingest(read_table(data / "table.csv"), schema=SiteSchema.from_toml(data / "schema.toml"),
                   dictionary=dictionary)
    train_idx, test_idx = stratified_split(table.labels, test_fraction=cfg.test_fraction, seed=cfg.federation.seed)
    model = NSFLModel(len(dictionary.node_ids()), cfg.model)
    return HospitalClient(
        identity=identity, server=federation.server_public(), peers=federation.enrolled(), dictionary=dictionary,
        model=model, modules=nsfl_modules(model, dictionary.node_ids()),
        trainer=_trainer(table, train_idx, cfg, site=identity.name, state_dir=Path(str(node_config["state-dir"]))),
        num_samples=len(train_idx), observed_nodes=table.observed_nodes(),
        release_metrics=cfg.privacy.release_metrics or not cfg.privacy.enabled,
        publish_feature_relevance=cfg.publish_feature_relevance)
