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

from clinograph.secure.runtime.participation import end_run
from clinograph.secure.strategies.attention import (
    InsecureAttention,
    PlaintextUpdateTap,
    check_secure_mode,
)

from ..config import SimulationConfig
from ..federation.simulate import (  # the one selection rule, not a copy
    SimulatedFederation,
    SimulationResult,
    _select,
    _should_stop,
    build_simulation,
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
    """:func:`clinograph.sdk.federation.simulate.simulate`'s loop (rounds, early stopping, the
    selected and calibrated model) over :func:`agat_simulation`."""
    sim = agat_simulation(tables, dictionary, config, audit_dir=audit_dir)
    result = SimulationResult(audit_dir=audit_dir)
    status, reason = "completed", f"all {config.federation.rounds} planned round(s) ran"
    try:
        for r in range(config.federation.rounds):
            outcome = sim.run_round()
            result.dropped.append(outcome.dropped)
            result.rounds.append(sim.evaluate("test"))
            if _should_stop(sim):
                status, reason = "completed", f"stopped early after round {r} (validation loss, patience)"
                break
        _select(sim, result, patience=config.selection.patience)
    except BaseException as exc:
        status, reason = "failed", f"{type(exc).__name__}: {exc}"
        raise
    finally:
        try:  # the run's release and run_ended entries, as simulate() and run_rounds write them
            end_run(sim.server, status=status, reason=reason, rounds_completed=len(result.rounds),
                    rounds_planned=config.federation.rounds)
        finally:
            sim.audit.close()
    return result
