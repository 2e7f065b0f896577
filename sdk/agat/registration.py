"""AGAT registered as task ``agat`` (:mod:`clinograph.sdk.tasks` imports this by name)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..tasks import register_task

if TYPE_CHECKING:
    from ..config import HospitalConfig
    from ..federation.split import Split
    from ..federation.task import Task
    from ..ingest.table import PatientTable
    from ..model.modules import ModuleMap
    from ..ontology import FeatureDictionary


def _build_agat(table: PatientTable, *, dictionary: FeatureDictionary, config: HospitalConfig, split: Split,
                state_dir: Path | None, identity: Any) -> Task:
    from .task import AGATTask  # AGAT (Molaei et al. 2024): docs/agat.md

    return AGATTask(table, dictionary=dictionary, config=config, split=split)


def _agat_modules(config: HospitalConfig, *, dictionary: FeatureDictionary) -> ModuleMap:
    from ..seeding import torch_seeded
    from .model import AGATModel, agat_modules

    node_ids = dictionary.node_ids()
    with torch_seeded(config.model.init_seed):
        model = AGATModel(len(node_ids), config.agat)
    return agat_modules(model, node_ids, personal=config.personal.modules, selection=config.model.selection_module)



register_task("agat", build=_build_agat, modules=_agat_modules)
