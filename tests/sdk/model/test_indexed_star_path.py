"""The non-DP star path computes the feature copies' states once per dictionary feature
(``NSFLModel._layer1_indexed``, ``RelationAttention._dense_rows``: messages as per-copy coefficients
of table rows) and reads the piecewise
encoding at the two knots its hat basis is non-zero on (``hat_pair``). Exact rewrites: the same logits and the same
gradient for every parameter as the per-copy path Opacus wraps (``forward_star``) and as the
full graph's edge lists, and still no gradient for a feature no star holds (Theorem 1)."""

import dataclasses

import pytest
import torch
from clinograph.sdk.graph import build_graph, star_batch
from clinograph.sdk.model import NSFLConfig, NSFLModel
from clinograph.sdk.model.layers import hat_basis, hat_pair
from clinograph.sdk.model.nsfl import SHAPE_KNOTS
from clinograph.sdk.training import bce
from sdk_helpers import small_tables

ENCODINGS = ["linear", "piecewise", "piecewise_gated"]


def perturbed(t, encoding: str) -> NSFLModel:
    m = NSFLModel(len(t.dictionary.node_ids()), NSFLConfig(hidden=8, init_seed=0, value_encoding=encoding,
                                                           linear_shape=True)).double()
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():  # U and the wide rows start at zero: move every weight so each term counts
        for p in m.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return m


def grads_of(m: NSFLModel, logits_fn, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    m.zero_grad()
    z = logits_fn()
    bce(z, y).backward()
    return z.detach(), {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
                        for n, p in m.named_parameters()}


def test_two_knot_read_equals_the_full_hat_basis(f64):
    knots = torch.tensor(SHAPE_KNOTS, dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.linspace(-7, 7, 2001, dtype=torch.float64), knots,  # on, between and beyond the knots
                   knots + 1e-9, knots - 1e-9, 20 * torch.randn(500, generator=gen, dtype=torch.float64)])
    u = torch.randn(len(x), len(knots), 6, generator=gen, dtype=torch.float64)
    full = (hat_basis(x, knots).unsqueeze(-1) * u).sum(-2)
    k, t = hat_pair(x, knots)
    assert int(k.min()) >= 0 and int(k.max()) <= len(knots) - 2 and float(t.min()) >= 0 and float(t.max()) <= 1
    rows = torch.arange(len(x))

    def two(kk):
        return (1 - t).unsqueeze(-1) * u[rows, kk] + t.unsqueeze(-1) * u[rows, kk + 1]

    torch.testing.assert_close(two(k), full, atol=1e-12, rtol=0)
    # a wrong bucket would show: shift k by one and the identity breaks
    assert not torch.allclose(two((k + 1).clamp(max=len(knots) - 2)), full)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_indexed_star_path_equals_the_per_copy_path_logits_and_gradients(f64, encoding):
    t = small_tables()[1]
    m = perturbed(t, encoding)
    stars = star_batch(t, k_similar=0)
    stars = dataclasses.replace(stars, values=stars.values.double())  # float32 values: the basis in float32
    y = torch.tensor(t.labels, dtype=torch.float64)
    idx = torch.arange(len(stars))
    z_new, g_new = grads_of(m, lambda: m.forward_neighbourhood(stars, idx), y)
    z_ref, g_ref = grads_of(m, lambda: m.forward_star(stars.feature_index, stars.values, stars.mask), y)
    torch.testing.assert_close(z_new, z_ref, atol=1e-10, rtol=0)
    for n in g_ref:
        torch.testing.assert_close(g_new[n], g_ref[n], atol=1e-10, rtol=1e-9, msg=n)
    assert any(float(g.abs().max()) > 0 for n, g in g_ref.items() if n.startswith("l2_of_patient"))


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_indexed_neighbourhood_equals_the_full_graph_logits_and_gradients(f64, encoding):
    t = small_tables()[0]
    m = perturbed(t, encoding)
    stars, graph = star_batch(t, k_similar=4), build_graph(t, k_similar=4)
    y = torch.tensor(t.labels, dtype=torch.float64)
    z_new, g_new = grads_of(m, lambda: m.forward_batch(stars), y)
    z_ref, g_ref = grads_of(m, lambda: m.forward_graph(graph), y)
    # the two builders compute the similar_to weights in float32 each (3.7e-8 apart before this path too)
    torch.testing.assert_close(z_new, z_ref, atol=1e-6, rtol=0)
    for n in g_ref:
        torch.testing.assert_close(g_new[n], g_ref[n], atol=1e-6, rtol=1e-5, msg=n)


