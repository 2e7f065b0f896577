"""One layer's share of the per-patient gradients: their squared norms and their clipped sum.

From what the ordinary backward pass already has -- a layer call's input a and the gradient b
of the summed loss with respect to its output -- the per-patient gradient of a Linear layer is
g_i(W) = Σ_t b_{i,t} a_{i,t}ᵀ over the call's positions t, of its bias Σ_t b_{i,t}, of an
Embedding the rows of b_i scattered to the looked-up indices (Bu, Wang, Zha, Karypis 2023,
"Differentially private optimization on large model at small cost", the book-keeping algorithm).

DP-SGD needs of g_i only ‖g_i‖² (summed over the layers into the clipping factor c_i) and
Σ_i c_i g_i. Both come without forming g_i when that is cheaper (ghost norms, Goodfellow 2015;
Li et al. 2022, "Large language models can be strong differentially private learners", sec. 4):

- Linear weight, T = 1: ‖g_i‖² = ‖a_i‖²‖b_i‖²; T > 1: ‖g_i‖² = Σ_{t,s} (a_t·a_s)(b_t·b_s), B·T²·(d_in+d_out)
  operations, whose clipped sum is then one product Σ_{i,t} (c_i b_{i,t}) a_{i,t}ᵀ (B·T·d_in·d_out): no
  second backward. Forming g_i costs that same B·T·d_in·d_out once, after which the norm and the
  clipped sum are 2·B·d_in·d_out; so g_i is formed when T²·(d_in+d_out) ≥ 2·d_in·d_out and the
  formed [B, d_out·d_in] stays under :data:`FORM_LIMIT` elements, or (whatever its size) when the
  ghost norm alone costs more than forming (Bu et al. 2022's mixed ghost clipping, with the
  clipped sum counted).
- the piecewise value encoding's ``KnotLinear`` called on [h ‖ B(x)]: a Linear over the
  knot-weighted input e_t = B(x_t) ⊗ h_t, whose ghost norm factorises (e_t·e_s = (h_t·h_s)(B_t·B_s)):
  B·T²·(d_in + M + d_out) operations instead of B·T²·(M·d_in + d_out) or forming B·T·M·d_in·d_out.
- Embedding: ‖g_i‖² = Σ_{t,s} [j_t = j_s] (b_t·b_s) when T² < the table's rows, else g_i formed
  (whole rows ``index_add``-ed into [B·rows, d] from d = :data:`INDEX_ADD_WIDTH`, a scatter below);
  the clipped sum is an ``index_add`` of c_i b_{i,t} at the rows j_t.
- a per-patient tensor (bias, the survival baseline): formed, [B, n].

Shapes: a [B, T, d_in], b [B, T, d_out]; indices [B, T]; c [B], in the parts' dtype.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from ..model.knot_sorted import KnotPairs, knot_pairs, knot_weighted, sorted_weight_grad


class Workspace:
    """Buffers reused from one DP step to the next for the parts' large intermediates (formed
    g_i, [B, d_out, d_in] each). Allocated fresh every step, tens of MB at large batches came as
    fresh pages every step (glibc hands large freed blocks back to the OS): thousands of page faults
    a step. Buffers are handed out in request order (the same every step for one model) and grow
    to the largest size asked; only the clipped-sum path uses them (:func:`workspace`), never a
    tensor that leaves the engine (:meth:`LayerPart.per_sample` allocates). A slot asked for the
    same shape as last step hands out the same view (no slicing and viewing a request: the engine's
    cost at small batches is its count of tensor operations)."""

    def __init__(self) -> None:
        self._bufs: list[torch.Tensor] = []
        self._views: list[tuple[tuple[int, ...], torch.Tensor]] = []
        self._next = 0

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor of ``shape``, valid until the next :meth:`rewind`."""
        i = self._next
        self._next += 1
        inference = torch.is_inference_mode_enabled()  # an inference tensor cannot be written outside that mode
        if i < len(self._views):
            last, view = self._views[i]
            if last == shape and view.dtype == dtype and view.is_inference() == inference:
                return view
        n = math.prod(shape)
        if i == len(self._bufs):
            self._bufs.append(torch.empty(n, dtype=dtype))
            self._views.append(((), self._bufs[i]))
        elif self._bufs[i].numel() < n or self._bufs[i].dtype != dtype or self._bufs[i].is_inference() != inference:
            self._bufs[i] = torch.empty(n, dtype=dtype)
        view = self._bufs[i][:n].view(shape)
        self._views[i] = (shape, view)
        return view

    def rewind(self) -> None:
        """Every buffer free again (the step that used them is done)."""
        self._next = 0


