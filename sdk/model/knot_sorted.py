"""Σ_k B_k(x) U_k h on a hat basis with the positions sorted by knot (the piecewise encoding's
per-copy path and its per-patient clipped sum).

A hat basis row (:func:`~.layers.hat_basis`) is non-zero at two adjacent knots k, k + 1 at most.
Grouping the positions by k, each group needs one product with [U_k; U_{k+1}] ([2·d_out, d_in], two
contiguous row blocks of ``KnotLinear``'s weight): 2·N·d_in·d_out multiply-adds in all instead of the
dense M·N·d_in·d_out of B(x) ⊗ h against [U_0 … U_{M-1}] (M = 13 knots: 6.5× fewer), at the price
of one sort and a gather and a scatter of the positions' rows. The forward, the input gradient,
the weight gradient and the engine's clipped sum (:class:`clinograph.sdk.privacy.ghost.KnotWeight`)
all use it; a basis of any other form keeps the dense product (:func:`knot_pairs` returns None).
Measured in benchmarks/runtime_speed/README.md ("Fewer operations and knot-sorted products").

Shapes: N positions, basis [N, M], h [N, d_in], weight [M·d_out, d_in] (row block k = U_k).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch


class KnotPairs(NamedTuple):
    """The positions sorted by the first of their two knots."""

    order: torch.Tensor  #: [N] position numbers, by first knot k
    counts: list[int]  #: [M − 1] positions with first knot k
    weights: torch.Tensor  #: [N, 2] (B_k, B_{k+1}) of the sorted positions
    inverse: torch.Tensor  #: [N] each position's place in ``order`` (unsorting is then a gather: ~4× an index_copy_)


def knot_pairs(basis: torch.Tensor) -> KnotPairs | None:
    """The sort of the positions of ``basis`` [..., M] by knot, or None when some row is non-zero
    outside two adjacent knots (not a hat basis: the caller takes the dense product)."""
    m = basis.shape[-1]
    if m < 2:
        return None
    bs = basis.reshape(-1, m)
    k = (bs != 0).to(torch.uint8).argmax(-1).clamp_(max=m - 2)  # the first non-zero knot (0 if none)
    kk = torch.stack([k, k + 1], -1)
    if torch.count_nonzero(bs.scatter(1, kk, 0)):
        return None
    order = torch.argsort(k, stable=True)  # the same order, so the same sums, on every run
    inverse = torch.empty_like(order).scatter_(0, order, torch.arange(order.shape[0], device=order.device))
    return KnotPairs(order, torch.bincount(k, minlength=m - 1).tolist(), bs.gather(1, kk).index_select(0, order),
                     inverse)


def knot_weighted(pairs: KnotPairs, g: torch.Tensor) -> torch.Tensor:
    """[B_k g_t ‖ B_{k+1} g_t] of the sorted positions. Shapes: g [N, d] (unsorted) -> [N, 2·d]."""
    gs = g.index_select(0, pairs.order)
    w = pairs.weights.to(g.dtype)
    return torch.cat([gs * w[:, :1], gs * w[:, 1:]], 1)


def sorted_weight_grad(pairs: KnotPairs, hs: torch.Tensor, gw: torch.Tensor) -> torch.Tensor:
    """Σ_t B(x_t) ⊗ g_t h_tᵀ in the weight's layout, one [2·d_out, n] x [n, d_in] product per first
    knot. Shapes: hs [N, d_in] sorted, gw [N, 2·d_out] (:func:`knot_weighted`) -> [M·d_out, d_in]."""
    m, d_in, d_out = len(pairs.counts) + 1, hs.shape[1], gw.shape[1] // 2
    r = hs.new_zeros(m - 1, 2 * d_out, d_in)
    start = 0
    for k, n in enumerate(pairs.counts):
        if n:
            torch.mm(gw[start:start + n].T, hs[start:start + n], out=r[k])
            start += n
    out = hs.new_zeros(m, d_out, d_in)
    out[:-1] = r[:, :d_out]
    out[1:] += r[:, d_out:]
    return out.view(m * d_out, d_in)


def _per_knot(pairs: KnotPairs, rows: torch.Tensor, weight: torch.Tensor, *, transpose: bool) -> torch.Tensor:
    """Each group's rows times [U_k; U_{k+1}] (ᵀ with ``transpose``), unsorted again."""
    d_out = weight.shape[0] // (len(pairs.counts) + 1)
    out = rows.new_empty(rows.shape[0], 2 * d_out if transpose else weight.shape[1])
    start = 0
    for k, n in enumerate(pairs.counts):
        if n:
            w = weight[k * d_out:(k + 2) * d_out]
            torch.mm(rows[start:start + n], w.T if transpose else w, out=out[start:start + n])
            start += n
    return out


