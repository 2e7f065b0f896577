"""F-CMs registered as task ``concepts`` (:mod:`clinograph.sdk.tasks` imports this by name): a voted
run (:mod:`clinograph.secure.runtime.voted`) whose hospital is a :class:`~.member.ConceptMember`
built from its files, so the ServerApp and the SuperNode factory run it as ``run_concept_federation``
runs it in process.

From a hospital's ``data-dir``: ``table.csv`` (its features, label and concept columns),
``schema.toml`` (its SiteSchema; ``concepts`` names the concept columns it records) and
``hospital.toml`` with ``task = "concepts"`` and ``[concepts]`` (:class:`~clinograph.sdk.config.
ConceptsSection`: the public concept list, states and model settings, and this hospital's own
``edges``). The encoder is an MLP over the standardised values and the observed mask of every
dictionary feature. ``clinograph model init`` writes the vote model and the vote settings; the
concept model is derived by the hospitals after the vote, never written before.

``simulate()`` refuses the task: its tables carry no concept columns and its hospitals share one
config, so no hospital would have its own proposal; run it with
:func:`~.federation.run_concept_federation` in process, or over Flower.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..tasks import register_task

if TYPE_CHECKING:
    from clinograph.secure.runtime.models import RunModels

    from ..config import HospitalConfig
    from ..federation.split import Split
    from ..federation.task import Task
    from ..ingest.table import PatientTable
    from ..model.modules import ModuleMap
    from ..ontology import FeatureDictionary
    from .member import ConceptMember

REFUSED_IN_SIMULATE = ("task = \"concepts\" is a voted run whose hospitals each read their concept columns and propose "
                       "their own DAG; simulate() has neither. Run it with clinograph.sdk.concepts.federation."
                       "run_concept_federation in process, `clinograph demo --concepts`, or over Flower "
                       "(docs/concepts.md).")


#: why ``[selection]`` is refused for concept runs, in every [privacy] mode (docs/privacy.md, "The DP matrix")
NO_MODEL_CHOICE = ("a concept run has no model choice to make, with or without DP: the voted run trains the one "
                   "model derived from the vote and keeps its last round (no candidates, restarts, early stopping "
                   "or kept round; the task reports no validation loss), so there is no validation statistic to "
                   "release, privately or not.")


def problems(config: HospitalConfig) -> list[str]:
    """Everything wrong with ``[concepts]`` for a voted run, at once."""
    c = config.concepts
    out = []
    if len(c.concepts) < 2 or len(set(c.concepts)) != len(c.concepts):
        out.append("[concepts] concepts must list at least two distinct nodes, the task included")
    if c.task not in c.concepts:
        out.append(f"[concepts] task {c.task!r} must be one of concepts")
    missing = [n for n in c.concepts if n != c.task and not c.states.get(n)]
    if missing:
        out.append(f"[concepts] states lacks {missing[:5]} (each concept's states as its column holds them)")
    extra = sorted(set(c.states) - set(c.concepts))
    if extra:
        out.append(f"[concepts] states names {extra[:5]}, which are not concepts")
    if config.selection.enabled:
        out.append(f"[selection] enabled = true: {NO_MODEL_CHOICE} Remove it (or set enabled = false)")
    return out


def _check(config: HospitalConfig, *, where: str) -> None:
    from clinograph.core.errors import ConfigError

    found = problems(config)
    if found:
        raise ConfigError(f"{where}: task = \"concepts\": " + "; ".join(found) + ".")


def cards(config: HospitalConfig) -> dict[str, int]:
    """States per node (the task's: 2)."""
    c = config.concepts
    return {n: (2 if n == c.task else len(c.states[n])) for n in c.concepts}


def _vote_modules(config: HospitalConfig, *, dictionary: FeatureDictionary) -> ModuleMap:
    from .task import concept_module_map

    _check(config, where="hospital config")
    return concept_module_map(None, concepts=config.concepts.concepts)[0]


def run_models(config: HospitalConfig, *, dictionary: FeatureDictionary) -> RunModels:
    """What ``clinograph model init`` writes: the vote model (candidate ``vote``) and the vote settings."""
    from clinograph.secure.runtime.build import InitialModel
    from clinograph.secure.runtime.models import CandidateModel, RunModels, VotePhase

    from clinograph.core.spec import ModuleKind

    modules = _vote_modules(config, dictionary=dictionary)
    initial = InitialModel.create(task="concepts", dictionary_hash=dictionary.digest(), spec=modules.spec(version=0),
                                  state=modules.state(ModuleKind.SHARED))
    c = config.concepts
    return RunModels(task="concepts", selection=None,
                     candidates=(CandidateModel(name="vote", overrides="{}", initial=initial),),
                     vote=VotePhase(concepts=c.concepts, task=c.task, seed=config.training.seed, rounds=c.vote_rounds))


def _refused(table: PatientTable, *, dictionary: FeatureDictionary, config: HospitalConfig, split: Split,
             state_dir: Path | None, identity: Any) -> Task:
    from clinograph.core.errors import ConfigError

    raise ConfigError(REFUSED_IN_SIMULATE)


def site_from_files(data: Path, *, config: HospitalConfig, dictionary: FeatureDictionary) -> Any:
    """The :class:`~.federation.ConceptSite` of the hospital whose files are in ``data``: inputs (the
    standardised values and observed mask of every dictionary feature), concept labels from the
    columns its schema names, the task from its label, its split and its own DAG proposal."""
    import numpy as np
    import torch

    from clinograph.core.errors import ConfigError

    from ..federation.split import split_patients
    from ..ingest import ingest, read_site_table
    from ..ontology import SiteSchema
    from .federation import ConceptSite
    from .labels import concept_labels

    _check(config, where=str(data / "hospital.toml"))
    c = config.concepts
    table_path = next((data / f for f in ("table.csv", "table.parquet") if (data / f).exists()), data / "table.csv")
    schema = SiteSchema.from_toml(data / "schema.toml")
    df = read_site_table(table_path, schema)
    table = ingest(df, schema=schema, dictionary=dictionary)
    labels = concept_labels(df, schema=schema, table=table, states=c.states)
    labels[c.task] = torch.from_numpy(np.asarray(table.labels, dtype=np.int64))
    values, seen = table.dense()
    inputs = torch.from_numpy(np.concatenate([np.nan_to_num(values), seen], axis=1).astype(np.float32))
    nodes = tuple(n for n in c.concepts if n in (schema.concepts or ()) or n == c.task)
    stray = [e for e in c.edges if e[0] not in nodes or e[1] not in nodes]
    if stray:
        raise ConfigError(f"{data / 'hospital.toml'}: [concepts] edges {stray[:3]} name nodes this hospital does not "
                          f"supervise (its schema's concepts and the task: {list(nodes)}). Propose edges among those.")
    return ConceptSite(name=table.site, inputs=inputs, labels=labels, split=split_patients(table, config=config),
                       nodes=nodes, edges=tuple((a, b) for a, b in c.edges))


def settings_from_config(config: HospitalConfig, *, in_dim: int) -> Any:
    """The federation's shared :class:`~.federation.ConceptSettings` from ``[concepts]``."""
    from .encoders import MLPEncoder
    from .federation import ConceptSettings
    from .modules import ConceptHParams
    from .task import ConceptTraining

    c = config.concepts
    return ConceptSettings(concepts=c.concepts, task=c.task, cards=cards(config), kind=c.kind,
                           encoder=lambda: MLPEncoder(in_dim, c.z_dim, c.encoder_hidden), z_dim=c.z_dim,
                           seed=config.training.seed, hp=ConceptHParams(hidden=c.hidden, emb=c.emb),
                           training=ConceptTraining(lr=c.lr, batch_size=c.batch_size, gamma=c.gamma,
                                                    p_intervention=c.p_intervention, seed=config.training.seed),
                           privacy=config.privacy if config.privacy.enabled else None)


def participant(*, node_config: Mapping[str, Any], config: HospitalConfig, dictionary: FeatureDictionary,
                federation: Any, identity: Any, data: Path) -> ConceptMember:
    """The hospital of a voted run from its files (the SuperNode factory's, module docstring)."""
    from .federation import concept_member

    site = site_from_files(data, config=config, dictionary=dictionary)
    state = Path(str(node_config["state-dir"]))
    return concept_member(site, settings_from_config(config, in_dim=int(site.inputs.shape[1])), identity=identity,
                          server=federation.server_public(), peers=federation.enrolled(),
                          federation_id=federation.federation_id, dictionary_hash=dictionary.digest(),
                          release=config.release, ledger_dir=state / "privacy", state_dir=state)


register_task("concepts", build=_refused, modules=_vote_modules, validation=False, run_models=run_models,
              participant=participant)
