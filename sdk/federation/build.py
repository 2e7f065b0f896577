"""The one place that builds a hospital: its task, its client, its initial model.

Every caller -- ``clinograph simulate``, the demo, the Flower SuperNode's ClientApp, an
integrator's own code through ``clinograph.build_hospital`` -- goes through here, so a hospital
is the same object everywhere: the same split rule, the same release policy, the same DP
trainer and ledger location.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from clinograph.secure.runtime.build import InitialModel, ResolvedDefault

from clinograph.core.errors import ConfigError
from clinograph.core.identity import Identity, PublicIdentity
from clinograph.core.spec import ModuleKind

from ..config import DP_DEFAULT_MODEL_LINE, HospitalConfig, dp_default_model
from ..ingest import PatientTable, ingest
from ..ontology import FeatureDictionary, SiteSchema
from ..tasks import create_task
from .client import HospitalClient
from .split import split_patients
from .task import Task

if TYPE_CHECKING:
    from clinograph.secure.runtime.models import RunModels

    from .candidates import Candidate


def build_task(table: PatientTable, *, dictionary: FeatureDictionary, config: HospitalConfig,
               state_dir: Path | None = None, identity: Identity | None = None) -> Task:
    """The hospital's task for ``config.task`` over its ingested ``table``; with ``identity``, its DP
    ledger file is signed by the hospital (a tampered ledger is refused). With ``[model] features``
    a list, the task sees only those features' observations (:func:`.coverage.restrict`)."""
    from .coverage import restrict

    table = restrict(table, config.model.features)
    split = split_patients(table, config=config)
    return create_task(config.task).build(table, dictionary=dictionary, config=config, split=split,
                                          state_dir=state_dir, identity=identity)


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
    _check_arguments(table, dictionary=dictionary, config=config, identity=identity, server=server, peers=peers,
                     federation_id=federation_id)
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


def _check_arguments(table: object, *, dictionary: object, config: object, identity: object, server: object,
                     peers: object, federation_id: object) -> None:
    """Each of build_hospital's arguments is what it needs, else a ConfigError naming it, what came and
    the fix (an AttributeError deep inside, or a hospital holding the server's private key, before)."""
    import re

    from clinograph.secure.messages import ID_PATTERN

    wants = (("table", table, (pd.DataFrame, PatientTable), "your table (cg.read_table(...)) or cg.ingest(...)'s"),
             ("dictionary", dictionary, FeatureDictionary, "cg.FeatureDictionary.from_toml(...)"),
             ("config", config, HospitalConfig, "cg.HospitalConfig.from_toml('hospital.toml')"),
             ("identity", identity, Identity, "your hospital's key: cg.Identity.load(name, path to <name>.ed25519.pem)"))
    for name, value, kind, fix in wants:
        if not isinstance(value, kind):
            raise ConfigError(f"build_hospital: {name} is a {type(value).__name__}; pass {fix}.")
    if isinstance(server, Identity):
        raise ConfigError("build_hospital: server is the server's private Identity; a hospital holds only the server's "
                          "public key: pass federation.server_public() (load_federation('federation.toml')).")
    if not isinstance(server, PublicIdentity):
        raise ConfigError(f"build_hospital: server is a {type(server).__name__}; pass the server's PublicIdentity "
                          "(load_federation('federation.toml').server_public()).")
    if not isinstance(peers, Mapping) or not all(isinstance(k, str) and isinstance(v, PublicIdentity)
                                                 for k, v in peers.items()):
        raise ConfigError("build_hospital: peers must map each enrolled hospital's name to its PublicIdentity "
                          "(load_federation('federation.toml').enrolled()).")
    if not isinstance(federation_id, str) or not re.match(ID_PATTERN, federation_id):
        raise ConfigError(f"build_hospital: federation_id {federation_id!r} must match {ID_PATTERN} (letters, digits, "
                          "'_', '.', '-'; at most 64): the federation_id of federation.toml.")


def initial_model_for(config: HospitalConfig, *, dictionary: FeatureDictionary) -> InitialModel:
    """The initial model of a federation whose hospitals use ``config``'s task and model
    settings, without any table (``clinograph model init``; what a lean server loads): the
    registered task's modules (:mod:`clinograph.sdk.tasks`)."""
    from ..model.settings import config_settings_digest

    modules = create_task(config.task).modules(config, dictionary=dictionary)
    return InitialModel.create(task=config.task, dictionary_hash=dictionary.digest(), spec=modules.spec(version=0),
                               state=modules.state(ModuleKind.SHARED), settings_sha256=config_settings_digest(config),
                               defaults=resolved_defaults(config))


def resolved_defaults(config: HospitalConfig) -> tuple[ResolvedDefault, ...]:
    """The settings of ``config`` a rule of the SDK resolved, for the server to audit and log: the
    DP default model (:func:`..config.dp_default_model`), else none."""
    if not dp_default_model(config):
        return ()
    return (ResolvedDefault(setting="model.deep", value="false", rule="dp_default_model", line=DP_DEFAULT_MODEL_LINE),)


def run_models(config: HospitalConfig, *, dictionary: FeatureDictionary,
               candidates: Sequence[Candidate] | None = None) -> RunModels:
    """What a federation run trains (``clinograph model init`` writes it; ``simulate()`` builds
    the same): each candidate of ``config`` (``[selection] candidates`` × ``restarts``; none: the
    config's own model, named ``model``) with its initial model, the selection rule (None
    when selection is off: DP, fedopt, no validation split) and the set-up sums the config asks
    for (:func:`.setup.setup_sums`). The initial models are built on ``dictionary`` and the
    config as written: neither the scales a set-up sum derives nor a ``"shared"`` feature list
    changes a model's shapes or initial values (:mod:`.setup`)."""
    from clinograph.secure.runtime.elimination import EliminationRule
    from clinograph.secure.runtime.models import CandidateModel, RunModels
    from clinograph.secure.runtime.selection import SelectionRule

    from .candidates import Candidate, candidate_configs
    from .member import canonical
    from .setup import setup_sums

    own = create_task(config.task).run_models
    if own is not None:  # a task whose run is not its candidates' (concepts: a voted run)
        return own(config, dictionary=dictionary)
    if candidates is None:
        candidates = candidate_configs(config)
    cands = list(candidates) or [Candidate(name="model", overrides={}, config=config)]
    rule = (SelectionRule(patience=config.selection.patience, min_delta=float(config.selection.min_delta))
            if config.selection_active() else None)
    halving = rule is not None and len(cands) > 1 and config.selection.elimination == "successive_halving"
    return RunModels(task=config.task, selection=rule, candidates=tuple(
        CandidateModel(name=c.name, overrides=canonical(c.overrides),
                       initial=initial_model_for(_hospital_config(c.config), dictionary=dictionary))
        for c in cands), setup=setup_sums(config, dictionary=dictionary, candidates=list(candidates)),
        elimination=EliminationRule() if halving else None)


def _hospital_config(config: HospitalConfig) -> HospitalConfig:
    hospital_config = getattr(config, "hospital_config", None)
    return hospital_config() if callable(hospital_config) else config


def initial_model(task: Task, *, dictionary: FeatureDictionary) -> InitialModel:
    """The model a federation starts from (what the server holds; ``clinograph model init``)."""
    from ..model.settings import task_settings_digest

    return InitialModel.create(task=task.name, dictionary_hash=dictionary.digest(), spec=task.modules.spec(version=0),
                               state=task.modules.state(ModuleKind.SHARED), settings_sha256=task_settings_digest(task))
