"""The per-patient engine: per-patient gradients, their clipped sum and one DP-SGD step, for every
task that trains under local DP (NS-FL static and temporal stars, the survival head, concept models).

DP-SGD (Abadi et al. 2016, Algorithm 1) needs each patient's gradient g_i, clipped to
ḡ_i = g_i · min(1, C/‖g_i‖), and the sum Σ_i ḡ_i. Every trainable parameter sits on a leaf the
engine has a rule for (``nn.Linear`` and subclasses such as the concepts' ``BlockLinear``,
``nn.Embedding``, ``nn.Conv1d`` (the waveform encoder), the survival head's baseline;
:func:`register_part_rule`), whose per-patient
gradients follow from what the ordinary backward pass already has -- each call's input a_i and
the gradient of the summed loss with respect to its output b_i -- as in the book-keeping
algorithm (Bu, Wang, Zha, Karypis 2023, "Differentially private optimization on large model at
small cost", sec. 3). A layer called several times in one forward (the attention's W on sources
and destinations) adds its calls' contributions per patient (calls are recorded by wrapping the
leaves' ``forward`` for one pass). The norms and the clipped sum come
from :mod:`.ghost`, without forming g_i where a ghost norm is cheaper: one forward, one
``autograd.grad`` to the leaves' outputs (no parameter gradients), no second backward.

Why not Opacus here: its hooks, per-parameter clipping loop and Poisson DataLoader made a DP
epoch 3.1× the non-DP epoch of the same model (research/dp_trust_models/dp_overhead.py); the
concepts' former ghost clipping needed a second backward. Exactness is tested against a
per-patient loop for every task (tests/sdk/privacy/test_per_sample_grads.py,
test_survival_dp.py, tests/sdk/concepts/test_dp.py) and checked once at construction on a
synthetic probe (no patient data): Σ_i g_i must equal the ordinary batch gradient of every
trainable parameter, else :class:`PrivacyError` (a parameter the engine does not see, e.g. one
used outside its module, would make the clip bound nothing).

One patient = one row: the objective is a sum of per-patient terms, each reading only its own
row (its star, its snapshot sequence, its follow-up, its concept labels); nothing couples rows,
which is what makes the clip patient-level.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from clinograph.core.errors import PrivacyError

from . import ghost
from .ghost import (
    ONE_POSITION_LIMIT,
    Formed,
    LayerPart,
    LinearWeight,
    OnePositionLayers,
    SmallParts,
    Workspace,
    workspace,
)
from .noise import NoiseRows
from .part_rules import PART_RULES, register_part_rule, rule_of

__all__ = ["ClippedSum", "PerPatientClipper", "dp_sgd_step", "register_part_rule", "star_objective", "star_probe"]


def star_loss_sum(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Σ_i BCE_i: a sum of per-patient terms, so ∂/∂(layer output of i) involves patient i only."""
    return F.binary_cross_entropy_with_logits(logits, y, reduction="sum")


#: Σ_i ℓ_i of a batch: (model, inputs, labels) -> scalar. Must be a sum of per-patient terms, each
#: reading only its patient's row (checked on the probe only as far as sums go: tests compare
#: every task's objective with a per-patient loop).
Objective = Callable[[nn.Module, Sequence[Any], Any], torch.Tensor]


def star_objective(model: nn.Module, inputs: Sequence[Any], labels: torch.Tensor) -> torch.Tensor:
    """The binary star model's Σ_i BCE_i (``inputs``: feature index, values, mask)."""
    logits = model(*inputs)
    return star_loss_sum(logits, labels.to(logits.dtype))


@dataclass(frozen=True)
class ClippedSum:
    """One step's result. ``summed``: Σ_i ḡ_i over all trainable parameters, flat [P] in
    :attr:`PerPatientClipper.params` order; ``norms``: ‖g_i‖ before clipping [B] (local only,
    never released); ``loss``: mean loss of the batch (local only)."""

    summed: torch.Tensor
    norms: torch.Tensor
    loss: float


