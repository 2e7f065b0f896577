"""The four concept-module instantiations of F-CMs section 4.3 / appendix C.

Every node ``v`` (a concept, or the task ``Y``) gets one module. A module maps the input
representation ``z`` and the *features* of its parents to logits over the node's states,
and turns probabilities over its states into the feature its children read:

=======  ===============================================  ==========================
kind     node module                                      feature sent downstream
=======  ===============================================  ==========================
cbm      concept: MLP(z); task: MLP(concept probs)        probabilities (card)
cem      concept: per-state embeddings e_s(z), scored;    mixture sum_s p_s e_s (r)
         task: MLP(mixtures)
cgm      every node: CEM-style module of [z, parent       mixture (r)
         mixtures]
c2bm     every node: exogenous u_v = MLP(z); logits =     probabilities (card)
         head(u_v) + <theta_v(u_v), parent probs>, with
         theta_v from a hypernetwork
=======  ===============================================  ==========================

CEM is written for categorical concepts with ``card`` states (one embedding a state,
``logit_s = w . e_s + b``); with two states it is the paper's ``c+ / c-`` pair. For C2BM the
root head is kept on non-root nodes too (``head(u_v)`` plays the role of ``b_V`` in
appendix C, made input-dependent) so that adding a parent with zero-initialised
coefficients leaves the module's output unchanged (exact warm start).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from clinograph.core.errors import RegistryError

from .layers import BlockLinear, Blocks, mlp_tail


@dataclass(frozen=True)
class ConceptHParams:
    """Hidden width, concept-embedding size ``r`` and MLP depth of every node module."""

    hidden: int = 64
    emb: int = 16
    depth: int = 1


@dataclass
class NodeOut:
    """A module's output: logits ``(B, card)`` and, for embedding kinds, ``(B, card, r)`` states."""

    logits: torch.Tensor
    states: torch.Tensor | None = None


class NodeModule(nn.Module):
    """Base: ``forward(z, parents) -> NodeOut``; ``feature(out, probs) -> (B, feature_dim)``."""

    kind = ""
    uses_z = True

    def __init__(self, *, card: int, z_dim: int, parent_blocks: Blocks, is_task: bool, hp: ConceptHParams):
        super().__init__()
        self.card, self.z_dim, self.is_task, self.hp = card, z_dim, is_task, hp
        self.parent_blocks: Blocks = tuple(parent_blocks)

    def interface(self) -> tuple:
        """What E1/E2 compare: a module whose interface is unchanged keeps its parameters."""
        return (self.kind, self.card, self.z_dim, self.parent_blocks, self.is_task, self.hp)

    @property
    def feature_dim(self) -> int:  # noqa: D102
        raise NotImplementedError

    def feature(self, out: NodeOut, probs: torch.Tensor) -> torch.Tensor:
        """The representation children read, given (possibly intervened) probabilities."""
        return probs


def _in_blocks(z_dim: int, parent_blocks: Blocks, uses_z: bool) -> Blocks:
    return ((("z", z_dim),) if uses_z else ()) + tuple(parent_blocks)