class _Weighted:
    """[B_k g ‖ B_{k+1} g] of one output gradient, formed once for the product's and the weight branch's
    backward (:func:`knot_product`: both run on ``.backward()``, which hands them the same gradient)."""

    __slots__ = ("g", "gw")

    def __init__(self) -> None:
        self.g: torch.Tensor | None = None
        self.gw: torch.Tensor | None = None

    def of(self, pairs: KnotPairs, g: torch.Tensor) -> torch.Tensor:
        if self.g is g and self.gw is not None:  # the other backward formed it: taken, and let go
            gw, self.g, self.gw = self.gw, None, None
            return gw
        gw = knot_weighted(pairs, g)
        self.g, self.gw = g, gw
        return gw


class KnotSortedProduct(torch.autograd.Function):
    """Σ_k B_k U_k h_t per position, forward and the input gradient by knot groups (module docstring).
    No gradient to the weight here (:func:`knot_product` sends it on a branch of its own) nor to the
    basis (a fixed function of the data). Shapes: h [N, d_in], weight [M·d_out, d_in] -> [N, d_out]."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, pairs: KnotPairs,
                weighted: _Weighted | None = None) -> torch.Tensor:
        hs = h.index_select(0, pairs.order)
        y = _per_knot(pairs, hs, weight, transpose=True)  # [U_k h ‖ U_{k+1} h], sorted
        d_out, w = y.shape[1] // 2, pairs.weights.to(h.dtype)
        ys = torch.addcmul(y[:, :d_out] * w[:, :1], y[:, d_out:], w[:, 1:])
        ctx.save_for_backward(weight)
        ctx.pairs, ctx.weighted = pairs, weighted
        return ys.index_select(0, pairs.inverse)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        (weight,) = ctx.saved_tensors
        pairs: KnotPairs = ctx.pairs
        gw = ctx.weighted.of(pairs, g) if ctx.weighted is not None else knot_weighted(pairs, g)
        gh = _per_knot(pairs, gw, weight, transpose=False)
        return gh.index_select(0, pairs.inverse), None, None, None


class KnotWeightBranch(torch.autograd.Function):
    """The weight's gradient of :class:`KnotSortedProduct` as a node of its own: its output is zero
    (stride 0) and is added to the product's, so autograd runs this backward only when the weight's
    gradient is wanted. The per-patient engine's ``autograd.grad`` to the layers' outputs does not
    want it (it forms its own from the recorded call), so its backward no longer pays M − 1 products
    a call for a gradient it drops. Shapes: weight [M·d_out, d_in], h [N, d_in] -> [N, d_out] (zeros)."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, h: torch.Tensor, pairs: KnotPairs,
                weighted: _Weighted | None = None) -> torch.Tensor:
        ctx.save_for_backward(h)
        ctx.pairs, ctx.weighted = pairs, weighted
        return weight.new_zeros(()).expand(h.shape[0], weight.shape[0] // (len(pairs.counts) + 1))

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        (h,) = ctx.saved_tensors
        pairs: KnotPairs = ctx.pairs
        gw = ctx.weighted.of(pairs, g) if ctx.weighted is not None else knot_weighted(pairs, g)
        return sorted_weight_grad(pairs, h.index_select(0, pairs.order), gw), None, None, None


def knot_product(h: torch.Tensor, weight: torch.Tensor, pairs: KnotPairs) -> torch.Tensor:
    """Σ_k B_k U_k h_t (:class:`KnotSortedProduct`), with the weight's gradient on its own branch
    (:class:`KnotWeightBranch`) when the weight takes one: the same values (plus an exact zero) and
    the same gradients. Shapes: h [N, d_in], weight [M·d_out, d_in] -> [N, d_out]."""
    if not (weight.requires_grad and torch.is_grad_enabled()):
        return KnotSortedProduct.apply(h, weight.detach(), pairs)
    weighted = _Weighted()
    out = KnotSortedProduct.apply(h, weight.detach(), pairs, weighted)
    return out + KnotWeightBranch.apply(weight, h.detach(), pairs, weighted)
