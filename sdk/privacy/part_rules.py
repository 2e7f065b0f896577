"""Part rules: how a leaf's per-patient gradients follow from its calls (the engine's registry).

A rule takes a leaf, its calls' (input, output gradient) pairs in one forward and the batch size,
and returns each trainable parameter's :class:`~.ghost.LayerPart`. Built in: ``nn.Linear`` (and
subclasses, the concepts' ``BlockLinear`` included), ``nn.Conv1d`` (a Linear over its output
positions) and ``nn.Embedding``; a task registers its own leaf types with
:func:`register_part_rule` (the survival head's baseline, :mod:`.survival`). A leaf type without a
rule makes the engine refuse the model, naming the registered ones.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from clinograph.core.errors import PrivacyError

from .ghost import EmbeddingWeight, Formed, LayerPart, LinearWeight, positions

#: how a leaf's per-patient gradients follow from its calls' (input, output gradient) pairs:
#: (module, calls, batch size) -> {parameter: its LayerPart}; extended by :func:`register_part_rule`
PartRule = Callable[[nn.Module, list[tuple[torch.Tensor, torch.Tensor]], int], dict[int, LayerPart]]
PART_RULES: dict[type, PartRule] = {}


def register_part_rule(cls: type) -> Callable[[PartRule], PartRule]:
    """Teach the engine a leaf type (its parameters' per-patient gradients from its calls)."""
    def deco(rule: PartRule) -> PartRule:
        PART_RULES[cls] = rule
        return rule
    return deco


@register_part_rule(nn.Linear)
def _linear_parts(mod: nn.Module, calls: list[tuple[torch.Tensor, torch.Tensor]], b: int) -> dict[int, LayerPart]:
    """A Linear layer's calls concatenated over positions (one part a parameter). A
    ``BlockLinear`` with no input blocks (``empty_in``) outputs its bias alone: no weight part."""
    pos = [positions(a.to(g.dtype), g, b) for a, g in calls]
    out: dict[int, LayerPart] = {}
    weight = mod.weight
    if weight.requires_grad and not getattr(mod, "empty_in", False):
        out[id(weight)] = LinearWeight(pos)
    bias = mod.bias
    if bias is not None and bias.requires_grad:
        out[id(bias)] = Formed(pos[0][1][:, 0] if len(pos) == 1 and pos[0][1].shape[1] == 1
                               else sum(g3.sum(1) for _, g3 in pos))
    return out


@register_part_rule(nn.Conv1d)
def _conv1d_parts(mod: nn.Module, calls: list[tuple[torch.Tensor, torch.Tensor]], b: int) -> dict[int, LayerPart]:
    """A 1-D convolution is a Linear over its output positions: input patches (unfolded)
    [B, L_out, C_in·k] against output gradients [B, L_out, C_out] (groups = 1, zero padding)."""
    if mod.groups != 1 or mod.padding_mode != "zeros" or isinstance(mod.padding, str):
        raise PrivacyError(f"Per-patient gradients: Conv1d with groups={mod.groups}, padding={mod.padding!r}, "
                           f"padding_mode={mod.padding_mode!r} is outside the engine's rule (groups 1, integer "
                           "zero padding). Change the layer or register a rule for it.")
    pos = []
    for a, g in calls:
        patches = F.unfold(a.to(g.dtype).unsqueeze(2), kernel_size=(1, mod.kernel_size[0]), dilation=(1, mod.dilation[0]),
                           padding=(0, mod.padding[0]), stride=(1, mod.stride[0]))
        pos.append((patches.transpose(1, 2), g.transpose(1, 2)))
    out: dict[int, LayerPart] = {}
    if mod.weight.requires_grad:
        out[id(mod.weight)] = LinearWeight(pos)
    if mod.bias is not None and mod.bias.requires_grad:
        out[id(mod.bias)] = Formed(sum(g3.sum(1) for _, g3 in pos))
    return out


@register_part_rule(nn.Embedding)
def _embedding_parts(mod: nn.Module, calls: list[tuple[torch.Tensor, torch.Tensor]],
                     b: int) -> dict[int, LayerPart]:
    """An Embedding's looked-up rows: patient i's output gradients at its indices."""
    if not mod.weight.requires_grad:
        return {}
    d = calls[0][1].shape[-1]
    idx = [a.reshape(b, -1) for a, _ in calls]
    g = [g.reshape(b, -1, d) for _, g in calls]
    idx, g = (idx[0], g[0]) if len(calls) == 1 else (torch.cat(idx, dim=1), torch.cat(g, dim=1))
    return {id(mod.weight): EmbeddingWeight(idx, g, mod.num_embeddings)}


def rule_of(mod: nn.Module) -> PartRule | None:
    """The part rule of ``mod``'s type or its nearest registered base class."""
    for cls in type(mod).__mro__:
        if cls in PART_RULES:
            return PART_RULES[cls]
    return None