class PerPatientClipper:
    """Per-patient gradients of a model's trainable parameters, their norms and clipped sum
    (module docstring): the one engine of every local-DP task (NS-FL static and temporal stars,
    the survival head, concept models).

    Built once per hospital run for one model (its parameter objects stay, their values change
    when a round loads the global model in place). ``params`` are the trainable parameters at
    construction (frozen ones, e.g. ``similar_to`` under DP, are left out); each is owned by a
    leaf with a part rule (:data:`PART_RULES`: ``nn.Linear`` and its subclasses, ``nn.Embedding``,
    and what a task registers). The leaves are wrapped only for the duration of one forward pass.

    Args:
        model: the model. objective: Σ_i ℓ_i of a batch (default: the binary star model's BCE).
        probe: synthetic inputs (no patient data) to check Σ_i g_i against the batch gradient at
            construction; probe_labels: their labels (default: 0/1 alternating).

    Raises:
        PrivacyError: a trainable parameter not owned by a supported leaf, an embedding with
            ``max_norm``/``padding_idx``/sparse gradients, or a probe whose per-patient gradients
            do not add up to the batch gradient.
    """

    def __init__(self, model: nn.Module, *, objective: Objective = star_objective,
                 probe: Sequence[Any] | None = None, probe_labels: Any = None):
        self.model, self.objective = model, objective
        self.params: list[nn.Parameter] = [p for p in model.parameters() if p.requires_grad]
        self.sizes = [p.numel() for p in self.params]
        self.dim = int(sum(self.sizes))
        starts = [0, *torch.tensor(self.sizes, dtype=torch.long).cumsum(0).tolist()[:-1]] if self.sizes else []
        self._slices = list(zip(starts, self.sizes, strict=True))
        wanted = {id(p) for p in self.params}
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self.leaves: list[nn.Module] = []
        owner: dict[int, str] = {}  # a trainable parameter's leaf
        for name, mod in model.named_modules():
            own = [p for p in mod.parameters(recurse=False) if id(p) in wanted]
            if not own:
                continue
            for p in own:  # one part a parameter (_parts): a second leaf's calls would replace the first's
                if id(p) in owner:
                    raise PrivacyError(f"Per-patient gradients: a trainable parameter is shared by modules "
                                       f"{owner[id(p)] or 'the model'!r} and {name or 'the model'!r} (tied "
                                       "weights); the engine takes each parameter's per-patient gradient from "
                                       "one module, so the other's share would be left out of the norm and the "
                                       "clip would bound nothing. Give each module its own parameter, call one "
                                       "module twice instead, or freeze the shared parameter.")
                owner[id(p)] = name
            if rule_of(mod) is None:
                raise PrivacyError(f"Per-patient gradients: trainable parameters of {name or 'the model'!r} "
                                   f"({type(mod).__name__}) are on a module the engine has no rule for "
                                   f"(registered: {', '.join(sorted(c.__name__ for c in PART_RULES))}). Freeze "
                                   "them, build the model from those leaves, or register_part_rule its type.")
            if isinstance(mod, nn.Embedding) and (mod.max_norm is not None or mod.padding_idx is not None or mod.sparse):
                raise PrivacyError(f"Per-patient gradients: embedding {name!r} uses max_norm/padding_idx/sparse, "
                                   "which the engine does not model. Use a plain nn.Embedding.")
            self.leaves.append(mod)
        self._rules = {id(m): rule_of(m) for m in self.leaves}
        self._calls: list[tuple[nn.Module, Any, torch.Tensor]] = []
        self._workspace = Workspace()  # the clipped sum's formed g_i, reused step to step (.ghost.Workspace)
        self._grad: torch.Tensor | None = None  # the noised gradient the parameters' .grad view (assign)
        self._grad_views: list[torch.Tensor] = []
        self._noise: NoiseRows | None = None  # the DP-SGD steps' noise, drawn several steps ahead
        self._indicators: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # OnePositionLayers
        if probe is not None:
            self.self_check(*probe, labels=probe_labels)

    # -- forward with the layer calls recorded -------------------------------------------------
    def _recorder(self, module: nn.Module) -> Callable[..., Any]:
        """``module``'s forward, recording (module, input(s), output) of every call. Set as the
        instance's ``forward`` for one pass: unlike a forward hook it keeps ``Module.__call__`` on
        its fast path (hooks: about 4 µs more a call)."""
        forward, calls = module.forward, self._calls

        def record(*args: Any, **kwargs: Any) -> Any:
            out = forward(*args, **kwargs)
            calls.append((module, args[0] if len(args) == 1 else args, out))
            return out

        return record

    def _parts(self, inputs: Sequence[Any], labels: Any, *,
               inference: bool = False) -> tuple[dict[int, LayerPart], float]:
        """One forward (leaf calls recorded), one ``autograd.grad`` to the leaves' outputs, each
        parameter's :class:`~.ghost.LayerPart`; and the mean loss. ``inference``: the parts are built
        in ``torch.inference_mode`` (no version counters or view tracking: ~1 µs less an operation),
        for a caller that keeps no tensor of them (:meth:`clipped_sum`); else under ``no_grad``.
        The calls' inputs are not detached: the rules run without autograd, and the parts live for
        one step."""
        b = int(inputs[0].shape[0])
        self._calls = []
        own = [(m, m.__dict__.get("forward")) for m in self.leaves]  # an instance forward already set stays
        for m in self.leaves:  # the instance dict directly: Module.__setattr__/__delattr__ cost ~1.3 µs a leaf
            m.__dict__["forward"] = self._recorder(m)
        try:
            loss = self.objective(self.model, inputs, labels)
        finally:
            for m, before in own:
                if before is None:
                    del m.__dict__["forward"]
                else:
                    m.__dict__["forward"] = before
        calls, self._calls = self._calls, []
        outs = [o for _, _, o in calls]
        grads = torch.autograd.grad(loss, outs, allow_unused=True) if outs and loss.requires_grad else [None] * len(outs)
        by_module: dict[int, tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]] = {}
        for (mod, a, _), g in zip(calls, grads, strict=True):
            if g is not None:
                by_module.setdefault(id(mod), (mod, []))[1].append((a, g))
        parts: dict[int, LayerPart] = {}
        with torch.inference_mode() if inference else torch.no_grad():
            for mod, mod_calls in by_module.values():
                for pid, part in self._rules[id(mod)](mod, mod_calls, b).items():
                    if pid in self._index:  # else frozen
                        parts[self._index[pid]] = part
        return parts, float(loss.detach()) / max(b, 1)

    def per_sample(self, *inputs: Any, labels: Any) -> tuple[list[torch.Tensor | None], float]:
        """([B, *p.shape] gradient of each patient's own loss for every parameter in
        :attr:`params`, None where the batch never reached it), mean loss of the batch. Forms
        every g_i: the reference path (tests, the construction check, distributed DP's rows)."""
        b = int(inputs[0].shape[0])
        parts, loss = self._parts(inputs, labels)
        with torch.no_grad():
            return [parts[i].per_sample().reshape(b, *p.shape) if i in parts else None
                    for i, p in enumerate(self.params)], loss

    def parts(self, *inputs: Any, labels: Any) -> dict[int, LayerPart]:
        """Each reached parameter's :class:`~.ghost.LayerPart` by its index in :attr:`params` (one
        forward, one ``autograd.grad``; built in ``torch.inference_mode``: read them there), for a
        caller computing its own norms and sums (:func:`~.parts_sum.parts_clipped_sum`)."""
        return self._parts(inputs, labels, inference=True)[0]

    def flat(self, grads: Sequence[torch.Tensor | None], b: int, dtype: torch.dtype) -> torch.Tensor:
        """The per-patient gradients as one [B, P] matrix (zeros where a parameter was not reached)."""
        cols = [g.reshape(b, -1) if g is not None else torch.zeros((b, n), dtype=dtype)
                for g, n in zip(grads, self.sizes, strict=True)]
        return torch.cat(cols, dim=1) if cols else torch.zeros((b, 0), dtype=dtype)

    def clipped_sum(self, *inputs: Any, labels: Any, clip_norm: float,
                    groups: Sequence[Collection[nn.Parameter]] | None = None) -> ClippedSum:
        """Σ_i g_i · min(1, C/(‖g_i‖ + 1e-6)) (Opacus's flat-clipping factor), flat [P], without
        forming g_i where a ghost norm is cheaper (:mod:`.ghost`); no second backward.

        ``groups`` (a partition of :attr:`params`): per-group clipping (McMahan et al. 2018;
        Opacus ``clipping="per_layer"``), each patient's gradient restricted to group j clipped
        to C/√G, so the whole row still moves the sum by at most C."""
        b = int(inputs[0].shape[0])
        dtype = self.params[0].dtype if self.params else torch.float32
        if b == 0:
            return ClippedSum(torch.zeros(self.dim, dtype=dtype), torch.zeros(0, dtype=dtype), 0.0)
        group_of, n_groups = self._groups(groups)
        with workspace(self._workspace):  # the parts formed for this sum only: buffers reused step to step
            parts, loss = self._parts(inputs, labels, inference=True)
            with torch.inference_mode():
                one, small, rest = self._together(parts, dtype) if n_groups == 1 else (None, None, parts)
                if n_groups == 1:  # one group: ‖g_i‖ computed once, for the factor and the result
                    sqs = [part.norm2() for part in rest.values()] + ([one[0].norm2()] if one is not None else []) \
                        + ([small[0].norm2()] if small is not None else [])
                    # a fresh sum (a part's norm2 may be a tensor it keeps): two operations, not one a part
                    total = None if not sqs else sqs[0] if len(sqs) == 1 else torch.add(sqs[0], sqs[1]) \
                        if len(sqs) == 2 else torch.stack(sqs).sum(0)
                    norms = total.sqrt() if total is not None else torch.zeros(b, dtype=dtype)
                    rows = [torch.div(clip_norm, norms + 1e-6).clamp_(max=1.0)]
                else:
                    norm2 = torch.zeros((n_groups, b), dtype=dtype)
                    for i, part in parts.items():
                        norm2[group_of[i]] += part.norm2()
                    norms = norm2.sum(0).sqrt()
                    factor = ((clip_norm / n_groups ** 0.5) / (norm2.sqrt() + 1e-6)).clamp(max=1.0)
                    rows = list(factor.unbind(0))  # each group's c [B], indexed once
                done: dict[int, torch.Tensor] = {}
                if one is not None:
                    for (w_i, b_i), (w_sum, b_sum) in zip(one[2], one[0].clipped(rows[0]), strict=True):
                        done[w_i] = w_sum
                        if b_i is not None:
                            done[b_i] = b_sum
                if small is not None:
                    done.update(zip(small[1], small[0].clipped(rows[0]), strict=True))
                pieces = [done[i] if i in done else parts[i].clipped(rows[group_of[i]]) if i in parts
                          else torch.zeros(n, dtype=dtype) for i, (_, n) in enumerate(self._slices)]
        with torch.no_grad():  # outside inference mode: what leaves the engine is an ordinary tensor
            summed = torch.cat(pieces) if pieces else torch.zeros(0, dtype=dtype)
            return ClippedSum(summed, norms, loss)

    def _together(self, parts: dict[int, LayerPart], dtype: torch.dtype) -> tuple[
            tuple[OnePositionLayers, set[int], list[tuple[int, int | None]]] | None,
            tuple[SmallParts, list[int]] | None, dict[int, LayerPart]]:
        """The step's parts sorted in one pass (the engine's cost at small batches is its count of
        operations, Python's included): the one-position Linear weights and their biases as one
        :class:`~.ghost.OnePositionLayers` (with the parameter indices it covers and its layers'
        (weight, bias) indices; None below two layers or above :data:`~.ghost.ONE_POSITION_LIMIT`
        elements), the other formed parts of at most :data:`~.ghost.SMALL_PART` elements a patient as
        one :class:`~.ghost.SmallParts` (with their indices; None below two), and the rest by index."""
        weights: list[tuple[int, LinearWeight]] = []
        biases: dict[int, tuple[int, Formed]] = {}  # id(its weight's part) -> (index, bias part)
        small: list[tuple[int, torch.Tensor]] = []
        rest: dict[int, LayerPart] = {}
        limit = ghost.SMALL_PART
        for i, part in parts.items():
            kind = type(part)
            if kind is LinearWeight and part.flat2d is not None and part.flat2d[0].dtype == dtype \
                    and part.flat2d[1].dtype == dtype:
                weights.append((i, part))
                continue
            if kind is Formed and part.bias_of is not None:
                biases[id(part.bias_of)] = (i, part)
                continue
            g = part.formed_rows()
            if g is not None and g.shape[1] <= limit and g.dtype == dtype:
                small.append((i, g))
            else:
                rest[i] = part
        one = None
        if len(weights) >= 2 and \
                sum(w.flat2d[0].numel() + w.flat2d[1].numel() for _, w in weights) <= ONE_POSITION_LIMIT:
            layers: list[tuple[LinearWeight, Formed | None]] = []
            pairs: list[tuple[int, int | None]] = []
            for i, w in weights:
                j, bias = biases.pop(id(w), (None, None))
                layers.append((w, bias))
                pairs.append((i, j))
            covered = {i for i, _ in pairs} | {j for _, j in pairs if j is not None}
            one = (OnePositionLayers(layers, self._indicators), covered, pairs)
        else:  # (a copy of every a and b costs more than the operations it saves: ghost.ONE_POSITION_LIMIT)
            rest.update(weights)
        rest.update(biases.values())  # biases of weights outside OnePositionLayers: their norm is shared
        if len(small) < 2:
            rest.update(small and [(small[0][0], parts[small[0][0]])])
            return one, None, rest
        return one, (SmallParts([g for _, g in small]), [i for i, _ in small]), rest

    def _groups(self, groups: Sequence[Collection[nn.Parameter]] | None) -> tuple[list[int], int]:
        if groups is None:
            return [0] * len(self.params), 1
        group_of: dict[int, int] = {}
        for j, grp in enumerate(groups):
            for p in grp:
                if id(p) not in self._index or self._index[id(p)] in group_of:
                    raise PrivacyError("clipped_sum: groups must partition the engine's trainable parameters "
                                       "(a parameter is twice, or not trainable here).")
                group_of[self._index[id(p)]] = j
        if len(group_of) != len(self.params):
            raise PrivacyError("clipped_sum: groups leave trainable parameters out; every one must be in a group.")
        return [group_of[i] for i in range(len(self.params))], len(groups)

    def noise_row(self, dtype: torch.dtype) -> torch.Tensor:
        """A fresh standard-normal CSPRNG row [P] for one step (:class:`~.noise.NoiseRows`: the
        four-sum of :func:`~.noise.secure_gaussian`, drawn several steps ahead)."""
        if self._noise is None or self._noise.dtype != dtype:
            self._noise = NoiseRows(self.dim, dtype)
        return self._noise.next()

    def assign(self, flat: torch.Tensor, *, plus: torch.Tensor | None = None, alpha: float = 1.0,
               divide_by: float = 1.0) -> None:
        """Set every parameter's ``.grad`` to its slice of (``flat`` + ``alpha``·``plus``) / ``divide_by`` [P]. When
        the parameters share one dtype the slices are views of one gradient buffer the engine keeps
        (the sum is written into it, converted once; the same views every step: no per-parameter
        tensor operations), so a ``.grad`` is valid until the next :meth:`assign`."""
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1:
            total = (flat if plus is None else flat + alpha * plus) / divide_by
            for p, g in zip(self.params, torch.split(total, self.sizes), strict=True):
                p.grad = g.view_as(p).to(p.dtype)
            return
        dtype = dtypes.pop()
        if self._grad is None or self._grad.dtype != dtype:
            self._grad = torch.empty(self.dim, dtype=dtype)
            self._grad_views = [g.view_as(p) for p, g in zip(self.params, torch.split(self._grad, self.sizes),
                                                              strict=True)]
        if plus is None:
            self._grad.copy_(flat)
        else:
            torch.add(flat.to(dtype), plus.to(dtype), alpha=alpha, out=self._grad)
        if divide_by != 1.0:
            self._grad.div_(divide_by)
        for p, g in zip(self.params, self._grad_views, strict=True):
            p.grad = g

    def self_check(self, *inputs: Any, labels: Any = None) -> None:
        """Σ_i g_i == the ordinary batch gradient on ``inputs`` (a synthetic probe), or PrivacyError."""
        b = int(inputs[0].shape[0])
        y = labels if labels is not None else torch.arange(b, dtype=torch.float32) % 2
        grads, _ = self.per_sample(*inputs, labels=y)
        for p in self.params:
            p.grad = None
        self.objective(self.model, inputs, y).backward()
        try:
            for i, p in enumerate(self.params):
                want = p.grad if p.grad is not None else torch.zeros_like(p)
                got = grads[i].sum(0) if grads[i] is not None else torch.zeros_like(p)
                tol = 1e-4 * (1.0 + float(want.abs().max()))
                if float((got - want).abs().max()) > tol:
                    raise PrivacyError("Per-patient gradients do not add up to the batch gradient on a synthetic "
                                       f"probe (parameter {i} of {len(self.params)}): the model uses a parameter "
                                       "outside its leaf, or its loss is not a sum of per-patient terms.")
        finally:
            for p in self.params:
                p.grad = None

    def __repr__(self) -> str:
        return f"PerPatientClipper(leaves={len(self.leaves)}, parameters={self.dim})"


