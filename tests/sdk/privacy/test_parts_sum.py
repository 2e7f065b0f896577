"""A hospital's clipped sum from the engine's parts (sdk/privacy/parts_sum.py): equal to clipping each
patient's gradient in a loop (float64, to the float64 bound's order), the shrunk clip keeping one
patient's move of s·x within C·s, and the cases its bound does not cover handed back (None) or refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from clinograph.sdk.concepts.dp import ConceptLabels, concept_clipper, trainable_names
from clinograph.sdk.concepts.model import ConceptModel
from clinograph.sdk.privacy.ghost import LinearWeight
from clinograph.sdk.privacy.parts_sum import parts_clipped_sum, parts_sum_clip
from clinograph.sdk.privacy.per_patient import PerPatientClipper
from sdk_helpers import CONCEPT_CARDS, tiny_concept_model
from torch import nn

from clinograph.core.errors import PrivacyError

CARDS = CONCEPT_CARDS


def _concept_model(kind: str, seed: int) -> ConceptModel:
    return tiny_concept_model(kind, seed=seed)  # float32, as the runtime trains it


def _concept_batch(seed: int, b: int = 9):
    """Patients of inputs scaled by e^-6 .. e^6 (gradient norms apart by 2-20×) and one (the last)
    with every label missing: a zero gradient."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, 5, generator=gen) * torch.exp(torch.linspace(-6, 6, b))[:, None]
    labels = {"a": torch.randint(0, 2, (b,), generator=gen), "b": torch.randint(0, 3, (b,), generator=gen),
              "y": torch.randint(0, 2, (b,), generator=gen)}
    for y in labels.values():
        y[-1] = -1
    return x, ConceptLabels(labels, frozenset(CARDS), True, "y", 0.8)


def _reference_rows(engine: PerPatientClipper, *inputs, labels) -> np.ndarray:
    """Each patient's reference gradient [B, P] (the module docstring's g_p): a one-position weight's
    b_p a_pᵀ as an exact float64 outer product of the engine's float32 a_p, b_p, every other part's
    rows as the engine formed them."""
    b = int(inputs[0].shape[0])
    cols = []
    parts = engine.parts(*inputs, labels=labels)
    with torch.inference_mode():
        for i, size in enumerate(engine.sizes):
            part = parts.get(i)
            if part is None:
                cols.append(np.zeros((b, size)))
            elif type(part) is LinearWeight and part.flat2d is not None:
                a, g = (t.double().numpy() for t in part.flat2d)
                cols.append((g[:, :, None] * a[:, None, :]).reshape(b, -1))  # exact: 24-bit × 24-bit mantissas
            else:
                cols.append(part.per_sample().double().reshape(b, -1).numpy())
    return np.concatenate(cols, 1)


def _loop_clipped_sum(rows: np.ndarray, clip: float) -> tuple[np.ndarray, np.ndarray]:
    """Σ_p min(1, clip/‖g_p‖)·g_p one patient at a time, each coordinate summed exactly (fsum); and Σ_p
    |min(1, ·)·g_p| (the scale of the sum's float64 error)."""
    clipped = []
    for g in rows:
        norm = math.sqrt(math.fsum(float(v) * float(v) for v in g))
        clipped.append(g * (min(1.0, clip / norm) if norm > 0 else 1.0))
    clipped = np.array(clipped)
    return np.array([math.fsum(col) for col in clipped.T]), np.abs(clipped).sum(0)


@pytest.mark.parametrize(("kind", "seed"), [("c2bm", 0), ("cbm", 1), ("cem", 2), ("cgm", 3)])
def test_the_parts_sum_equals_clipping_each_patients_gradient_in_a_loop(kind, seed):
    """Tight: |parts sum − loop| <= 1e-13·Σ_p|f_p g_p| a coordinate (the bound allows γ_{B+1} ≈ 1e-15
    of it), at a clip below every patient, above every one and in between; a clip factor off by 1e-9
    relative is outside it wherever the clip binds (negative control)."""
    model = _concept_model(kind, seed)
    x, labels = _concept_batch(seed)
    engine = concept_clipper(model, trainable_names(model), like=x)
    rows = _reference_rows(engine, x, {}, labels=labels)
    norms = np.linalg.norm(rows, axis=1)
    assert norms[-1] == 0 and norms.max() > 2 * norms[norms > 0].min()
    # every patient far above the clip, far below it, and a mix (the median: some clipped, some not)
    for clip in (norms[norms > 0].min() / 100, float(np.median(norms[:-1])), norms.max() * 100):
        want, scale = _loop_clipped_sum(rows, clip)
        got = parts_clipped_sum(engine, x, {}, labels=labels, clip=clip)
        assert got is not None and got.dtype == torch.float64
        assert np.all(np.abs(got.numpy() - want) <= 1e-13 * scale + 1e-300)
        off = parts_clipped_sum(engine, x, {}, labels=labels, clip=clip * (1 + 1e-9))  # a wrong clip factor
        assert not np.all(np.abs(off.numpy() - want) <= 1e-13 * scale + 1e-300) or clip > norms.max()


