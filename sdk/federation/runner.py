"""Run a simulated federation from a :class:`SimulationConfig` (hospital files on disk)."""

from __future__ import annotations

from collections.abc import Callable

from clinograph.secure.errors import SchemaError

from ..data.alarm_demo import load_dictionary
from ..ingest import ingest, read_table
from ..ontology import FeatureDictionary, SiteSchema
from .config import SimulationConfig
from .simulation import SimulationResult, run_simulation


def load_tables(config: SimulationConfig):
    """Ingest every hospital's table; problems of all hospitals are reported together."""
    dictionary = FeatureDictionary.from_toml(config.dictionary) if config.dictionary else load_dictionary()
    tables, problems = [], []
    for h in config.hospitals:
        try:
            schema = SiteSchema.from_toml(h.schema_file)
            if schema.site != h.site:
                problems.append(f"[hospitals] site {h.site!r}: its schema {h.schema_file} says site {schema.site!r}.")
                continue
            tables.append(ingest(read_table(h.table), schema=schema, dictionary=dictionary))
        except SchemaError as exc:
            problems.extend(f"{h.site}: {p}" for p in exc.problems)
    if problems:
        raise SchemaError(problems, title="Hospital tables cannot be ingested")
    if len(tables) < 2:
        raise SchemaError([f"A federation needs at least 2 hospitals; the config lists {len(tables)}. "
                           "Add [[hospitals]] entries."], title="Too few hospitals")
    return tables, dictionary


def run_from_config(config: SimulationConfig, *, on_round: Callable[[int, dict], None] | None = None,
                    trainer_factory: Callable[..., object] | None = None) -> SimulationResult:
    """Ingest, build, run; the audit directory is ``<output>/audit``."""
    tables, dictionary = load_tables(config)
    audit_dir = config.output / "audit"
    if audit_dir.exists() and any(audit_dir.iterdir()):
        from clinograph.secure.errors import ConfigError

        raise ConfigError(f"Audit directory {audit_dir} already holds a run; choose another `output` or move it.")
    config.output.mkdir(parents=True, exist_ok=True)
    if trainer_factory is None and config.privacy.enabled:
        from functools import partial

        from ..privacy import dp_trainer_factory

        trainer_factory = partial(dp_trainer_factory, state_root=config.output / "privacy_state")
    return run_simulation(tables, dictionary, config, audit_dir=audit_dir, on_round=on_round,
                          trainer_factory=trainer_factory)