#: the workspace of the step being computed in this thread (None: allocate)
_WORKSPACE: ContextVar[Workspace | None] = ContextVar("ghost_workspace", default=None)


@contextmanager
def workspace(ws: Workspace) -> Iterator[None]:
    """Inside: the parts formed in this thread take their buffers from ``ws`` (rewound first: the
    previous step's tensors from it are overwritten)."""
    ws.rewind()
    token = _WORKSPACE.set(ws)
    try:
        yield
    finally:
        _WORKSPACE.reset(token)


def _empty(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor | None:
    ws = _WORKSPACE.get()
    return ws.take(shape, like.dtype) if ws is not None else None


def sq_norms(rows: torch.Tensor) -> torch.Tensor:
    """‖row‖² of each row, in one kernel. Shapes: [B, n] -> [B]."""
    return torch.linalg.vecdot(rows, rows)


class LayerPart:
    """A parameter's per-patient gradients, kept in the cheapest form (module docstring)."""

    def norm2(self) -> torch.Tensor:  # pragma: no cover - interface
        """‖g_i‖² of this parameter. Shapes: -> [B]."""
        raise NotImplementedError

    def clipped(self, c: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        """Σ_i c_i g_i, flat. Shapes: [B] -> [n]."""
        raise NotImplementedError

    def per_sample(self) -> torch.Tensor:  # pragma: no cover - interface
        """g_i formed (the reference path, tests and the construction check). Shapes: -> [B, n]."""
        raise NotImplementedError

    def formed_rows(self) -> torch.Tensor | None:
        """g_i when this part already holds it formed and its norm is not shared with another part,
        [B, n] (:class:`SmallParts` takes such parts together); else None."""
        return None


class Formed(LayerPart):
    """g_i already formed, [B, n]. ``norm2_of``: where ‖g_i‖² is already computed (a Linear bias
    whose g_i is the output gradient its weight's ghost norm also squares); ``bias_of``: that
    weight's part, when it is a one-position layer (:class:`OnePositionLayers` takes both)."""

    def __init__(self, g: torch.Tensor, norm2_of: Callable[[], torch.Tensor] | None = None,
                 bias_of: LinearWeight | None = None):
        self.g = g if g.dim() == 2 else g.reshape(g.shape[0], -1)
        self._norm2_of = norm2_of
        self.bias_of = bias_of

    def norm2(self) -> torch.Tensor:
        return self._norm2_of() if self._norm2_of is not None else sq_norms(self.g)

    def clipped(self, c: torch.Tensor) -> torch.Tensor:
        return c @ self.g

    def per_sample(self) -> torch.Tensor:
        return self.g

    def formed_rows(self) -> torch.Tensor | None:
        return self.g if self._norm2_of is None else None


#: the largest per-patient gradient matrix [B, n] the engine forms to spare the ghost path a product,
#: in elements (64 MB of float32): above it the ghost norm is used unless it costs more than forming
FORM_LIMIT = 1 << 24


class LinearWeight(LayerPart):
    """g_i = Σ_t b_{i,t} a_{i,t}ᵀ of a Linear weight [d_out, d_in], over the positions of every
    call of the layer (``calls``: (a, b) pairs, each [B, T_c, ·])."""

    def __init__(self, calls: list[tuple[torch.Tensor, torch.Tensor]],
                 flat2d: tuple[torch.Tensor, torch.Tensor] | None = None):
        self._b2: torch.Tensor | None = None
        self.formed: torch.Tensor | None = None
        self._flat: torch.Tensor | None = None  # the formed g_i as [B, d_out·d_in]
        #: one position (a 2-D call): the ghost norm ‖a_i‖²‖b_i‖² and one product, on [B, ·] tensors
        self.flat2d = flat2d
        self.calls = calls  # empty when flat2d is given (a [B, d_in], b [B, d_out]): no [B, 1, ·] views made
        if flat2d is not None:
            return
        d_in, d_out = calls[0][0].shape[-1], calls[0][1].shape[-1]
        t = sum(int(a.shape[1]) for a, _ in calls)
        if t == 1:
            self.flat2d = (calls[0][0][:, 0], calls[0][1][:, 0])
            return
        ghost = t * t * (d_in + d_out)  # the ghost norm's operations a patient (forming: t·d_in·d_out)
        small = int(calls[0][0].shape[0]) * d_in * d_out <= FORM_LIMIT
        if ghost >= t * d_in * d_out or (small and ghost >= 2 * d_in * d_out):  # module docstring
            self.formed = self._form()
            self._flat = self.formed.view(self.formed.shape[0], -1)

    def _form(self) -> torch.Tensor:
        """Σ over the calls of Σ_t b_t a_tᵀ, [B, d_out, d_in]: the first call's product into the buffer,
        the others added in place (``addcmul_`` / ``baddbmm_``: no temporary a call)."""
        (a, b), rest = self.calls[0], self.calls[1:]
        shape = (int(a.shape[0]), int(b.shape[-1]), int(a.shape[-1]))
        out = _empty(shape, a)
        if a.shape[1] == 1:
            w = torch.mul(b[:, 0, :, None], a[:, 0, None, :], out=out) if out is not None \
                else b[:, 0, :, None] * a[:, 0, None, :]
        else:
            w = torch.bmm(b.transpose(1, 2), a, out=out) if out is not None else torch.bmm(b.transpose(1, 2), a)
        for a, b in rest:  # one product a call: no concatenated copy of the positions
            if a.shape[1] == 1:
                w.addcmul_(b[:, 0, :, None], a[:, 0, None, :])
            else:
                w.baddbmm_(b.transpose(1, 2), a)
        return w

    def _joined(self) -> tuple[torch.Tensor, torch.Tensor]:
        if len(self.calls) == 1:
            return self.calls[0]
        return torch.cat([a for a, _ in self.calls], dim=1), torch.cat([b for _, b in self.calls], dim=1)

    def out_norms2(self) -> torch.Tensor:
        """‖b_i‖² of a one-position layer (its bias's ‖g_i‖²), computed once."""
        if self._b2 is None:
            self._b2 = sq_norms(self.flat2d[1])
        return self._b2

    def norm2(self) -> torch.Tensor:
        if self.flat2d is not None:
            return sq_norms(self.flat2d[0]) * self.out_norms2()
        if self._flat is not None:
            return sq_norms(self._flat)
        a, b = self._joined()
        return (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(b, b.transpose(1, 2))).sum((1, 2))

    def clipped(self, c: torch.Tensor) -> torch.Tensor:
        if self.flat2d is not None:
            a, b = self.flat2d
            return torch.mm(b.T * c, a).view(-1)  # Σ_i c_i b_i a_iᵀ
        if self._flat is not None:
            return c @ self._flat
        out = None
        for a, b in self.calls:
            w = torch.mm((b * c[:, None, None]).reshape(-1, b.shape[-1]).T, a.reshape(-1, a.shape[-1]))
            out = w if out is None else out.add_(w)
        return out.reshape(-1)

    def formed_rows(self) -> torch.Tensor | None:
        return self._flat

    def per_sample(self) -> torch.Tensor:
        if self.flat2d is not None:
            a, b = self.flat2d
            return (b.unsqueeze(2) * a.unsqueeze(1)).reshape(a.shape[0], -1)
        w = self.formed if self.formed is not None else self._form()
        return w.reshape(w.shape[0], -1)


#: :class:`OnePositionLayers` only while B·Σ(d_in + d_out) stays at most this many elements: it trades
#: operations for a copy of every a and b, which wins at small batches (concept model, B = 64: norms
#: 66 -> 43 µs) and loses from B ≈ 128 (B = 256: 96 -> 150 µs; B = 672: 155 -> 380 µs)
ONE_POSITION_LIMIT = 1 << 16


class OnePositionLayers:
    """The one-position Linear layers of a step (``LinearWeight.flat2d``: a [B, d_in], b [B, d_out])
    and their biases, their norms and clipped sums computed together: per layer
    ‖g_i(W)‖² + ‖g_i(bias)‖² = ‖a_i‖²(‖b_i‖²) + [bias]‖b_i‖², the squared rows of all a (all b)
    concatenated and summed per layer by one product with a 0/1 layer indicator; the clipped sums
    (c∘b)ᵀa per layer from one c∘b of all b, the biases' Σ_i c_i b_i one column sum. Same values as
    the parts one by one (up to float summation order), a dozen tensor operations instead of ~5 a
    layer: the cost of a DP step of many small layers (the concept models: 13) is its count of
    operations. ``layers``: (weight part, bias part or None) in a fixed order."""

    def __init__(self, layers: list[tuple[LinearWeight, Formed | None]],
                 indicators: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]):
        self.layers = layers
        a = [w.flat2d[0] for w, _ in layers]
        b = [w.flat2d[1] for w, _ in layers]
        key = tuple((int(x.shape[1]), int(y.shape[1]), bias is not None, x.dtype) for x, y, (_, bias) in
                    zip(a, b, layers, strict=True))
        if key not in indicators:  # built once a model (the layout is the same every step)
            indicators[key] = self._indicators(key)
        self._ia, self._ib, self._has_bias = indicators[key]
        self._a, self._b = a, torch.cat(b, 1)
        self._d_out = [int(y.shape[1]) for y in b]

    @staticmethod
    def _indicators(key: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layers' 0/1 indicators over the concatenated inputs [L, Σd_in] and outputs [L, Σd_out]
        (layer-major: the product with the transposed squares, [L, Σd]·[Σd, B], is a third faster here
        than [B, Σd]·[Σd, L] -- a GEMM with 12 output columns -- 11 against 17 µs at the concept model's
        462 input columns), and which layers have a bias [L, 1]."""
        dtype = key[0][3]
        ia = torch.zeros((len(key), sum(k[0] for k in key)), dtype=dtype)
        ib = torch.zeros((len(key), sum(k[1] for k in key)), dtype=dtype)
        at_a = at_b = 0
        for j, (d_in, d_out, _, _) in enumerate(key):
            ia[j, at_a:at_a + d_in] = 1.0
            ib[j, at_b:at_b + d_out] = 1.0
            at_a, at_b = at_a + d_in, at_b + d_out
        return ia, ib, torch.tensor([[1.0] if k[2] else [0.0] for k in key], dtype=dtype)

    def norm2(self) -> torch.Tensor:
        """Σ over the layers of ‖g_i(W)‖² + ‖g_i(bias)‖². Shapes: -> [B]."""
        sa = torch.mm(self._ia, torch.cat(self._a, 1).square_().T)  # [L, B]: ‖a_i‖² a layer
        sb = torch.mm(self._ib, self._b.square().T)
        return torch.linalg.vecdot(sa.add_(self._has_bias), sb, dim=0)

    def clipped(self, c: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """(Σ_i c_i g_i(W) flat, Σ_i c_i g_i(bias) or None) a layer, in :attr:`layers` order."""
        cb = self._b * c[:, None]
        rows, bias_sums = torch.split(cb.T, self._d_out), torch.split(cb.sum(0), self._d_out)  # views, one op each
        return [(torch.mm(cb_t, a).view(-1), b_sum if bias is not None else None)
                for (_, bias), a, cb_t, b_sum in zip(self.layers, self._a, rows, bias_sums, strict=True)]


#: :class:`SmallParts` takes a formed part while its g_i has at most this many elements a patient: its
#: norm and clipped sum are then one operation each for all such parts instead of two a part, for the price
#: of one copy of their rows (memory-bound for large parts: a [64, 1 024] part's own norm is no cheaper
#: than its share of a concatenated one, so large parts stay on their own)
SMALL_PART = 64


class SmallParts:
    """The formed parts with at most :data:`SMALL_PART` elements a patient (``rows``: [B, n_k] each, the
    scoring layers' weights and biases of a concept model, the biases and one-output layers of the
    NS-FL models), their rows concatenated once into [B, Σn]: ‖g_i‖² summed over them by one ``vecdot``
    and their clipped sums Σ_i c_i g_i by one product, split into the parts' pieces (views). Same
    values as the parts one by one, up to float summation order; 4 tensor operations instead of 2 a part."""

    def __init__(self, rows: list[torch.Tensor]):
        self.sizes = [int(r.shape[1]) for r in rows]
        self._g = torch.cat(rows, 1) if len(rows) > 1 else rows[0]

    def norm2(self) -> torch.Tensor:
        """Σ over the parts of ‖g_i‖². Shapes: -> [B]."""
        return sq_norms(self._g)

    def clipped(self, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Σ_i c_i g_i of each part, flat, in the order given. Shapes: [B] -> ([n_k], ...)."""
        return torch.split(c @ self._g, self.sizes)


class KnotWeight(LayerPart):
    """g_i of a ``KnotLinear`` weight [M·d_out, d_in] from its calls on [h ‖ B(x)] (module docstring):
    g_i[k·d_out + o, j] = Σ_t B_k(x_t) b_t[o] h_t[j]. Shapes: h [B, T, d_in], basis [B, T, M],
    b [B, T, d_out]."""

    def __init__(self, h: torch.Tensor, basis: torch.Tensor, b: torch.Tensor, pairs: KnotPairs | None | bool = False):
        self.h, self.basis, self.b = h, basis, b
        #: the positions' knot sort (:func:`~clinograph.sdk.model.knot_sorted.knot_pairs` of ``basis``, None:
        #: not a hat basis), given when the layer's forward already sorted them; False: not given
        self.pairs = pairs

    def norm2(self) -> torch.Tensor:
        h, bs, b = self.h, self.basis, self.b
        if h.shape[1] == 1:
            return sq_norms(h[:, 0]) * sq_norms(bs[:, 0]) * sq_norms(b[:, 0])
        gram = torch.bmm(h, h.transpose(1, 2)).mul_(torch.bmm(bs, bs.transpose(1, 2)))
        return gram.mul_(torch.bmm(b, b.transpose(1, 2))).sum((1, 2))

    def _knot_backprops(self, c: torch.Tensor | None) -> torch.Tensor:
        """B_k(x_t) b_t (times c_i), [B, T, M·d_out]."""
        bs = self.basis if c is None else self.basis * c[:, None, None]
        return (bs.unsqueeze(-1) * self.b.unsqueeze(-2)).flatten(2)

    def clipped(self, c: torch.Tensor) -> torch.Tensor:
        """Σ_i c_i g_i; on a hat basis with the positions sorted by knot, one [2·d_out, n] x [n, d_in]
        product per knot (:mod:`clinograph.sdk.model.knot_sorted`: 2·N·d_in·d_out multiply-adds instead
        of the dense M·N·d_in·d_out of B(x) ⊗ b against h)."""
        pairs = knot_pairs(self.basis) if self.pairs is False else self.pairs
        if pairs is None:
            kb = self._knot_backprops(c)
            return torch.mm(kb.reshape(-1, kb.shape[-1]).T, self.h.reshape(-1, self.h.shape[-1])).reshape(-1)
        h = self.h.reshape(-1, self.h.shape[-1]).index_select(0, pairs.order)
        cb = (self.b * c[:, None, None]).reshape(h.shape[0], -1)  # c_i b_t, unsorted
        return sorted_weight_grad(pairs, h, knot_weighted(pairs, cb)).view(-1)

    def per_sample(self) -> torch.Tensor:
        return torch.bmm(self._knot_backprops(None).transpose(1, 2), self.h).reshape(self.h.shape[0], -1)


#: the embedding width from which a formed g_i is built by whole-row ``index_add`` (below it, with
#: rows of a few elements, ``scatter_add`` is faster: measured on the NS-FL stars, d = 1, 2 and 32)
INDEX_ADD_WIDTH = 16


@functools.lru_cache(maxsize=64)
def _row_offsets(n: int, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """[i·rows for i < n] as [n, 1] (read only: shared step to step)."""
    return torch.arange(0, n * rows, rows, dtype=dtype).unsqueeze(1)


class EmbeddingWeight(LayerPart):
    """g_i = the rows b_{i,t} added at the looked-up rows j_{i,t} of an Embedding [rows, d]."""

    def __init__(self, index: torch.Tensor, b: torch.Tensor, rows: int):
        self.index, self.b, self.rows = index, b, rows
        self.formed: torch.Tensor | None = None  # [B, rows·d]
        if index.shape[1] ** 2 >= rows:
            self.formed = self._scatter(b).view(b.shape[0], -1)

    def _scatter(self, b: torch.Tensor) -> torch.Tensor:
        n, _, d = b.shape
        out = _empty((n, self.rows, d), b)
        out = out.zero_() if out is not None else b.new_zeros((n, self.rows, d))
        if d < INDEX_ADD_WIDTH:
            return out.scatter_add_(1, self.index.unsqueeze(-1).expand(-1, -1, d), b)
        # patient i's row j is row i·rows + j of the [B·rows, d] view: one index_add of whole rows
        # (a vectorised row copy) instead of a scatter of single elements (2.7× faster at d = 32)
        rows = self.index + _row_offsets(n, self.rows, self.index.dtype)
        out.view(n * self.rows, d).index_add_(0, rows.reshape(-1), b.reshape(-1, d))
        return out

    def norm2(self) -> torch.Tensor:
        if self.formed is not None:
            return sq_norms(self.formed)
        same = (self.index.unsqueeze(2) == self.index.unsqueeze(1)).to(self.b.dtype)
        return (same * torch.bmm(self.b, self.b.transpose(1, 2))).sum((1, 2))

    def clipped(self, c: torch.Tensor) -> torch.Tensor:
        if self.formed is not None:
            return c @ self.formed
        d = self.b.shape[-1]
        cb = (self.b * c[:, None, None]).reshape(-1, d)
        return self.b.new_zeros((self.rows, d)).index_add_(0, self.index.reshape(-1), cb).reshape(-1)

    def formed_rows(self) -> torch.Tensor | None:
        return self.formed

    def per_sample(self) -> torch.Tensor:
        w = self.formed if self.formed is not None else self._scatter(self.b)
        return w.reshape(w.shape[0], -1)


def positions(a: torch.Tensor, g: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A Linear call's input and output gradient as [B, T, d_in], [B, T, d_out]. An input broadcast
    along some position axes (stride 0 there: one vector per patient over the star, e.g. the
    destination in the attention logits, or per time step over a snapshot's features) gives
    Σ_t b_t aᵀ = (Σ_t b_t) aᵀ over those axes: the output gradients are summed over them first and
    the input is read once (fewer positions, no copy of the broadcast input)."""
    if a.dim() == 2:
        return a.unsqueeze(1), g.unsqueeze(1)
    shared = [d for d in range(1, a.dim() - 1) if a.stride(d) == 0 and a.shape[d] > 1]
    if shared:
        for d in shared:
            a = a.narrow(d, 0, 1)
        g = g.sum(shared, keepdim=True)
    if a.dim() == 3 and g.dim() == 3 and a.shape[0] == b == g.shape[0]:
        return a, g  # already [B, T, ·]
    return a.reshape(b, -1, a.shape[-1]), g.reshape(b, -1, g.shape[-1])
