"""NS-FL, the built-in task, registered on import (:mod:`clinograph.sdk.tasks` imports this by
name): :class:`.nsfl_task.NSFLTask`, or with ``[privacy] mode = "distributed"``
:class:`.dp_task.DistributedDPTask`; temporal, survival and modalities are configuration. AGAT
registers itself the same way (:mod:`clinograph.sdk.agat.registration`)."""

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

    if config.privacy.enabled and config.privacy.mode == "distributed":  # one DP-SGD step a round
        from .dp_task import build_distributed_task

        return build_distributed_task(table, dictionary=dictionary, config=config, split=split, state_dir=state_dir,
                                      identity=identity)
    from .nsfl_task import NSFLTask

    return NSFLTask(table, dictionary=dictionary, config=config, split=split, state_dir=state_dir, signer=identity)


def _nsfl_modules(config: HospitalConfig, *, dictionary: FeatureDictionary) -> ModuleMap:
    import torch

    from ..model.heads import nsfl_model
    from ..model.temporal import add_temporal_modules, temporal_task_model
    from ..training.personal import personal_module_map

    node_ids = dictionary.node_ids()
    torch.manual_seed(config.model.init_seed)  # the same draw the task makes
    model = temporal_task_model(len(node_ids), config) if config.model.temporal != "none" else \
        nsfl_model(len(node_ids), config)
    if config.model.modalities:  # modality nodes (sdk/model/modalities.py)
        from ..model.modalities import ModalityNSFL

        model = ModalityNSFL(len(node_ids), config.model, modalities=config.model.modalities)
    modules = add_temporal_modules(personal_module_map(model, node_ids, personal=config.personal.modules),
                                   model, node_ids)
    if config.model.modalities:
        from ..model.modalities import add_modality_modules

        add_modality_modules(modules, model)
    return modules


register_task("nsfl", build=_build_nsfl, modules=_nsfl_modules)