class _Tiny(nn.Module):
    """A one-position Linear with a bias, and a Linear over 3 positions a patient (formed rows)."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.pos = nn.Linear(8, 6), nn.Linear(6, 1), nn.Linear(4, 2)

    def forward(self, x):
        p = self.pos(x[:, 8:].reshape(-1, 3, 4)).sum((1, 2))
        return self.l2(torch.tanh(self.l1(x[:, :8]))).squeeze(-1) + p


def _tiny_objective(model, inputs, labels):
    return ((model(inputs[0]) - labels) ** 2).sum()


def test_the_shrunk_clip_keeps_one_patients_move_of_the_scaled_parts_sum_within_c_s():
    """Removing one patient moves s·x by at most C·s at C' = parts_sum_clip(C, d) (30 draws of 200
    patients whose gradients span five orders of magnitude); at C itself the float errors push it past
    C·s: the shrink is needed, and enough. At the concept demo's d, η is the rows' η with the norms'
    2d + 8 roundings in place of d + 4 (2·(2N+1)·(γ_{2d+8} − γ_{d+4}) more, module docstring step 4)."""
    torch.manual_seed(0)
    model = _Tiny()
    engine = PerPatientClipper(model, objective=_tiny_objective)
    gen = torch.Generator().manual_seed(4)
    scale, past = 16384.0, []
    for _ in range(30):
        x = torch.randn(200, 20, generator=gen) * torch.exp(torch.empty(200, 1).uniform_(-3, 8, generator=gen))
        y = torch.randn(200, generator=gen)
        q = int(torch.randint(0, 200, (1,), generator=gen))
        keep = torch.arange(200) != q
        for clip in (1.0, parts_sum_clip(1.0, engine.dim)):
            move = np.linalg.norm(parts_clipped_sum(engine, x, labels=y, clip=clip).numpy() * scale
                                  - parts_clipped_sum(engine, x[keep], labels=y[keep], clip=clip).numpy() * scale)
            past.append((clip, move > scale))
    assert any(beyond for clip, beyond in past if clip == 1.0)
    assert not any(beyond for clip, beyond in past if clip < 1.0)
    from clinograph.sdk.privacy.distributed_sum import sum_clip

    assert 0 < 1 - parts_sum_clip(1.0, 14869) < 2e-5
    extra = 2 * (2 * 2 ** 17 + 1) * (14869 + 4) * 2.0 ** -53  # 2(2N+1)·(γ_{2d+8} − γ_{d+4}), γ_k ≈ k·u
    assert (1 - parts_sum_clip(1.0, 14869)) - (1 - sum_clip(1.0, 14869)) == pytest.approx(extra, rel=1e-5)


def test_what_the_bound_does_not_cover_is_handed_back_and_a_non_finite_gradient_refused():
    torch.manual_seed(0)
    x, y = torch.randn(5, 20), torch.randn(5)
    wide = _Tiny().double()  # float64 parts: a square could underflow to 0 (module docstring, step 1)
    assert parts_clipped_sum(PerPatientClipper(wide, objective=_tiny_objective), x.double(), labels=y.double(),
                             clip=1.0) is None
    engine = PerPatientClipper(_Tiny(), objective=_tiny_objective)
    assert parts_clipped_sum(engine, x, labels=y, clip=1e-200) is None  # a product could underflow
    assert parts_clipped_sum(engine, x[:0], labels=y[:0], clip=1.0).abs().max() == 0
    x[2, 3] = float("nan")
    with pytest.raises(PrivacyError, match="not finite"):
        parts_clipped_sum(engine, x, labels=y, clip=1.0)


def test_a_patients_parts_do_not_depend_on_the_other_patients_of_the_batch():
    """The bound's assumption (module docstring): removing a patient leaves every other patient's parts
    (layer inputs, output gradients, formed rows) bit for bit the same -- else a neighbouring batch
    would move every g_p, not one. A concept model at an odd batch (BLAS blocks of rows cut
    differently at 257 and 256), several patients removed."""
    model = _concept_model("cgm", 5)
    gen = torch.Generator().manual_seed(5)
    n = 257
    x = torch.randn(n, 5, generator=gen)
    labels = {"a": torch.randint(0, 2, (n,), generator=gen), "b": torch.randint(0, 3, (n,), generator=gen),
              "y": torch.randint(0, 2, (n,), generator=gen)}
    y = ConceptLabels(labels, frozenset(CARDS), True, "y", 0.8)
    engine = concept_clipper(model, trainable_names(model), like=x)
    whole = _reference_rows(engine, x, {}, labels=y)
    for q in (0, 100, n - 1):
        keep = torch.arange(n) != q
        fewer = ConceptLabels({v: t[keep] for v, t in labels.items()}, y.supervised, True, "y", 0.8)
        assert np.array_equal(_reference_rows(engine, x[keep], {}, labels=fewer), whole[keep.numpy()])


def test_a_bias_whose_weight_the_engine_does_not_train_is_summed_as_its_own_row():
    """A one-position layer's bias is summed with its weight (one ‖b_p‖², one f∘b) only when that
    weight is among the engine's parts. A weight the engine does not train (frozen when the engine
    was built, trainable since) leaves its bias a row of its own: before, the bias was taken for
    its weight's and dropped -- zeros in the sum and nothing in the norm, silently."""
    torch.manual_seed(0)
    model = _Tiny()
    model.l1.weight.requires_grad_(False)
    engine = PerPatientClipper(model, objective=_tiny_objective)
    model.l1.weight.requires_grad_(True)  # the rule now forms l1's weight part; the engine drops it
    x, y = torch.randn(7, 20), torch.randn(7)
    rows = _reference_rows(engine, x, labels=y)
    assert np.abs(rows[:, :6]).min() > 0  # l1.bias (the engine's first parameter) has a gradient
    for clip in (float(np.median(np.linalg.norm(rows, axis=1))), 1e6):
        want, scale = _loop_clipped_sum(rows, clip)
        got = parts_clipped_sum(engine, x, labels=y, clip=clip).numpy()
        assert np.all(np.abs(got - want) <= 1e-13 * scale + 1e-300)