def dp_sgd_step(clipper: PerPatientClipper, optimizer: torch.optim.Optimizer, inputs: Sequence[Any], *,
                labels: Any, noise_multiplier: float, clip_norm: float, expected_batch: float,
                groups: Sequence[Collection[nn.Parameter]] | None = None,
                noise: Callable[[float, torch.Size, torch.dtype], torch.Tensor] | None = None) -> ClippedSum:
    """One DP-SGD step (Abadi et al. 2016, Algorithm 1, as Opacus normalises it), the one every
    local-DP trainer takes: the clipped sum of the batch's per-patient gradients, plus
    N(0, σ²C²) from the CSPRNG in the parameters' dtype (:func:`~.noise.secure_gaussian`, drawn
    several steps ahead: :meth:`PerPatientClipper.noise_row`; ``noise`` replaces it in tests only), divided by the EXPECTED Poisson batch size (so an empty batch still steps on noise
    alone), set as the parameters' gradients, then ``optimizer.step()``.

    Guarantees: adding or removing one patient of the batch moves the noised sum by at most C
    in L2 (the accountant's sensitivity). Does not account the step (the trainer does).
    """
    out = clipper.clipped_sum(*inputs, labels=labels, clip_norm=clip_norm, groups=groups)
    dtype = out.summed.dtype  # the parameters' (float32: the four-sum in float32, as Opacus's secure mode)
    std, divide_by = noise_multiplier * clip_norm, max(float(expected_batch), 1e-12)
    if noise is not None:
        clipper.assign(noise(std, torch.Size([clipper.dim]), dtype), plus=out.summed, divide_by=divide_by)
    elif std == 0:
        clipper.assign(out.summed, divide_by=divide_by)
    else:  # (Σ ḡ_i + σC·z) / B̄, z the engine's next fresh N(0, I) row
        clipper.assign(out.summed, plus=clipper.noise_row(dtype), alpha=std, divide_by=divide_by)
    optimizer.step()
    return out


def star_probe(n_features: int, *, row_shape: tuple[int, ...] | None = None,
               patients: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A synthetic batch shaped like the training rows (``row_shape``: (K,) for stars, (T, K) for
    snapshot sequences; default one star over every feature), no patient data: feature indices
    cycle through the dictionary, values follow a fixed ramp, observed cells alternate, and the
    last patient has none."""
    shape = tuple(row_shape) if row_shape else (n_features,)
    cells = int(torch.tensor(shape).prod())
    fi = (torch.arange(cells) % n_features).reshape(shape).expand(patients, *shape).clone()
    scale = torch.arange(1, patients + 1, dtype=torch.float32).reshape(patients, *([1] * len(shape))) / patients
    x = torch.linspace(-1.5, 1.5, cells).reshape(shape) * scale
    m = (torch.arange(cells).reshape(shape) + torch.arange(patients).reshape(patients, *([1] * len(shape)))) % 2 == 0
    m[-1] = False
    return fi, x, m
