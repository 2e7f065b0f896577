"""The AGAT network at one hospital and its named modules (the unit of sharing).

Modules (every hospital declares the same ones, so the ModelSpec is the federation's):

================================  ========  ==============================================
name                              kind      trained by
================================  ========  ==============================================
``augmentation/<f>`` (μ_f, log σ_f)  shared    hospitals that observe f (moment estimate)
``gat/layer1``, ``gat/layer2``    shared    every hospital
``temporal/mlp``                  shared    hospitals with time snapshots (eqs. 7-8)
``head/task``                     shared    every hospital (``[personal] modules`` may make
                                            it, or any module above, personal)
``metric/validation``             shared    model selection's (Σ loss, n_val), never trained
================================  ========  ==============================================

Personal by default: nothing in the network. What stays at the hospital is its patients'
fixed augmentation draws z, its kNN graph and its Platt calibration (fitted on its own
validation split) -- none of them is a module, none ever leaves.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from clinograph.core.errors import ConfigError
from clinograph.core.spec import ModuleKind

from ..config import AGATSection
from ..model.modules import ModuleMap, Piece
from ..model.nsfl_modules import SELECTION_MODULE
from ..training.personal import selection_parameter
from .augmentation import AlignmentAugmentation
from .gat import GATEncoder, TaskHead
from .temporal import TemporalEmbedding, with_previous_step


class AGATModel(nn.Module):
    """Augmentation → (temporal embedding) → GAT layers → head.

    Shapes:
        current, previous: [N, n] augmented features (previous None for a static table),
        edge_index: [2, E] -> logits [N]
    """

    def __init__(self, n_features: int, config: AGATSection):
        super().__init__()
        self.augmentation = AlignmentAugmentation(n_features)
        self.temporal = TemporalEmbedding(n_features, hidden=config.temporal_hidden)
        self.encoder = GATEncoder(n_features, hidden=config.hidden, heads=config.heads, dropout=config.dropout)
        self.head = TaskHead(config.hidden)

    def forward(self, current: torch.Tensor, previous: torch.Tensor | None, edge_index: torch.Tensor) -> torch.Tensor:
        x = with_previous_step(current, previous, self.temporal)
        return self.head(self.encoder(x, edge_index))

    def network_parameters(self, *, temporal: bool) -> list[nn.Parameter]:
        """What the optimiser trains: GAT layers, head, and the temporal MLP when it is used."""
        mods: list[nn.Module] = [self.encoder, self.head] + ([self.temporal] if temporal else [])
        return [p for m in mods for p in m.parameters()]


def agat_modules(model: AGATModel, node_ids: Sequence[str], *, personal: Sequence[str] = (),
                 selection: bool = True) -> ModuleMap:
    """The module map above; ``personal``: names or prefixes ending in ``/`` kept personal.

    Raises:
        ConfigError: a personal name matches no module (the known ones are listed).
    """
    mm = ModuleMap()
    for i, nid in enumerate(node_ids):
        mm.add(f"augmentation/{nid}", ModuleKind.SHARED, [Piece(model.augmentation.gaussian, i)])
    mm.add_submodule("gat/layer1", ModuleKind.SHARED, model.encoder.layer1)
    mm.add_submodule("gat/layer2", ModuleKind.SHARED, model.encoder.layer2)
    mm.add_submodule("temporal/mlp", ModuleKind.SHARED, model.temporal)
    mm.add_submodule("head/task", ModuleKind.SHARED, model.head)
    names = mm.names()
    unknown = [p for p in personal if not any(n == p or (p.endswith("/") and n.startswith(p)) for n in names)]
    if unknown:
        raise ConfigError(f"[personal] modules {unknown} are not AGAT modules. Known: augmentation/<feature>, "
                          "gat/layer1, gat/layer2, temporal/mlp, head/task (prefixes end in '/').")
    out = mm.with_kinds(lambda n, k: ModuleKind.PERSONAL if any(
        n == p or (p.endswith("/") and n.startswith(p)) for p in personal) else k)
    if selection:
        out.add(SELECTION_MODULE, ModuleKind.SHARED, [Piece(selection_parameter())])
    return out
