"""Running AGAT federations in process: the one simulation, plus the plaintext tap that the
insecure, server-side attention (``insecure_attention``) needs.

``agat_simulation`` checks the strategy against the secure mode *before* anything is built
(:func:`clinograph.secure.strategies.attention.check_secure_mode`: ``insecure_attention`` is
refused under ``masked`` and ``ckks``, by name, with the reason), then runs the one federation
run. For ``insecure_attention`` the server side (:class:`clinograph.secure.runtime.assemble.ServerSide`,
the same in simulation and over Flower) wraps the transport in a :class:`~clinograph.secure.strategies.attention.PlaintextUpdateTap`, which
hands the strategy every hospital's signed plaintext update.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from clinograph.secure.strategies.attention import check_secure_mode

from ..config import SimulationConfig
from ..federation.simulate import SimulatedFederation, SimulationResult, build_simulation, simulate
from ..ingest.table import PatientTable
from ..ontology.dictionary import FeatureDictionary


def agat_simulation(tables: Sequence[PatientTable], dictionary: FeatureDictionary, config: SimulationConfig, *,
                    audit_dir: Path) -> SimulatedFederation:
    """:func:`build_simulation`, with the attention strategy's secure-mode check first (the
    plaintext tap is the server side's, :class:`clinograph.secure.runtime.assemble.ServerSide`).

    Raises:
        ConfigError: ``insecure_attention`` under a mode other than ``insecure_plaintext``.
    """
    check_secure_mode(config.federation.strategy, config.federation.secure_mode)
    return build_simulation(tables, dictionary, config, audit_dir=audit_dir)


def run_agat_simulation(tables: Sequence[PatientTable], dictionary: FeatureDictionary, config: SimulationConfig, *,
                        audit_dir: Path) -> SimulationResult:
    """The one run (:func:`clinograph.sdk.federation.simulate.simulate`) of an AGAT federation,
    with the attention strategy's secure-mode check first."""
    check_secure_mode(config.federation.strategy, config.federation.secure_mode)
    return simulate(tables, dictionary, config, audit_dir=audit_dir)
