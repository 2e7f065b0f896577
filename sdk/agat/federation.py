"""Running AGAT federations in process: the one simulation, plus the plaintext tap that the
insecure, server-side attention (``insecure_attention``) needs.

``agat_simulation`` checks the strategy against the secure mode *before* anything is built
(:func:`clinograph.secure.strategies.attention.check_secure_mode`: ``insecure_attention`` is
refused under ``masked`` and ``ckks``, by name, with the reason), then builds the federation with
:func:`clinograph.sdk.federation.simulate.build_simulation`; for ``insecure_attention`` it wraps
the transport in a :class:`~clinograph.secure.strategies.attention.PlaintextUpdateTap`, which
hands the strategy every hospital's signed plaintext update.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from clinograph.secure.strategies.attention import (
    InsecureAttention,
    PlaintextUpdateTap,
    check_secure_mode,
)

from ..config import SimulationConfig
from ..federation.simulate import (
    SimulatedFederation,
    SimulationResult,
    build_simulation,
    run_simulation,
)
from ..ingest.table import PatientTable
from ..ontology.dictionary import FeatureDictionary


def agat_simulation(tables: Sequence[PatientTable], dictionary: FeatureDictionary, config: SimulationConfig, *,
                    audit_dir: Path) -> SimulatedFederation:
    """:func:`build_simulation`, with the attention strategy's secure-mode check first and, for
    ``insecure_attention``, the plaintext tap on the transport.

    Raises:
        ConfigError: ``insecure_attention`` under a mode other than ``insecure_plaintext``.
    """
    check_secure_mode(config.federation.strategy, config.federation.secure_mode)
    sim = build_simulation(tables, dictionary, config, audit_dir=audit_dir)
    if isinstance(sim.server.strategy, InsecureAttention):
        tap = PlaintextUpdateTap(sim.transport, strategy=sim.server.strategy, secure_mode=sim.server.mode.name,
                                 server=sim.server.identity.public, enrolled=sim.server.enrolled)
        sim = replace(sim, transport=tap)  # type: ignore[arg-type]
    return sim


def run_agat_simulation(tables: Sequence[PatientTable], dictionary: FeatureDictionary, config: SimulationConfig, *,
                        audit_dir: Path) -> SimulationResult:
    """:func:`clinograph.sdk.federation.simulate.run_simulation` (rounds, early stopping, the
    selected and calibrated model, the run's end) over :func:`agat_simulation`."""
    return run_simulation(agat_simulation(tables, dictionary, config, audit_dir=audit_dir), config)