@pytest.mark.parametrize("k_similar", [0, 3])
def test_theorem1_a_feature_no_star_holds_gets_no_gradient_on_the_indexed_path(f64, k_similar):
    t = small_tables()[2]  # lacks the blood-gas block
    m = perturbed(t, "piecewise")
    stars = star_batch(t, k_similar=k_similar)
    _, g = grads_of(m, lambda: m.forward_batch(stars), torch.tensor(t.labels, dtype=torch.float64))
    idx = t.dictionary.node_index()
    held = set(stars.feature_index[stars.mask].tolist())
    for name in ("sao2", "svo2", "paco2"):
        assert idx[name] not in held
        for p in ("embedding.weight", "linear.weight", "mask_logit.weight"):
            assert torch.count_nonzero(g[p][idx[name]]) == 0, (name, p)
    some = next(iter(held))
    assert torch.count_nonzero(g["embedding.weight"][some]) > 0  # and a held feature does get one


RELATIONS = {"valued_linear": {"valued": True}, "valued_piecewise": {"valued": True, "value_knots": SHAPE_KNOTS},
             "valued_piecewise_folded": {"valued": True, "value_knots": SHAPE_KNOTS, "value_range": 7.0},
             "valued_gated": {"valued": True, "value_knots": SHAPE_KNOTS, "value_gated": True},
             "weighted": {"valued": False}, "unweighted": {"valued": False}}


