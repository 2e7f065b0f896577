"""NS-FL, the built-in task, registered on import (:mod:`clinograph.sdk.tasks` imports this by
name): :class:`.nsfl_task.NSFLTask`; temporal, survival, modalities and the DP mode are
configuration. AGAT registers itself the same way (:mod:`clinograph.sdk.agat.registration`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..tasks import register_task

if TYPE_CHECKING:
    from ..config import HospitalConfig
    from ..ingest.table import PatientTable
    from ..model.modules import ModuleMap
    from ..ontology import FeatureDictionary
    from .split import Split
    from .task import Task


def _build_nsfl(table: PatientTable, *, dictionary: FeatureDictionary, config: HospitalConfig, split: Split,
                state_dir: Path | None, identity: Any) -> Task:
    from .nsfl_task import NSFLTask

    return NSFLTask(table, dictionary=dictionary, config=config, split=split, state_dir=state_dir, signer=identity)


def _nsfl_modules(config: HospitalConfig, *, dictionary: FeatureDictionary) -> ModuleMap:
    from .nsfl_task import nsfl_task_model

    return nsfl_task_model(config, dictionary.node_ids())[1]  # the draw the task makes


register_task("nsfl", build=_build_nsfl, modules=_nsfl_modules)
