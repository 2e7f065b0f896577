"""The hospital inside a Flower SuperNode, built from files -- the default participant factory.

``clinograph supernode --node-config "hospital='h1' data-dir='/srv/h1/data' state-dir='/srv/h1/state'
key-file='/srv/h1/keys/h1.ed25519.pem' federation-file='/srv/h1/keys/federation.toml'"``

``data-dir`` holds ``table.csv`` (or ``table.parquet``: the hospital's own columns and units),
``schema.toml`` (its SiteSchema) and ``hospital.toml`` (its :class:`~clinograph.sdk.config.HospitalConfig`:
model, training, privacy, release; ``dictionary`` relative to that file). The DP ledger lives
in ``state-dir``. A deployment writes these files; it copies no code.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clinograph.secure.errors import ConfigError
from clinograph.secure.identity import Identity
from clinograph.secure.transport.flower.enrolment import load_federation

from ..config import HospitalConfig
from ..ingest import read_table
from ..ontology import FeatureDictionary, SiteSchema
from .build import build_hospital
from .client import HospitalClient


def load_dictionary(config: HospitalConfig, where: Path) -> FeatureDictionary:
    """The dictionary the hospital config names (required: a silent default would be the demo's)."""
    if config.dictionary is None:
        raise ConfigError(f"{where} names no feature dictionary: set `dictionary = \"dictionary.toml\"` "
                          "(the same file at every hospital of the federation).")
    return FeatureDictionary.from_toml(config.dictionary)


def make_hospital(*, node_config: Mapping[str, Any], run_config: Mapping[str, Any], run_id: int,
                  identity: Identity) -> HospitalClient:
    """A HospitalClient over this node's data, keys and settings."""
    data = Path(str(node_config["data-dir"]))
    if not node_config.get("federation-file"):
        raise ConfigError("--node-config lacks federation-file (the federation.toml from `clinograph keys init`).")
    federation = load_federation(Path(str(node_config["federation-file"])))
    config = HospitalConfig.from_toml(data / "hospital.toml")
    dictionary = load_dictionary(config, data / "hospital.toml")
    table_path = next((data / f for f in ("table.csv", "table.parquet") if (data / f).exists()), data / "table.csv")
    return build_hospital(read_table(table_path), schema=SiteSchema.from_toml(data / "schema.toml"),
                          dictionary=dictionary, config=config, identity=identity,
                          server=federation.server_public(), peers=federation.enrolled(),
                          federation_id=federation.federation_id,
                          state_dir=Path(str(node_config["state-dir"])) / "privacy")