@pytest.mark.parametrize("kind", list(RELATIONS))
def test_table_rows_attention_equals_the_per_copy_attention_for_every_relation_kind(f64, kind):
    """RelationAttention.dense(index=...) (messages as coefficients of table rows) against the per-copy
    dense on the gathered sources: output and every gradient, the table's included; values on, between
    and beyond the knots, and a star with no observed copy (an all-zero row, no NaN)."""
    from clinograph.sdk.model.layers import RelationAttention

    gen = torch.Generator().manual_seed(2)
    rel = _randomised(RelationAttention(6, **RELATIONS[kind]).double(), gen)
    table = torch.randn(9, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    h_dst = torch.randn(5, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    index = torch.randint(0, 9, (5, 7), generator=gen)
    x = torch.cat([torch.tensor(SHAPE_KNOTS[:7], dtype=torch.float64).unsqueeze(0),
                   6 * torch.randn(4, 7, generator=gen, dtype=torch.float64)])
    x = None if kind == "unweighted" else x
    if "value_range" in RELATIONS[kind]:  # the folded rows hold values within ±value_range (the model clips)
        x = x.clamp(-7.0, 7.0)
        assert float(x.abs().max()) == 7.0 and int((x.abs() > 4).sum()) >= 3  # on the bound and beyond the knots
    mask = torch.rand(5, 7, generator=gen) < 0.7
    mask[2] = False
    params = [table, h_dst, *rel.parameters()]
    outs = []
    for rows in (True, False):
        out = rel.dense(table, h_dst, x, mask, index=index) if rows else rel.dense(table[index], h_dst, x, mask)
        outs.append((out.detach(), torch.autograd.grad((out * torch.linspace(-1, 1, 6, dtype=out.dtype)).sum(), params)))
    (o_rows, g_rows), (o_copy, g_copy) = outs
    torch.testing.assert_close(o_rows, o_copy, atol=1e-12, rtol=0)
    assert torch.count_nonzero(o_rows[2]) == 0 and o_rows.abs().max() > 0
    for a, b in zip(g_rows, g_copy, strict=True):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-10)


@pytest.mark.parametrize("value_range", [None, 9.0, 2.5])
def test_piecewise_table_rows_equal_the_per_copy_hat_basis_at_an_alarm_sized_batch(f64, value_range):
    """The knot rows read by two gathers, a lerp and two scatters (``_dense_rows``) against U h_f on
    every copy with the full hat basis (``message``): 23 features, stars of 23 copies with repeats,
    values on every knot interval, on the knots and beyond; output and every gradient. With
    ``value_range`` W and V are folded into the knot rows (extended to ±9 beyond the outer knots; at
    2.5, inside them, not extended), the values clipped to it as the model clips them."""
    from clinograph.sdk.model.layers import RelationAttention

    gen = torch.Generator().manual_seed(3)
    rel = _randomised(RelationAttention(8, valued=True, value_knots=SHAPE_KNOTS, value_range=value_range).double(), gen)
    table = torch.randn(23, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    h_dst = torch.randn(32, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    index = torch.randint(0, 23, (32, 23), generator=gen)
    x = 3 * torch.randn(32, 23, generator=gen, dtype=torch.float64)
    x[0, :13] = torch.tensor(SHAPE_KNOTS, dtype=torch.float64)
    x[1, :4] = torch.tensor([-9.0, 9.0, -4.0 - 1e-12, 4.0 + 1e-12], dtype=torch.float64)
    if value_range is not None:
        x = x.clamp(-value_range, value_range)
        assert rel.folded_knots.shape[0] == (15 if value_range > 4 else 13)
    mask = torch.rand(32, 23, generator=gen) < 0.9
    params = [table, h_dst, *rel.parameters()]
    w = torch.randn(32, 8, generator=gen, dtype=torch.float64)
    outs = []
    for rows in (True, False):
        out = rel.dense(table, h_dst, x, mask, index=index) if rows else rel.dense(table[index], h_dst, x, mask)
        outs.append((out.detach(), torch.autograd.grad((out * w).sum(), params)))
    (o_rows, g_rows), (o_copy, g_copy) = outs
    torch.testing.assert_close(o_rows, o_copy, atol=1e-12, rtol=0)
    assert float(g_rows[3 + 2].abs().max()) > 0  # U's gradient is exercised (parameters: W, V, U, a_dst, a_src)
    for a, b in zip(g_rows, g_copy, strict=True):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-10)


def _randomised(module, gen):
    """``module`` with every parameter drawn from N(0, 1) by ``gen`` (no zero-initialised knot weight)."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return module


def test_kept_knot_rows_follow_the_stars_values(f64):
    """``_knot_rows`` keeps every star's U rows and weights between steps: reused while the stars' tensors
    are the same and unchanged, searched again after an in-place change of the values (their version)
    or for other stars, and not carried by a copy or a pickle of the model. Each time the logits are
    the per-copy path's on the current values."""
    import copy
    import pickle

    t = small_tables()[1]
    m = perturbed(t, "piecewise")
    stars = star_batch(t, k_similar=0)
    stars = dataclasses.replace(stars, values=stars.values.double())
    idx = torch.arange(len(stars))

    def check():
        ref = m.forward_star(stars.feature_index, stars.values, stars.mask)
        torch.testing.assert_close(m.forward_neighbourhood(stars, idx), ref, atol=1e-10, rtol=0)

    check()
    kept = m._rows_cache.last[3]
    check()
    assert m._rows_cache.last[3] is kept  # the same stars: the rows are reused
    with torch.no_grad():
        stars.values.mul_(-1.7).add_(0.4)  # in place: every value moves to another knot interval
    check()
    assert m._rows_cache.last[3] is not kept
    stars = dataclasses.replace(stars, values=stars.values.flip(0))  # other stars
    check()
    for clone in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert clone._rows_cache.last is None


def test_folded_knot_rows_refuse_values_beyond_their_range():
    """The folded rows hold the value channel only within ±value_range: a value beyond it is refused
    with the fix, not silently read as the bound."""
    from clinograph.sdk.model.layers import RelationAttention

    rel = RelationAttention(4, valued=True, value_knots=SHAPE_KNOTS, value_range=5.0)
    x = torch.tensor([[0.5, -5.0, 5.0], [5.25, 0.0, 1.0]])
    with pytest.raises(ValueError, match="beyond value_range ±5.0.*clip them first"):
        rel.dense(torch.randn(3, 4), torch.randn(2, 4), x, torch.ones(2, 3, dtype=torch.bool),
                  index=torch.tensor([[0, 1, 2], [2, 1, 0]]))
    with pytest.raises(ValueError, match="value_range must be > 0"):
        RelationAttention(4, valued=True, value_knots=SHAPE_KNOTS, value_range=0.0)
