"""Patient-level DP-SGD for concept models (F-CMs appendix E.4, eqs. 3-4).

F-CMs trains every client with DP-SGD (Abadi et al. 2016) through Opacus: per-sample
gradients, each clipped to L2 norm C (eq. 4, C = 1.0), Gaussian noise σ·C added to the
(mini-batch) sum before the optimiser step, σ chosen by the accountant for (ε, δ) and the
training plan. Opacus's hooks do not know this package's :class:`~.layers.BlockLinear` (an
``nn.Linear`` with named blocks that may have no inputs), so the clipped sum here is computed by
ghost clipping (:func:`clipped_sum`, every parameter of a concept model is in a Linear layer);
:func:`per_sample_gradients` (``torch.func`` ``vmap`` of ``grad``, exact for any module but ~100×
slower) is the reference it is tested against.

The per-patient loss is F-CMs eq. (2) for one row, ``γ Σ_j CE(c_j) + (1−γ) CE(y)`` over the
nodes the client supervises (a missing label, ``-1``, contributes 0); on a batch whose rows
carry every supervised label its mean is :func:`~.model.fcm_loss`.

Two uses (the research loop :mod:`research.fcm_bnlearn.fcm_federation`):

- **local DP** (the paper's): :func:`dp_sgd_step` -- Poisson batch, clip, noise, mean over the
  expected batch, optimiser step -- at every local step of every client.
- **distributed DP** (issue 14): :func:`clipped_sum` gives a client's clipped per-patient
  gradient sum over the modules it trains, which the client quantises and noises with its
  Skellam share (:mod:`clinograph.sdk.privacy.distributed`).

Guarantees: one patient changes a client's clipped sum by at most C in L2 (tested). Does not
account ε (the caller calibrates σ) nor hide anything outside the gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn import functional as F  # noqa: N812

from .model import ConceptModel


def row_loss(model: ConceptModel, params: Mapping[str, torch.Tensor], x: torch.Tensor,
             labels: Mapping[str, torch.Tensor], interventions: Mapping[str, torch.Tensor], *,
             supervised: Collection[str], has_task: bool, task: str, gamma: float) -> torch.Tensor:
    """F-CMs eq. (2) for ONE patient (``x`` without batch dim; labels/interventions scalars)."""
    iv = {v: t.unsqueeze(0) for v, t in interventions.items()}
    out = functional_call(model, dict(params), (x.unsqueeze(0),), {"interventions": iv})
    total = x.new_zeros(())
    for v in sorted(supervised):
        if v != task and v in out.logits and v in labels:
            total = total + gamma * F.cross_entropy(out.logits[v], labels[v].unsqueeze(0), ignore_index=-1,
                                                    reduction="sum")
    if has_task and task in out.logits and task in labels:
        total = total + (1.0 - gamma) * F.cross_entropy(out.logits[task], labels[task].unsqueeze(0),
                                                        ignore_index=-1, reduction="sum")
    return total


def per_sample_gradients(model: ConceptModel, names: Sequence[str], x: torch.Tensor,
                         labels: Mapping[str, torch.Tensor], interventions: Mapping[str, torch.Tensor], *,
                         supervised: Collection[str], has_task: bool, task: str, gamma: float) -> torch.Tensor:
    """Each row's gradient of :func:`row_loss` w.r.t. the parameters ``names`` (in that order).

    Shapes:
        x: (B, in_dim); labels/interventions: node -> (B,) int64.  Returns (B, Σ numel).
    """
    b = int(x.shape[0])
    named = dict(model.named_parameters())
    dim = sum(named[n].numel() for n in names)
    if b == 0:
        return torch.zeros((0, dim), dtype=torch.float64)
    params = {n: named[n].detach() for n in names}

    def loss(p, xi, yi, ivi):
        return row_loss(model, p, xi, yi, ivi, supervised=supervised, has_task=has_task, task=task, gamma=gamma)

    lab = {v: y for v, y in labels.items()}
    grads = vmap(grad(loss), in_dims=(None, 0, 0, 0))(params, x, lab, dict(interventions))
    return torch.cat([grads[n].reshape(b, -1).double() for n in names], dim=1)


def clip_rows(g: torch.Tensor, clip: float) -> torch.Tensor:
    """F-CMs eq. (4): each row scaled by ``min(1, C/‖g_i‖₂)``."""
    norms = g.norm(dim=1, keepdim=True)
    return g * torch.clamp(clip / norms.clamp_min(1e-300), max=1.0)


def row_losses(model: ConceptModel, x: torch.Tensor, labels: Mapping[str, torch.Tensor],
               interventions: Mapping[str, torch.Tensor], *, supervised: Collection[str], has_task: bool, task: str,
               gamma: float) -> torch.Tensor:
    """:func:`row_loss` for every row at once (one batched forward). Shapes: (B,)."""
    out = model(x, interventions=dict(interventions))
    total = x.new_zeros((int(x.shape[0]),))
    for v in sorted(supervised):
        if v != task and v in out.logits and v in labels:
            total = total + gamma * F.cross_entropy(out.logits[v], labels[v], ignore_index=-1, reduction="none")
    if has_task and task in out.logits and task in labels:
        total = total + (1.0 - gamma) * F.cross_entropy(out.logits[task], labels[task], ignore_index=-1,
                                                        reduction="none")
    return total


def _keeper(store: dict[int, torch.Tensor], key: int):  # noqa: ANN202 - a tensor hook
    def hook(g: torch.Tensor) -> None:
        store[key] = g.detach()
    return hook


def clipped_sum(model: ConceptModel, names: Sequence[str], x: torch.Tensor, labels: Mapping[str, torch.Tensor],
                interventions: Mapping[str, torch.Tensor], *, clip: float, supervised: Collection[str],
                has_task: bool, task: str, gamma: float,
                groups: Sequence[Collection[str]] | None = None) -> torch.Tensor:
    """Σ_i clip(g_i) over the rows, the parameters ``names`` in order: one patient moves it by
    at most ``clip`` in L2. Shapes: (Σ numel,) float64.

    ``groups`` (a partition of ``names``, e.g. one group a module): per-group clipping
    (McMahan et al. 2018's per-layer clipping, Opacus ``clipping="per_layer"``): each row's
    gradient restricted to group j is clipped to ``clip/√G`` (G groups), so the whole row still
    moves the sum by at most ``clip``; one reweighted backward a group.

    Ghost clipping (Goodfellow 2015; Li et al. 2022; Opacus's ``ghost`` mode): every trainable
    parameter sits in an ``nn.Linear`` applied once per forward, so the per-row gradient norm
    is Σ_layers ‖a_i‖²‖δ_i‖² (+ ‖δ_i‖² for the bias) from the layer's input a and output
    gradient δ of one backward pass (a Linear over (B, T, ·) inputs gets its small per-row
    gradient computed explicitly); a second backward of Σ_i c_i·L_i with
    c_i = min(1, C/‖g_i‖) gives the clipped sum without materialising per-row gradients. Equal to
    clipping :func:`per_sample_gradients` (tested).

    Raises:
        ValueError: a trainable parameter outside an ``nn.Linear``.
    """
    named = dict(model.named_parameters())
    dim = sum(named[n].numel() for n in names)
    if int(x.shape[0]) == 0:
        return torch.zeros(dim, dtype=torch.float64)
    wanted = {id(named[n]) for n in names}
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    covered = {id(p) for m in linears for p in (m.weight, m.bias) if p is not None}
    if wanted - covered:
        raise ValueError("Ghost clipping needs every trained parameter inside an nn.Linear; this concept model "
                         "has others. Use per_sample_gradients + clip_rows instead.")
    acts: dict[int, torch.Tensor] = {}
    grads: dict[int, torch.Tensor] = {}

    def fwd(m: nn.Module, inp: tuple, out: torch.Tensor) -> None:
        a = inp[0]
        key = id(m)
        acts[key] = a.detach()
        if out.requires_grad:
            out.register_hook(_keeper(grads, key))

    handles = [m.register_forward_hook(fwd) for m in linears]
    try:
        losses = row_losses(model, x, labels, interventions, supervised=supervised, has_task=has_task, task=task,
                            gamma=gamma)
    finally:
        for h in handles:
            h.remove()
    if not losses.requires_grad:
        return torch.zeros(dim, dtype=torch.float64)
    for p in model.parameters():
        p.grad = None
    losses.sum().backward(retain_graph=True)
    parts = [set(names)] if groups is None else [set(g) for g in groups]
    if groups is not None and (sorted(n for g in parts for n in g) != sorted(names)):
        raise ValueError("clipped_sum: groups must partition names exactly.")
    group_of = {id(named[n]): j for j, g in enumerate(parts) for n in g}
    norm2 = torch.zeros((len(parts), int(x.shape[0])), dtype=torch.float64)
    for m in linears:
        d = grads.get(id(m))
        if d is None:
            continue
        a, d = acts[id(m)].double(), d.double()
        if a.dim() == 2:  # the ghost norm: ‖a_i δ_iᵀ‖² = ‖a_i‖²‖δ_i‖²
            w2, b2 = a.pow(2).sum(1) * d.pow(2).sum(1), d.pow(2).sum(1)
        else:  # a Linear over (B, T, ·) (CEM's state scores): this layer's per-row gradient, explicitly
            a, d = a.reshape(a.shape[0], -1, a.shape[-1]), d.reshape(d.shape[0], -1, d.shape[-1])
            w2 = torch.einsum("bti,bto->boi", a, d).pow(2).sum((1, 2))
            b2 = d.sum(1).pow(2).sum(1)
        if id(m.weight) in wanted and not getattr(m, "empty_in", False):
            norm2[group_of[id(m.weight)]] += w2
        if m.bias is not None and id(m.bias) in wanted:
            norm2[group_of[id(m.bias)]] += b2
    bound = clip / (len(parts) ** 0.5)
    factors = torch.clamp(bound / norm2.sqrt().clamp_min(1e-300), max=1.0)
    out = {}
    for j, part in enumerate(parts):
        for p in model.parameters():
            p.grad = None
        (losses * factors[j].to(losses.dtype)).sum().backward(retain_graph=j + 1 < len(parts))
        for n in part:
            g = named[n].grad
            out[n] = (g if g is not None else torch.zeros_like(named[n])).reshape(-1).double().clone()
    for p in model.parameters():
        p.grad = None
    return torch.cat([out[n] for n in names])


def set_gradients(model: ConceptModel, names: Sequence[str], flat: torch.Tensor) -> None:
    """``p.grad`` of every parameter in ``names`` from one flat vector (the order of ``names``)."""
    named = dict(model.named_parameters())
    at = 0
    for n in names:
        p = named[n]
        p.grad = flat[at:at + p.numel()].view_as(p).to(p.dtype).clone()
        at += p.numel()


def dp_sgd_step(model: ConceptModel, optimizer: torch.optim.Optimizer, names: Sequence[str], x: torch.Tensor,
                labels: Mapping[str, torch.Tensor], interventions: Mapping[str, torch.Tensor], *,
                noise_multiplier: float, clip: float, expected_batch: float, supervised: Collection[str],
                has_task: bool, task: str, gamma: float, noise: Callable | None = None,
                groups: Sequence[Collection[str]] | None = None) -> None:
    """One DP-SGD step (F-CMs E.4 as Opacus does it): the clipped sum plus N(0, σ²C²) from the
    CSPRNG (:func:`clinograph.sdk.privacy.noise.secure_gaussian`; ``noise`` replaces it in tests
    only), divided by the EXPECTED Poisson batch size (so an empty batch still steps on noise
    alone), then ``optimizer.step()``."""
    from ..privacy.noise import secure_gaussian

    s = clipped_sum(model, names, x, labels, interventions, clip=clip, supervised=supervised, has_task=has_task,
                    task=task, gamma=gamma, groups=groups)
    draw = noise or secure_gaussian
    noisy = (s + draw(noise_multiplier * clip, s.shape, torch.float64)) / max(expected_batch, 1e-12)
    optimizer.zero_grad(set_to_none=True)
    set_gradients(model, names, noisy)
    optimizer.step()


def module_groups(model: ConceptModel, names: Sequence[str]) -> list[list[str]]:
    """``names`` grouped by concept-model module (``encoder/...``, ``concept/<c>``, ``head/task``;
    :func:`.params.module_parameters`), for per-module clipping; empty groups dropped."""
    from .params import module_parameters

    by_id = {id(p): n for n, p in model.named_parameters()}
    wanted = set(names)
    groups = [[by_id[id(p)] for p in ps if by_id[id(p)] in wanted] for ps in module_parameters(model).values()]
    return [g for g in groups if g]


def trainable_names(model: ConceptModel) -> list[str]:
    """Names of the parameters that currently require a gradient (the client's modules)."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def poisson_rows(n: int, rate: float) -> np.ndarray:
    """Row indices each kept with probability ``rate`` (CSPRNG coins, never numpy.random)."""
    from ..privacy.distributed import poisson_sample

    return poisson_sample(n, rate)