class _EmbeddingNode(NodeModule):
    """CEM-style: per-state embeddings from [z?, parents], scored into logits."""

    def __init__(self, **kw):
        super().__init__(**kw)
        hp = self.hp
        self.inp = BlockLinear(_in_blocks(self.z_dim, self.parent_blocks, self.uses_z), hp.hidden)
        self.tail = mlp_tail(hp.hidden, self.card * hp.emb, hp.depth)
        self.score = nn.Linear(hp.emb, 1)

    @property
    def feature_dim(self) -> int:  # noqa: D102
        return self.hp.emb

    def forward(self, z: torch.Tensor, parents: torch.Tensor) -> NodeOut:  # noqa: D102
        x = torch.cat([z, parents], dim=1) if self.uses_z else parents
        states = self.tail(self.inp(x)).view(-1, self.card, self.hp.emb)
        return NodeOut(self.score(states).squeeze(-1), states)

    def feature(self, out: NodeOut, probs: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return torch.einsum("bs,bsr->br", probs, out.states)


class _MlpNode(NodeModule):
    """A plain MLP from [z?, parents] to logits."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.inp = BlockLinear(_in_blocks(self.z_dim, self.parent_blocks, self.uses_z), self.hp.hidden)
        self.tail = mlp_tail(self.hp.hidden, self.card, self.hp.depth)

    @property
    def feature_dim(self) -> int:  # noqa: D102
        return self.card

    def forward(self, z: torch.Tensor, parents: torch.Tensor) -> NodeOut:  # noqa: D102
        x = torch.cat([z, parents], dim=1) if self.uses_z else parents
        return NodeOut(self.tail(self.inp(x)))


class CBMConcept(_MlpNode):
    """CBM concept: ``c_j = h_j(z)`` (Koh et al. 2020; appendix C)."""

    kind = "cbm"


class CBMTask(_MlpNode):
    """CBM task decoder: ``y = f(c_M)``, an MLP over all concept probabilities, no ``z``."""

    kind = "cbm"
    uses_z = False


class CEMConcept(_EmbeddingNode):
    """CEM concept: state embeddings from ``z`` and the mixture ``p e+ + (1-p) e-`` (appendix C)."""

    kind = "cem"


class CEMTask(_MlpNode):
    """CEM task decoder over the concatenated concept mixtures (no ``z``)."""

    kind = "cem"
    uses_z = False


class CGMNode(_EmbeddingNode):
    """CGM node: ``c_j = h_j(c~_PA(j), z)``, CEM-style over ``z`` and parent mixtures."""

    kind = "cgm"


class C2BMNode(NodeModule):
    """C2BM node: exogenous ``u_v = MLP(z)``; ``logits = head(u_v) + <theta_v, p_PA>``,
    ``theta_v = r_phi(u_v)`` a hypernetwork (appendix C)."""

    kind = "c2bm"

    def __init__(self, **kw):
        super().__init__(**kw)
        hp = self.hp
        self.exo = nn.Sequential(nn.Linear(self.z_dim, hp.hidden), mlp_tail(hp.hidden, hp.emb, hp.depth))
        self.head = nn.Linear(hp.emb, self.card)
        self.n_par = sum(w for _, w in self.parent_blocks)
        if self.n_par:
            self.hyper_in = nn.Linear(hp.emb, hp.hidden)
            self.hyper_out = BlockLinear((("h", hp.hidden),), 0,
                                         out_blocks=[(n, w * self.card) for n, w in self.parent_blocks])

    @property
    def feature_dim(self) -> int:  # noqa: D102
        return self.card

    def forward(self, z: torch.Tensor, parents: torch.Tensor) -> NodeOut:  # noqa: D102
        u = self.exo(z)
        logits = self.head(u)
        if self.n_par:
            theta = self.hyper_out(nn.functional.leaky_relu(self.hyper_in(u)))
            logits = logits + torch.einsum("bk,bks->bs", parents, theta.view(-1, self.n_par, self.card))
        return NodeOut(logits)


_KINDS: dict[str, tuple[type[NodeModule], type[NodeModule]]] = {
    "cbm": (CBMConcept, CBMTask), "cem": (CEMConcept, CEMTask),
    "cgm": (CGMNode, CGMNode), "c2bm": (C2BMNode, C2BMNode),
}
GRAPH_BASED = frozenset({"cgm", "c2bm"})


def check_kind(kind: str) -> str:
    """Validate an instantiation name; a miss lists the options."""
    if kind not in _KINDS:
        raise RegistryError(f"Unknown concept model {kind!r}. Registered: {', '.join(sorted(_KINDS))}.")
    return kind


def create_node_module(kind: str, *, card: int, z_dim: int, parent_blocks: Blocks, is_task: bool,
                       hp: ConceptHParams) -> NodeModule:
    """The module for one node of instantiation ``kind`` (cbm, cem, cgm, c2bm)."""
    cls = _KINDS[check_kind(kind)][1 if is_task else 0]
    return cls(card=card, z_dim=z_dim, parent_blocks=parent_blocks, is_task=is_task, hp=hp)


def feature_dim(kind: str, *, card: int, hp: ConceptHParams) -> int:
    """Width of the feature a concept of instantiation ``kind`` sends to its children."""
    return hp.emb if check_kind(kind) in ("cem", "cgm") else card
