"""Per-patient gradients and their clipped sum on the star model, in one backward pass (book-keeping).

DP-SGD (Abadi et al. 2016, Algorithm 1) needs each patient's gradient g_i, clipped to
ḡ_i = g_i · min(1, C/‖g_i‖), and the sum Σ_i ḡ_i. The star model is built only from
``nn.Linear`` and ``nn.Embedding`` leaves (:mod:`clinograph.sdk.model.layers`), whose
per-sample gradients follow from what the ordinary backward pass already has -- each call's
input a_i and the gradient of the summed loss with respect to its output b_i -- as in the
book-keeping algorithm (Bu, Wang, Zha, Karypis 2023, "Differentially private optimization on
large model at small cost", sec. 3): for a Linear layer g_i(W) = Σ_t b_{i,t} a_{i,t}ᵀ and
g_i(bias) = Σ_t b_{i,t} over the star's positions t; for an Embedding the rows of b_i
scattered to the looked-up indices. A layer called several times in one forward (the
attention's W on sources and destinations) adds its calls' contributions per patient.

Why not Opacus here: its hooks, per-parameter clipping loop and Poisson DataLoader made a DP
epoch 3.1× the non-DP epoch of the same model (research/dp_trust_models/dp_overhead.py); this does one
forward, one ``autograd.grad`` to the layer outputs (no parameter gradients), one batched
product per layer call, and clips all parameters as one [B, P] matrix. Exactness is tested
against a per-patient loop (tests/sdk/privacy/test_per_sample_grads.py) and checked once at
construction on a synthetic probe (no patient data): Σ_i g_i must equal the ordinary batch
gradient of every trainable parameter, else :class:`PrivacyError` (a parameter the engine does
not see, e.g. one used outside its module, would make the clip bound nothing).

One patient = one row: every per-patient term comes from that patient's own star (the loss is a
sum of per-patient terms; nothing couples rows), which is what makes the clip patient-level.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from clinograph.core.errors import PrivacyError


def star_loss_sum(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Σ_i BCE_i: a sum of per-patient terms, so ∂/∂(layer output of i) involves patient i only."""
    return F.binary_cross_entropy_with_logits(logits, y, reduction="sum")


@dataclass(frozen=True)
class ClippedSum:
    """One step's result. ``summed``: Σ_i ḡ_i over all trainable parameters, flat [P] in
    :attr:`PerPatientClipper.params` order; ``norms``: ‖g_i‖ before clipping [B] (local only,
    never released); ``loss``: mean loss of the batch (local only)."""

    summed: torch.Tensor
    norms: torch.Tensor
    loss: float


