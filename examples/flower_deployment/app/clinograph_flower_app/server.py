"""Build the FederationServer of a Flower deployment (``server-factory`` in the run config).

Reads ``deployment-config`` (the ``clinograph simulate`` TOML format; its ``[[hospitals]]``
are ignored -- who takes part comes from ``federation.toml``), the server's signing key and
the federation file, and writes the audit trail to ``audit-dir``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clinograph.sdk.data.alarm_demo import load_dictionary
from clinograph.sdk.federation.config import SimulationConfig
from clinograph.sdk.federation.simulation import mode_options
from clinograph.sdk.model.nsfl import NSFLModel
from clinograph.sdk.model.nsfl_modules import nsfl_modules
from clinograph.sdk.ontology.dictionary import FeatureDictionary
from clinograph.secure.audit import AuditTrail
from clinograph.secure.identity import Identity
from clinograph.secure.messages import DPPolicy
from clinograph.secure.server import FederationServer
from clinograph.secure.spec import ModuleKind
from clinograph.secure.strategies import create_strategy
from clinograph.secure.transport.flower.enrolment import FederationFile


def make_server(*, run_config: Mapping[str, Any], federation: FederationFile,
                participants: tuple[str, ...]) -> FederationServer:
    """The server for this run (masked-mode parameters for ``participants``), audit in ``audit-dir``."""
    cfg = SimulationConfig.from_toml(Path(str(run_config["deployment-config"])))
    fed = cfg.federation
    dictionary = FeatureDictionary.from_toml(cfg.dictionary) if cfg.dictionary else load_dictionary()
    modules = nsfl_modules(NSFLModel(len(dictionary.node_ids()), cfg.model), dictionary.node_ids())
    identity = Identity.load(federation.server.name, Path(str(run_config["server-key"])))
    dp_policy = None
    if cfg.privacy.enabled:
        dp_policy = DPPolicy(required=True, max_epsilon=cfg.privacy.epsilon_budget, delta=cfg.privacy.delta,
                             min_noise_multiplier=0.3, max_clip_norm=cfg.privacy.clip_norm)
    n = len(participants)
    max_weight = float(run_config.get("max-weight", 5000.0))
    strategy_opts = {"server_lr": fed.server_lr} if fed.strategy == "fedsgd" else {}
    return FederationServer(
        federation_id=federation.federation_id, spec=modules.spec(version=0),
        initial_state=modules.state(ModuleKind.SHARED), dictionary_hash=dictionary.digest(), identity=identity,
        enrolled=federation.enrolled(), secure_mode=fed.secure_mode,
        strategy=create_strategy(fed.strategy, **strategy_opts), min_clients=min(fed.min_clients, n),
        local_epochs=fed.local_epochs, dp_policy=dp_policy,
        audit=AuditTrail(Path(str(run_config["audit-dir"])), identity=identity), environment=fed.environment,
        mode_options=mode_options(cfg, n, max_weight))
