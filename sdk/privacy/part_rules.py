"""Part rules: how a leaf's per-patient gradients follow from its calls (the engine's registry).

A rule takes a leaf, its calls' (input, output gradient) pairs in one forward and the batch size,
and returns each trainable parameter's :class:`~.ghost.LayerPart`. Built in: ``nn.Linear`` (and
subclasses, the concepts' ``BlockLinear`` included; the piecewise encoding's ``KnotLinear`` has its own),
``nn.Conv1d`` (a Linear over its output
positions) and ``nn.Embedding``; a task registers its own leaf types with
:func:`register_part_rule` (the survival head's baseline, :mod:`.survival`). A leaf type without a
rule makes the engine refuse the model, naming the registered ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from clinograph.core.errors import PrivacyError

from ..model.layers import KnotLinear
from .ghost import EmbeddingWeight, Formed, KnotWeight, LayerPart, LinearWeight, positions

#: how a leaf's per-patient gradients follow from its calls' (input, output gradient) pairs (the input
#: is a tuple when the leaf was called with several, e.g. ``KnotLinear(h, B(x))``):
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
    out: dict[int, LayerPart] = {}
    params = mod._parameters  # directly: Module.__getattr__ and a missed getattr cost ~0.5-1 µs each, 17 calls a step
    weight, bias = params["weight"], params.get("bias")
    w_wanted = weight.requires_grad and not mod.__dict__.get("empty_in", False)
    b_wanted = bias is not None and bias.requires_grad
    if len(calls) == 1 and calls[0][0].dim() == 2:  # one call on [B, d_in]: one position, kept 2-D
        a, g = calls[0]
        a = a if a.dtype == g.dtype else a.to(g.dtype)
        w_part = out[id(weight)] = LinearWeight([], flat2d=(a, g)) if w_wanted else None
        if b_wanted:  # g_i(bias) = b_i, squared once for both
            out[id(bias)] = Formed(g, norm2_of=w_part.out_norms2 if w_part is not None else None, bias_of=w_part)
        return out
    pos = [positions(a if a.dtype == g.dtype else a.to(g.dtype), g, b) for a, g in calls]
    if w_wanted:
        out[id(weight)] = LinearWeight(pos)
    if b_wanted:
        g_sum = pos[0][1].sum(1)
        for _, g3 in pos[1:]:
            g_sum.add_(g3.sum(1))
        out[id(bias)] = Formed(g_sum)
    return out


@register_part_rule(KnotLinear)
def _knot_parts(mod: nn.Module, calls: list[tuple[Any, torch.Tensor]], b: int) -> dict[int, LayerPart]:
    """The piecewise encoding's U: its calls on (h, B(x)) (the per-copy path) as a
    :class:`~.ghost.KnotWeight`; called on h alone (the table path) it is a Linear."""
    plain = [isinstance(a, torch.Tensor) for a, _ in calls]
    if all(plain):
        return _linear_parts(mod, calls, b)
    if any(plain):
        raise PrivacyError("Per-patient gradients: a KnotLinear called both on h and on (h, B(x)) in one forward "
                           "is outside the engine's rule. Use one form per forward.")
    if not mod.weight.requires_grad:
        return {}
    h, bs, g = [], [], []
    for (a, basis), out in calls:  # per position (the basis varies with it: no stride-0 shortcut)
        h.append(a.to(out.dtype).reshape(b, -1, a.shape[-1]))
        g.append(out.reshape(b, -1, out.shape[-1]))
        bs.append(basis.to(out.dtype).reshape(b, -1, basis.shape[-1]))
    if len(calls) == 1:  # the forward's knot sort, when its basis reached the rule as it was (same dtype)
        (_, basis), out = calls[0]
        pairs = mod.pairs_of(basis) if basis.dtype == out.dtype else False
        return {id(mod.weight): KnotWeight(h[0], bs[0], g[0], pairs)}
    return {id(mod.weight): KnotWeight(torch.cat(h, 1), torch.cat(bs, 1), torch.cat(g, 1))}


def _knot_sample(layer: KnotLinear, activations: list[torch.Tensor], backprops: torch.Tensor) -> dict:
    """Opacus grad sampler of a :class:`KnotLinear` (the rule above, formed per sample)."""
    h = activations[0].to(backprops.dtype)
    if not layer.weight.requires_grad:
        return {}
    if len(activations) == 1:
        return {layer.weight: torch.einsum("n...i,n...j->nij", backprops, h)}
    kb = (activations[1].to(backprops.dtype).unsqueeze(-1) * backprops.unsqueeze(-2)).flatten(-2)
    return {layer.weight: torch.einsum("n...i,n...j->nij", kb, h)}


def register_opacus_samplers() -> None:
    """Teach Opacus's hooks mode the :class:`KnotLinear` per-sample gradient (for comparisons and
    tests; the engine does not use Opacus). Imports Opacus (seconds), hence not done at import."""
    from .opacus_import import import_opacus

    import_opacus()  # Opacus's import-time logging.basicConfig: not on the host's root logger
    from opacus.grad_sample.utils import register_grad_sampler

    register_grad_sampler(KnotLinear)(_knot_sample)


@register_part_rule(nn.Conv1d)
def _conv1d_parts(mod: nn.Module, calls: list[tuple[torch.Tensor, torch.Tensor]], b: int) -> dict[int, LayerPart]:
    """A 1-D convolution is a Linear over its output positions: input patches (unfolded)
    [B, L_out, C_in·k] against output gradients [B, L_out, C_out] (groups = 1, zero padding)."""
    if mod.groups != 1 or mod.padding_mode != "zeros" or isinstance(mod.padding, str):
        raise PrivacyError(f"Per-patient gradients: Conv1d with groups={mod.groups}, padding={mod.padding!r}, "
                           f"padding_mode={mod.padding_mode!r} is outside the engine's rule (groups 1, integer "
                           "zero padding). Change the layer or register a rule for it.")
    pos = []
    (k,), (dilation,), (pad,), (stride,) = mod.kernel_size, mod.dilation, mod.padding, mod.stride
    for a, g in calls:
        a = a.to(g.dtype)
        if dilation == 1:  # the padded signal's windows as a strided view, copied once into [B, C_in·k, L_out]
            padded = F.pad(a, (pad, pad)) if pad else a
            # and read transposed ([B, L_out, C_in·k] with unit stride along L_out): the window copy's inner loop
            # runs along the output positions instead of the k taps, and the forming product reads both operands
            # position-contiguous (waveform encoder, B = 64: conv1 30 -> 23 µs, conv2 52 -> 44 µs). contiguous():
            # with one input channel the reshape is still a view of overlapping windows, which the product
            # reads several times slower than the copy costs
            patches = padded.unfold(2, k, stride).transpose(2, 3).reshape(b, a.shape[1] * k, -1).contiguous()
            patches = patches.transpose(1, 2)
        else:
            patches = F.unfold(a.unsqueeze(2), kernel_size=(1, k), dilation=(1, dilation), padding=(0, pad),
                               stride=(1, stride)).transpose(1, 2)
        pos.append((patches, g.transpose(1, 2)))
    out: dict[int, LayerPart] = {}
    if mod.weight.requires_grad:
        out[id(mod.weight)] = LinearWeight(pos)
    if mod.bias is not None and mod.bias.requires_grad:
        g_sum = pos[0][1].sum(1)
        for _, g3 in pos[1:]:
            g_sum.add_(g3.sum(1))
        out[id(mod.bias)] = Formed(g_sum)
    return out


@register_part_rule(nn.Embedding)
def _embedding_parts(mod: nn.Module, calls: list[tuple[torch.Tensor, torch.Tensor]],
                     b: int) -> dict[int, LayerPart]:
    """An Embedding's looked-up rows: patient i's output gradients at its indices."""
    if not mod.weight.requires_grad:
        return {}
    d = calls[0][1].shape[-1]
    idx = [a if a.dim() == 2 and a.shape[0] == b else a.reshape(b, -1) for a, _ in calls]
    g = [g if g.dim() == 3 and g.shape[0] == b else g.reshape(b, -1, d) for _, g in calls]
    idx, g = (idx[0], g[0]) if len(calls) == 1 else (torch.cat(idx, dim=1), torch.cat(g, dim=1))
    return {id(mod.weight): EmbeddingWeight(idx, g, mod.num_embeddings)}


def rule_of(mod: nn.Module) -> PartRule | None:
    """The part rule of ``mod``'s type or its nearest registered base class."""
    for cls in type(mod).__mro__:
        if cls in PART_RULES:
            return PART_RULES[cls]
    return None