class PerPatientClipper:
    """Per-patient gradients of a star model's trainable parameters (see module docstring).

    Built once per hospital run for one model (its parameter objects stay, their values change
    when a round loads the global model in place). ``params`` are the trainable parameters at
    construction (frozen ones, e.g. ``similar_to`` under DP, are left out); each is owned by a
    supported leaf. Hooks are attached only for the duration of one forward pass.

    Raises:
        PrivacyError: a trainable parameter not owned by an ``nn.Linear``/``nn.Embedding``
            leaf, an embedding with ``max_norm``/``padding_idx``/sparse gradients, or a probe
            whose per-patient gradients do not add up to the batch gradient.
    """

    SUPPORTED = (nn.Linear, nn.Embedding)

    def __init__(self, model: nn.Module, *, probe: tuple[torch.Tensor, ...] | None = None):
        self.model = model
        self.params: list[nn.Parameter] = [p for p in model.parameters() if p.requires_grad]
        self.sizes = [p.numel() for p in self.params]
        self.dim = int(sum(self.sizes))
        wanted = {id(p) for p in self.params}
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self.leaves: list[nn.Module] = []
        owned: set[int] = set()
        for name, mod in model.named_modules():
            own = [p for p in mod.parameters(recurse=False) if id(p) in wanted]
            if not own:
                continue
            if not isinstance(mod, self.SUPPORTED):
                raise PrivacyError(f"Per-patient gradients: trainable parameters of {name or 'the model'!r} "
                                   f"({type(mod).__name__}) are not on an nn.Linear/nn.Embedding leaf, which is "
                                   "all the star engine computes exactly. Use grad_sample_mode = 'hooks' (Opacus).")
            if isinstance(mod, nn.Embedding) and (mod.max_norm is not None or mod.padding_idx is not None or mod.sparse):
                raise PrivacyError(f"Per-patient gradients: embedding {name!r} uses max_norm/padding_idx/sparse, "
                                   "which the star engine does not model. Use grad_sample_mode = 'hooks'.")
            self.leaves.append(mod)
            owned.update(id(p) for p in own)
        missing = wanted - owned
        if missing:  # pragma: no cover - every parameter belongs to some module
            raise PrivacyError("Per-patient gradients: some trainable parameters belong to no module.")
        self._calls: list[tuple[nn.Module, torch.Tensor, torch.Tensor]] = []
        if probe is not None:
            self.self_check(*probe)

    # -- forward with the layer calls recorded -------------------------------------------------
    def _hook(self, module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        self._calls.append((module, inputs[0], output))

    def _forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        self._calls = []
        handles = [m.register_forward_hook(self._hook) for m in self.leaves]
        try:
            return self.model(*inputs)
        finally:
            for h in handles:
                h.remove()

    def per_sample(self, *inputs: torch.Tensor, labels: torch.Tensor) -> tuple[list[torch.Tensor | None], float]:
        """([B, *p.shape] gradient of each patient's own BCE for every parameter in
        :attr:`params`, None where the batch never reached it), mean loss of the batch."""
        b = int(labels.shape[0])
        logits = self._forward(*inputs)
        loss = star_loss_sum(logits, labels.to(logits.dtype))
        calls, self._calls = self._calls, []
        outs = [o for _, _, o in calls]
        grads = torch.autograd.grad(loss, outs, allow_unused=True) if outs else ()
        with torch.no_grad():
            return self._assemble(calls, grads, b), float(loss.detach()) / max(b, 1)

    def _assemble(self, calls: list[tuple[nn.Module, torch.Tensor, torch.Tensor]],
                  grads: Sequence[torch.Tensor | None], b: int) -> list[torch.Tensor | None]:
        acc: list[torch.Tensor | None] = [None] * len(self.params)
        linear: dict[int, tuple[nn.Linear, list[torch.Tensor], list[torch.Tensor]]] = {}
        for (mod, a, _), g in zip(calls, grads, strict=True):
            if g is None:
                continue
            if isinstance(mod, nn.Linear):
                a3, g3 = _positions(a.to(g.dtype), g, b)
                linear.setdefault(id(mod), (mod, [], []))[1].append(a3)
                linear[id(mod)][2].append(g3)
            elif mod.weight.requires_grad:  # nn.Embedding: patient i's rows of b_i at its indices
                d = g.shape[-1]
                idx = a.reshape(b, -1, 1).expand(-1, -1, d)
                out = g.new_zeros((b, mod.num_embeddings, d))
                self._add(acc, mod.weight, out.scatter_add_(1, idx, g.reshape(b, -1, d)))
        for mod, a_list, g_list in linear.values():  # a layer's calls concatenated: one product per layer
            a3 = a_list[0] if len(a_list) == 1 else torch.cat(a_list, dim=1)
            g3 = g_list[0] if len(g_list) == 1 else torch.cat(g_list, dim=1)
            if mod.weight.requires_grad:
                w = (g3[:, 0, :, None] * a3[:, 0, None, :] if g3.shape[1] == 1
                     else torch.bmm(g3.transpose(1, 2), a3))  # Σ_t b_{i,t} a_{i,t}ᵀ
                self._add(acc, mod.weight, w)
            if mod.bias is not None and mod.bias.requires_grad:
                self._add(acc, mod.bias, g3.sum(1))
        return acc

    def _add(self, acc: list[torch.Tensor | None], p: nn.Parameter, g: torch.Tensor) -> None:
        i = self._index.get(id(p))
        if i is not None:  # else frozen
            acc[i] = g if acc[i] is None else acc[i] + g

    def flat(self, grads: Sequence[torch.Tensor | None], b: int, dtype: torch.dtype) -> torch.Tensor:
        """The per-patient gradients as one [B, P] matrix (zeros where a parameter was not reached)."""
        cols = [g.reshape(b, -1) if g is not None else torch.zeros((b, n), dtype=dtype)
                for g, n in zip(grads, self.sizes, strict=True)]
        return torch.cat(cols, dim=1) if cols else torch.zeros((b, 0), dtype=dtype)

    def clipped_sum(self, *inputs: torch.Tensor, labels: torch.Tensor, clip_norm: float) -> ClippedSum:
        """Σ_i g_i · min(1, C/(‖g_i‖ + 1e-6)) (Opacus's flat-clipping factor), flat [P].

        The per-patient gradients are copied into one reused [B, P] buffer, so the norms and the
        clipped sum are one operation each over all parameters."""
        b = int(labels.shape[0])
        dtype = self.params[0].dtype if self.params else torch.float32
        if b == 0:
            return ClippedSum(torch.zeros(self.dim, dtype=dtype), torch.zeros(0, dtype=dtype), 0.0)
        grads, loss = self.per_sample(*inputs, labels=labels)
        with torch.no_grad():
            g = self._matrix(grads, b, dtype)
            norms = torch.linalg.vector_norm(g, dim=1)
            factor = (clip_norm / (norms + 1e-6)).clamp(max=1.0)
            return ClippedSum(factor @ g, norms, loss)

    def _matrix(self, grads: Sequence[torch.Tensor | None], b: int, dtype: torch.dtype) -> torch.Tensor:
        """:meth:`flat` into a buffer kept between steps (grown when a Poisson batch is larger)."""
        buf = getattr(self, "_buf", None)
        if buf is None or buf.shape[0] < b or buf.dtype != dtype:
            buf = self._buf = torch.empty((max(b, 2 * (buf.shape[0] if buf is not None else 0)), self.dim), dtype=dtype)
        g = buf[:b]
        off = 0
        for gi, n in zip(grads, self.sizes, strict=True):
            if gi is None:
                g[:, off:off + n].zero_()
            else:
                g[:, off:off + n].copy_(gi.reshape(b, n))
            off += n
        return g

    def release(self) -> None:
        """Drop the [B, P] buffer (it holds the last step's per-patient gradients); called at
        the end of every round."""
        self._buf = None

    def assign(self, flat: torch.Tensor) -> None:
        """Set every parameter's ``.grad`` to its slice of ``flat`` [P]."""
        for p, g in zip(self.params, torch.split(flat, self.sizes), strict=True):
            p.grad = g.view_as(p).to(p.dtype)

    def self_check(self, *inputs: torch.Tensor, labels: torch.Tensor | None = None) -> None:
        """Σ_i g_i == the ordinary batch gradient on ``inputs`` (a synthetic probe), or PrivacyError."""
        b = int(inputs[0].shape[0])
        y = labels if labels is not None else torch.arange(b, dtype=torch.float32) % 2
        grads, _ = self.per_sample(*inputs, labels=y)
        for p in self.params:
            p.grad = None
        logits = self.model(*inputs)
        star_loss_sum(logits, y.to(logits.dtype)).backward()
        try:
            for i, p in enumerate(self.params):
                want = p.grad if p.grad is not None else torch.zeros_like(p)
                got = grads[i].sum(0) if grads[i] is not None else torch.zeros_like(p)
                tol = 1e-4 * (1.0 + float(want.abs().max()))
                if float((got - want).abs().max()) > tol:
                    raise PrivacyError("Per-patient gradients do not add up to the batch gradient on a synthetic "
                                       f"probe (parameter {i} of {len(self.params)}): the model uses a parameter "
                                       "outside its Linear/Embedding leaf. Use grad_sample_mode = 'hooks'.")
        finally:
            for p in self.params:
                p.grad = None

    def __repr__(self) -> str:
        return f"PerPatientClipper(leaves={len(self.leaves)}, parameters={self.dim})"


def _positions(a: torch.Tensor, g: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A Linear call's input and output gradient as [B, T, d_in], [B, T, d_out]. An input that is
    one vector per patient broadcast over the star (stride 0, e.g. the destination in the
    attention logits) gives Σ_t b_{i,t} a_iᵀ: its positions are summed first (T = 1)."""
    if a.dim() == 2:
        return a.unsqueeze(1), g.unsqueeze(1)
    if a.dim() == 3 and a.stride(1) == 0:
        return a[:, :1, :], g.sum(1, keepdim=True)
    return a.reshape(b, -1, a.shape[-1]), g.reshape(b, -1, g.shape[-1])


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
