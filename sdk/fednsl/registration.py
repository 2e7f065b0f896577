"""FedNSL registered as task ``fednsl`` (:mod:`clinograph.sdk.tasks` imports this by name).

With ``task = "fednsl"`` (``[fednsl]`` settings) a hospital is built from its table and config like
every registered task, so FedNSL runs as the one run in ``simulate()`` and over Flower's
SuperNodes alike (Algorithm 1 / 2 of Xing, Lu, Yu, ICML 2024; :mod:`.task` for a round):

- the rule space is public and derived, never sent: every hospital and ``clinograph model init``
  enumerate it from the dictionary's predicates and ``[fednsl] head`` / ``max_len``
  (:func:`rule_space_for`); ``model init`` writes it as ``rule_space.json`` for the server's
  ``fednsl_rules`` strategy, whose options pin its SHA-256 -- and each hospital refuses a plan whose
  pinned digest is not that of the space it derived itself;
- the server's M-step is the strategy's built-in categorical one; the transformer generator
  (:mod:`.generator`) runs beside the server in :func:`.federation.run_rules_federation`;
- FedNSL reports no validation loss, so no model selection (no candidates, no early stopping),
  and its E-step is not differentially private: ``[privacy]`` is refused.
"""

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
    from .rules import RuleSpace

#: the server's strategy for this task
STRATEGY = "fednsl_rules"
RULE_SPACE_FILE = "rule_space.json"


def rule_space_for(config: HospitalConfig, *, dictionary: FeatureDictionary) -> RuleSpace:
    """The federation's public rule space: ``[fednsl] head`` over every body of 1..``max_len``
    predicates of ``dictionary`` (:func:`.predicates.predicate_names`)."""
    from .predicates import predicate_names
    from .rules import RuleSpace

    s = config.fednsl
    preds = predicate_names(dictionary, missing=s.missing_predicates, normal=s.normal_predicates)
    return RuleSpace.enumerate(heads=(s.head,), predicates=preds, max_len=s.max_len)


def uniform_prior(space: RuleSpace) -> Any:
    import numpy as np

    return np.full((len(space.heads), space.n_bodies), 1.0 / space.n_bodies)


def strategy_options(config: HospitalConfig, *, dictionary: FeatureDictionary, directory: Path
                     ) -> tuple[str, dict[str, str | int]]:
    """Write the rule space to ``directory/rule_space.json``; ``("fednsl_rules", options)`` that pin
    it (``[federation] strategy`` and ``strategy_options`` of ``server.toml`` or of a simulation).
    The strategy's public sampling seed is the hospitals' ``[training] seed``."""
    from .federation import write_rule_space

    path = Path(directory).resolve() / RULE_SPACE_FILE
    sha = write_rule_space(rule_space_for(config, dictionary=dictionary), path)
    return STRATEGY, {"rule_space": str(path), "rule_space_sha256": sha, "seed": int(config.training.seed)}


def _refusals(config: HospitalConfig) -> list[str]:
    return [why for why, bad in (
        ("[privacy] (FedNSL's E-step is not differentially private: the posterior mixture would be outside the "
         "accountant); remove [privacy] or use task = \"nsfl\"", config.privacy.enabled),
        ("[selection] enabled = true (FedNSL reports no validation loss to select on); remove it",
         config.selection.enabled is True),
        (f"[target] kind = {config.target.kind!r} (rules have a binary head)", config.target.kind != "binary")) if bad]


def _build_fednsl(table: PatientTable, *, dictionary: FeatureDictionary, config: HospitalConfig, split: Split,
                  state_dir: Path | None, identity: Any) -> Task:
    import numpy as np

    from clinograph.core.errors import ConfigError

    from .client import EStepSettings, HospitalRules
    from .graph import HospitalGraph
    from .scorer import ScorerSettings
    from .task import RulesTask

    refused = _refusals(config)
    if refused:
        raise ConfigError(f"Hospital {table.site!r}: task = \"fednsl\" does not take " + "; ".join(refused) + ".")
    s = config.fednsl
    space = rule_space_for(config, dictionary=dictionary)
    settings = EStepSettings(scorer=ScorerSettings(kl_weight=s.kl_weight, kl_direction=s.kl_direction, steps=s.steps,
                                                   lr=s.lr), draws=s.draws, fast_after=s.fast_after)
    graph = HospitalGraph.build(table, space.predicates, k=s.k_similar)
    labels = np.asarray(table.labels, dtype=np.int64)
    rules = HospitalRules(space=space, graph=graph, labels={s.head: labels}, train=np.asarray(split.train),
                          settings=settings)
    return RulesTask(rules=rules, prior=uniform_prior(space), test=np.asarray(split.test), seed=config.training.seed,
                     rule_space_sha256=space.sha256())


def _fednsl_modules(config: HospitalConfig, *, dictionary: FeatureDictionary) -> ModuleMap:
    from .task import rule_modules

    space = rule_space_for(config, dictionary=dictionary)
    return rule_modules(space, uniform_prior(space))


register_task("fednsl", build=_build_fednsl, modules=_fednsl_modules, validation=False, strategy=strategy_options)
