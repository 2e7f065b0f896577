"""Federated Concept-Based Models (F-CMs): concept modules, DAG-structured models with
interventions, architecture adaptation and module-wise federation. See docs/concepts.md."""

from .adapt import AdaptReport, adapt_model, count_changed, fraction_changed
from .encoders import EmbeddingAdapter, MLPEncoder
from .graph import ConceptGraph
from .model import ConceptModel, ConceptOutput, fcm_loss, random_interventions
from .modules import GRAPH_BASED, ConceptHParams, create_node_module
from .params import (
    TASK_MODULE,
    freeze_unsupervised,
    get_module_vector,
    list_modules,
    model_spec,
    module_parameters,
    set_module_vector,
    state_vectors,
    trainable_modules,
)
from .task import ConceptTask, ConceptTraining, ConceptVote

__all__ = ["GRAPH_BASED", "TASK_MODULE", "AdaptReport", "ConceptGraph", "ConceptHParams", "ConceptModel",
           "ConceptOutput", "ConceptTask", "ConceptTraining", "ConceptVote", "EmbeddingAdapter", "MLPEncoder", "adapt_model", "count_changed",
           "create_node_module", "fcm_loss", "fraction_changed", "freeze_unsupervised", "get_module_vector",
           "list_modules", "model_spec", "module_parameters", "random_interventions", "set_module_vector",
           "state_vectors", "trainable_modules"]
