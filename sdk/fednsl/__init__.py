"""FedNSL (Xing, Lu, Yu, ICML 2024): federated neuro-symbolic rule learning on Clinograph's graphs.

One module a job: :mod:`.rules` (rules and the rule space), :mod:`.predicates` (the ontology's
symbolic predicates and fuzzy values), :mod:`.graph` (a hospital's knowledge graph, eq. 8's
path values), :mod:`.generator` (the server's transformer T_θ, eqs. 5-6), :mod:`.scorer` (the
hospital's E-step, eqs. 2, 8-11), :mod:`.client` (a hospital's round), :mod:`.task` (the
runtime task), :mod:`.federation` (a run over the runtime, secure by default), :mod:`.gmm`
(the paper's synthetic experiment, section 4.1.1). See docs/fednsl.md.
"""

from .client import EStepSettings, HospitalRules
from .graph import HospitalGraph
from .predicates import fuzzy_values, predicate_names
from .rules import Rule, RuleSpace
from .scorer import ScorerSettings

__all__ = ["EStepSettings", "HospitalGraph", "HospitalRules", "Rule", "RuleSpace", "ScorerSettings", "fuzzy_values",
           "predicate_names"]
