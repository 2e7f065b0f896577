"""Clinograph: federated learning across hospitals over a shared clinical ontology.

One screen of API (``import clinograph as cg``); names resolve lazily, so ``import clinograph``
stays torch-free on a lean server install and loads the training stack only when a hospital
name is used.

=========================  ==================================================================
a hospital's data          ``FeatureDictionary``, ``SiteSchema``, ``ColumnMap``, ``read_table``, ``ingest``
a hospital                 ``HospitalConfig`` (TOML), ``build_hospital`` (-> ``HospitalClient``)
your own task              ``Task``, ``TaskBase``, ``register_task``, ``registered_tasks``
a whole federation here    ``SimulationConfig`` (TOML), ``simulate``, ``simulate_from_config``, ``build_simulation``,
                           ``SimulationResult``
the federation's split     ``split_patients`` (table, config -> ``Split``), ``hospital_split``
the server                 ``ServerConfig`` (TOML), ``build_server``, ``run_round``, ``run_rounds``,
                           ``InProcessTransport``
keys and audit             ``Identity``, ``AuditTrail``, ``verify_audit_dir``, ``render_report``
errors                     ``ClinographError`` and every kind (``ConfigError``, ``SchemaError``, ``PrivacyError``,
                           ``ProtocolError``, ``IntegrityError``, ...): :mod:`clinograph.core.errors`
=========================  ==================================================================
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_NAMES = {
    "FeatureDictionary": "clinograph.sdk.ontology", "SiteSchema": "clinograph.sdk.ontology",
    "ColumnMap": "clinograph.sdk.ontology", "read_table": "clinograph.sdk.ingest", "ingest": "clinograph.sdk.ingest",
    "HospitalConfig": "clinograph.sdk.config", "SimulationConfig": "clinograph.sdk.config",
    "build_hospital": "clinograph.sdk.federation.build", "HospitalClient": "clinograph.sdk.federation.client",
    "simulate": "clinograph.sdk.federation.simulate", "build_simulation": "clinograph.sdk.federation.simulate",
    "simulate_from_config": "clinograph.sdk.federation.simulate",
    "SimulationResult": "clinograph.sdk.federation.simulate",
    "split_patients": "clinograph.sdk.federation.split", "hospital_split": "clinograph.sdk.federation.split",
    "Split": "clinograph.sdk.federation.split",
    "Task": "clinograph.sdk.federation.task", "TaskBase": "clinograph.sdk.federation.task",
    "register_task": "clinograph.sdk.tasks", "registered_tasks": "clinograph.sdk.tasks",
    "ServerConfig": "clinograph.secure.runtime", "build_server": "clinograph.secure.runtime",
    "run_round": "clinograph.secure.runtime", "run_rounds": "clinograph.secure.runtime",
    "InProcessTransport": "clinograph.secure.runtime", "Identity": "clinograph.core.identity",
    "AuditTrail": "clinograph.secure.audit", "verify_audit_dir": "clinograph.secure.audit",
    "render_report": "clinograph.secure.audit",
    **{name: "clinograph.core.errors" for name in (
        "ClinographError", "ConfigError", "ConfigValidationError", "SchemaError", "UnitError", "SourceUnavailable", "PrivacyError",
        "PrivacyBudgetExceeded", "ProtocolError", "IntegrityError", "SecurityPolicyError", "RegistryError")},
}

__all__ = ["__version__", *sorted(_NAMES)]


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'clinograph' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
