"""ConceptModel: encoder + one module per node along a ConceptGraph, with interventions (F-CMs 4.1).

``forward(x, interventions=...)`` evaluates nodes in topological order; a node's module
reads ``z`` and its parents' features. An intervention sets a node to given states for
chosen samples: its probabilities become one-hot and everything downstream is recomputed
from the intervened value along the DAG (nothing upstream changes).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .graph import ConceptGraph
from .modules import ConceptHParams, check_kind, create_node_module, feature_dim


def node_key(name: str) -> str:
    """ModuleDict key for a node name (``.`` is not allowed in keys)."""
    return "n_" + name.replace(".", "__dot__")


@dataclass
class ConceptOutput:
    """Per node: logits ``(B, card)`` and the probabilities actually propagated (after interventions)."""

    logits: dict[str, torch.Tensor]
    probs: dict[str, torch.Tensor]


class ConceptModel(nn.Module):
    """The shared CM ``w = (theta, phi, psi)``: encoder, concept modules and task decoder.

    Args:
        kind: ``cbm``, ``cem``, ``cgm`` or ``c2bm``.
        encoder: any module with ``forward(batch) -> [B, z_dim]`` (see :mod:`.encoders`).
        graph: nodes, cardinalities and parent sets (bipartite for cbm/cem).
        z_dim: encoder output size ``d``.
        hp: node-module sizes.
    """

    def __init__(self, *, kind: str, encoder: nn.Module, graph: ConceptGraph, z_dim: int,
                 hp: ConceptHParams | None = None):
        super().__init__()
        self.kind, self.graph, self.z_dim, self.hp = check_kind(kind), graph, z_dim, hp or ConceptHParams()
        self.encoder = encoder
        self._order = graph.order()
        self.nodes = nn.ModuleDict()
        for v in graph.nodes:
            self.nodes[node_key(v)] = create_node_module(
                kind, card=graph.cards[v], z_dim=z_dim, parent_blocks=self.parent_blocks(v),
                is_task=(v == graph.task), hp=self.hp)

    def parent_blocks(self, v: str) -> tuple[tuple[str, int], ...]:
        """``(parent, feature width)`` for the parents of ``v`` in order."""
        return tuple((p, feature_dim(self.kind, card=self.graph.cards[p], hp=self.hp))
                     for p in self.graph.parents_of(v))

    def module_of(self, v: str) -> nn.Module:
        """The module of node ``v``."""
        return self.nodes[node_key(v)]

    def forward(self, x, *, interventions: Mapping[str, torch.Tensor] | None = None) -> ConceptOutput:
        """Predict every node; ``interventions[v]`` is a LongTensor ``(B,)`` of states, ``-1`` = leave.

        Shapes:
            x: whatever the encoder takes (``(B, in_dim)`` for MLPEncoder).
            returns logits/probs ``(B, card_v)`` for every node ``v``.
        """
        z = self.encoder(x)
        feats: dict[str, torch.Tensor] = {}
        logits: dict[str, torch.Tensor] = {}
        probs: dict[str, torch.Tensor] = {}
        interventions = interventions or {}
        for v in self._order:
            mod = self.module_of(v)
            ps = self.graph.parents_of(v)
            par = torch.cat([feats[p] for p in ps], dim=1) if ps else z.new_zeros(z.shape[0], 0)
            out = mod(z, par)
            p = F.softmax(out.logits, dim=1)
            iv = interventions.get(v)
            if iv is not None:
                mask = iv >= 0
                # one-hot by comparison (F.one_hot checks its input's max: not vmap-able, sdk/concepts/dp.py)
                hard = (iv.clamp(min=0)[:, None] == torch.arange(self.graph.cards[v])).to(p.dtype)
                p = torch.where(mask[:, None], hard, p)
            logits[v], probs[v] = out.logits, p
            feats[v] = mod.feature(out, p)
        return ConceptOutput(logits, probs)


def fcm_loss(out: ConceptOutput, labels: Mapping[str, torch.Tensor], *, supervised: Collection[str],
             has_task: bool, task: str, gamma: float = 0.8) -> torch.Tensor:
    """Implements F-CMs eq. (2): ``gamma sum_{j in I(k)} L_c(c_j) + (1-gamma) 1[k in K^Y] L_t(y)``.

    ``labels[v]`` is a LongTensor ``(B,)`` with ``-1`` for a missing label; cross-entropy is
    averaged over a node's labelled rows. Nodes the model does not predict are skipped.
    """
    def ce(v: str) -> torch.Tensor | None:
        y = labels.get(v)
        if v not in out.logits or y is None:
            return None
        keep = y >= 0
        if not bool(keep.any()):
            return None
        return F.cross_entropy(out.logits[v][keep], y[keep])

    total = next(iter(out.logits.values())).new_zeros(()) if out.logits else torch.zeros(())
    for v in sorted(supervised):
        if v != task and (loss := ce(v)) is not None:
            total = total + gamma * loss
    if has_task and (loss := ce(task)) is not None:
        total = total + (1.0 - gamma) * loss
    return total


def random_interventions(labels: Mapping[str, torch.Tensor], *, nodes: Collection[str], p: float,
                         generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Training-time interventions (appendix D.3, after Espinosa Zarlenga et al. 2022):
    each labelled concept in ``nodes`` is set to its true value with probability ``p``."""
    out = {}
    for v in nodes:
        y = labels.get(v)
        if y is None:
            continue
        hit = torch.rand(y.shape, generator=generator) < p
        out[v] = torch.where(hit & (y >= 0), y, torch.full_like(y, -1))
    return out
