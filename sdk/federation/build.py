"""The one place that builds a hospital: its task, its client, its initial model.

Every caller -- ``clinograph simulate``, the demo, the Flower SuperNode's ClientApp, an
integrator's own code through ``clinograph.build_hospital`` -- goes through here, so a hospital
is the same object everywhere: the same split rule, the same release policy, the same DP
trainer and ledger location.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd
from clinograph.secure.errors import ConfigError
from clinograph.secure.identity import Identity, PublicIdentity
from clinograph.secure.runtime.build import InitialModel
from clinograph.secure.spec import ModuleKind

from ..config import HospitalConfig
from ..ingest import PatientTable, ingest
from ..ontology import FeatureDictionary, SiteSchema
from .client import HospitalClient
from .nsfl_task import NSFLTask
from .split import hospital_split
from .task import Task


def _signer(identity: Identity | None, table: PatientTable) -> Identity:
    if identity is None:
        raise ConfigError(f"Hospital {table.site!r} trains with DP but was given no signing identity for its privacy "
                          "ledger (there is no unsigned ledger): pass identity=, the hospital's Identity.")
    return identity


def build_task(table: PatientTable, *, dictionary: FeatureDictionary, config: HospitalConfig,
               state_dir: Path | None = None, identity: Identity | None = None) -> Task:
    """The hospital's task for ``config.task`` over its ingested ``table``; with ``identity``, its DP
    ledger file is signed by the hospital (a tampered ledger is refused). With ``[model] features``
    a list, the task sees only those features' observations (:func:`.coverage.restrict`)."""
    from .coverage import restrict

    table = restrict(table, config.model.features)
    split = hospital_split(table.labels, site=table.site, test_fraction=config.split.test_fraction,
                           validation_fraction=config.split.validation_fraction, seed=config.split.seed)
    if config.task == "nsfl" and config.privacy.enabled and config.privacy.mode == "distributed":
        if config.model.temporal != "none":
            raise ConfigError("[model] temporal with [privacy] mode = 'distributed': the distributed DP task "
                              "trains the static star model. Use mode = 'local' (the sequence is one DP sample) "
                              "or temporal = 'none'.")
        from .dp_task import (  # distributed DP: one DP-SGD step a round
            DistributedDPTask,
            hospital_policy,
        )

        root = Path(config.privacy.state_dir) / table.site if config.privacy.state_dir else state_dir
        if root is None:
            raise ConfigError(f"Hospital {table.site!r} trains with distributed DP but has no state directory for "
                              "its ledger: set [privacy] state_dir (or pass state_dir).")
        return DistributedDPTask(table, dictionary=dictionary, config=config, split=split,
                                 policy=hospital_policy(config), state_dir=Path(root), signer=_signer(identity, table))
    if config.task == "nsfl":
        return NSFLTask(table, dictionary=dictionary, config=config, split=split, state_dir=state_dir,
                        signer=identity)
    if config.task == "agat":
        from ..agat import AGATTask  # AGAT (Molaei et al. 2024): sdk/agat, docs/agat.md

        return AGATTask(table, dictionary=dictionary, config=config, split=split)
    raise ConfigError(f"Unknown task {config.task!r}. Registered: nsfl, agat.")  # pragma: no cover - Literal guards it


def build_hospital(table: pd.DataFrame | PatientTable, *, dictionary: FeatureDictionary, config: HospitalConfig,
                   identity: Identity, server: PublicIdentity, peers: Mapping[str, PublicIdentity],
                   federation_id: str, schema: SiteSchema | None = None, state_dir: Path | None = None,
                   task: Task | None = None) -> HospitalClient:
    """Validate and map ``table`` (a SchemaError lists every problem), build the task and the
    client that answers the server's rounds.

    Args:
        table: the hospital's own table (with ``schema``) or an already ingested PatientTable.
        state_dir: where this hospital keeps state (its DP ledger, its audit anchor and last
            global model: :mod:`.anchor`); required under DP unless ``[privacy] state_dir`` is set.
        task: an already built task (e.g. a concept model); default: built from ``config``.
    """
    if isinstance(table, PatientTable):
        pt = table
    else:
        if schema is None:
            raise ConfigError("build_hospital needs the hospital's SiteSchema to map a raw table.")
        pt = ingest(table, schema=schema, dictionary=dictionary)
    if pt.site != identity.name:
        raise ConfigError(f"The table belongs to site {pt.site!r} but the signing identity is {identity.name!r}; "
                          "use the hospital's own key (its file name names the site).")
    task = task or build_task(pt, dictionary=dictionary, config=config, state_dir=state_dir, identity=identity)
    return HospitalClient(task=task, identity=identity, server=server, peers=peers,
                          dictionary_hash=dictionary.digest(), federation_id=federation_id, release=config.release,
                          state_dir=state_dir)


def initial_model_for(config: HospitalConfig, *, dictionary: FeatureDictionary) -> InitialModel:
    """The initial model of a federation whose hospitals use ``config``'s task and model
    settings, without any table (``clinograph model init``; what a lean server loads)."""
    import torch

    from ..model.heads import nsfl_model
    from ..training.personal import personal_module_map

    node_ids = dictionary.node_ids()
    torch.manual_seed(config.model.init_seed)  # the same draw the task makes
    if config.task == "agat":
        from ..agat.model import AGATModel, agat_modules

        modules = agat_modules(AGATModel(len(node_ids), config.agat), node_ids, personal=config.personal.modules,
                               selection=config.model.selection_module)
    else:
        from ..model.temporal import add_temporal_modules, temporal_task_model

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
    return InitialModel.create(task=config.task, dictionary_hash=dictionary.digest(), spec=modules.spec(version=0),
                               state=modules.state(ModuleKind.SHARED))


def initial_model(task: Task, *, dictionary: FeatureDictionary) -> InitialModel:
    """The model a federation starts from (what the server holds; ``clinograph model init``)."""
    return InitialModel.create(task=task.name, dictionary_hash=dictionary.digest(), spec=task.modules.spec(version=0),
                               state=task.modules.state(ModuleKind.SHARED))