class _Mixed(nn.Module):
    """Parts of every kind the path reads: a one-position Linear with its bias, a Linear whose input is
    broadcast over positions (stride 0: one position after the engine sums its output gradients), a
    three-position Linear (formed rows) and an embedding (formed rows)."""

    def __init__(self):
        super().__init__()
        self.one, self.wide = nn.Linear(4, 3), nn.Linear(3, 2)
        self.spread, self.pos, self.emb = nn.Linear(3, 2), nn.Linear(4, 2), nn.Embedding(5, 3)

    def forward(self, x):
        spread = self.spread(x[:, :3, None].expand(-1, 3, 4).transpose(1, 2)).sum((1, 2))
        pos = self.pos(x[:, 4:16].reshape(-1, 3, 4)).sum((1, 2))
        emb = self.emb(x[:, 16].abs().long() % 5).sum(1)
        return self.wide(torch.tanh(self.one(x[:, :4]))).sum(1) + spread + pos + emb


@pytest.mark.parametrize(("b", "size"), [(1, 1.0), (6, 1.0), (6, 1e18)])
def test_every_kind_of_part_at_one_patient_and_at_gradients_past_float32s_squares(b, size):
    """The parts sum against the loop (fsum) with one patient, and with inputs of 1e18 (gradient entries
    near 1e36: their squares overflow float32, not the float64 the norms are taken in); inputs of 1e30
    overflow the float32 forward itself and are refused, not summed."""
    torch.manual_seed(1)
    engine = PerPatientClipper(_Mixed(), objective=_tiny_objective)
    gen = torch.Generator().manual_seed(b)
    x, y = torch.randn(b, 17, generator=gen) * size, torch.randn(b, generator=gen)
    rows = _reference_rows(engine, x, labels=y)
    assert np.isfinite(rows).all() and (size == 1.0 or np.abs(rows).max() > 1e30)
    for clip in (float(np.linalg.norm(rows, axis=1).min()) / 3, 1e100):  # all clipped; none
        want, scale = _loop_clipped_sum(rows, clip)
        got = parts_clipped_sum(engine, x, labels=y, clip=clip).numpy()
        assert np.all(np.abs(got - want) <= 1e-13 * scale + 1e-300)
    with pytest.raises(PrivacyError, match="not finite"):
        parts_clipped_sum(engine, x * 1e12 if size > 1 else x * 1e30, labels=y, clip=1.0)
