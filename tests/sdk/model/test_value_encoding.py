"""NS-FL's piecewise value encoding in the GNN messages ([model] value_encoding = "piecewise" and
its factorised form "piecewise_gated"):
the message is non-linear in the value, round 0 equals the linear encoding, both forward paths
agree, Theorem 1 still holds, per-sample gradients stay exact (Opacus and the book-keeping
engine) and the TorchScript export matches the SDK's prediction."""

import copy

import numpy as np
import pytest
import torch
from clinograph.sdk.graph import build_graph, star_batch
from clinograph.sdk.model import NSFLConfig, NSFLModel, nsfl_modules
from clinograph.sdk.model.layers import RelationAttention
from clinograph.sdk.model.nsfl import SHAPE_KNOTS
from clinograph.sdk.privacy import star_loss, unused_star_parameters
from clinograph.sdk.privacy.part_rules import register_opacus_samplers
from clinograph.sdk.privacy.per_patient import PerPatientClipper, star_probe
from clinograph.sdk.training import bce
from opacus.grad_sample import get_gsm_class
from sdk_helpers import small_tables


def encoded(t, *, seed=0, encoding="piecewise", shape=False, perturb=True):
    cfg = NSFLConfig(hidden=8, init_seed=seed, value_encoding=encoding, linear_shape=shape)
    m = NSFLModel(len(t.dictionary.node_ids()), cfg).double()
    if perturb:  # U and the wide rows are zero at init: move every weight so each term is exercised
        gen = torch.Generator().manual_seed(11)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return m


def test_piecewise_message_is_a_per_feature_curve_in_the_value():
    rel = RelationAttention(4, valued=True, value_knots=(-1.0, 0.0, 1.0)).double()
    lin = RelationAttention(4, valued=True).double()
    with torch.no_grad():
        for p in rel.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3), dtype=p.dtype))
        lin.W.weight.copy_(rel.W.weight)
        lin.V.weight.copy_(rel.V.weight)
    h = torch.randn(2, 4, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    xs = torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64)
    with torch.no_grad():
        m = torch.stack([rel.message(h, x.expand(2)) for x in xs])  # [3 values, 2 features, d]
        # at knot k the extra term is exactly U_k h
        u = rel.U(h).reshape(2, 3, 4)
        for k, x in enumerate(xs):
            np.testing.assert_allclose((m[k] - lin.message(h, x.expand(2))).numpy(), u[:, k].numpy(), atol=1e-12)
        # non-linear in x (the linear encoding's m(0) is the mean of m(-1) and m(1); this one's is not)
        assert (m[1] - (m[0] + m[2]) / 2).abs().max() > 1e-3
        lm = torch.stack([lin.message(h, x.expand(2)) for x in xs])
        assert torch.allclose(lm[1], (lm[0] + lm[2]) / 2, atol=1e-12)
    with pytest.raises(ValueError, match="valued relation"):
        RelationAttention(4, valued=False, value_knots=(0.0, 1.0))


def test_gated_message_scales_shared_curves_by_the_feature_state():
    rel = RelationAttention(4, valued=True, value_knots=(-1.0, 0.0, 1.0), value_gated=True).double()
    assert rel.U.weight.shape == (4, 3)  # G: one curve per channel, M values each
    with torch.no_grad():
        for p in rel.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3), dtype=p.dtype))
        h = torch.randn(2, 4, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
        xs = torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64)
        base = [rel.W(h) + x * rel.V(h) for x in xs]
        for k, x in enumerate(xs):  # at knot k: + G[:, k] ⊙ h_v
            np.testing.assert_allclose((rel.message(h, x.expand(2)) - base[k]).numpy(),
                                       (rel.U.weight[:, k] * h).numpy(), atol=1e-12)
        mid = rel.message(h, torch.full((2,), 0.5, dtype=torch.float64))  # halfway between knots 1 and 2
        np.testing.assert_allclose(mid.numpy(), ((rel.message(h, xs[1].expand(2)) + rel.message(
            h, xs[2].expand(2))) / 2).numpy(), atol=1e-12)


ENCODINGS = ["piecewise", "piecewise_gated"]


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_round_zero_equals_the_linear_encoding_and_the_default_is_unchanged(encoding):
    t = small_tables()[0]
    lin, pw = encoded(t, encoding="linear", perturb=False), encoded(t, encoding=encoding, perturb=False)
    assert NSFLConfig().value_encoding == "linear"
    extra = set(pw.state_dict()) - set(lin.state_dict())
    assert extra == {"l1_of_patient.U.weight", "l2_of_patient.U.weight"}
    n = len(SHAPE_KNOTS)
    assert pw.l1_of_patient.U.weight.shape == ((8, n) if encoding == "piecewise_gated" else (8 * n, 8))
    for k, v in lin.state_dict().items():  # the same draws for every other weight
        assert torch.equal(v, pw.state_dict()[k]), k
    stars = star_batch(t)
    # up to rounding: the non-DP path sums the zero U rows in the same product as W's and V's
    torch.testing.assert_close(pw.forward_batch(stars), lin.forward_batch(stars), atol=1e-12, rtol=0)
    # the per-copy (DP) path adds U's term on its own: bit for bit
    fi, x, m = stars.feature_index, stars.values, stars.mask
    assert torch.equal(lin.forward_star(fi, x, m), pw.forward_star(fi, x, m))
    # U lives in the shared GNN modules; no new module name
    ids = t.dictionary.node_ids()
    assert nsfl_modules(pw, ids).names() == nsfl_modules(lin, ids).names()
    assert nsfl_modules(pw, ids).get("gnn/layer1/of_patient").size > nsfl_modules(lin, ids).get(
        "gnn/layer1/of_patient").size
    pw.zero_grad()
    bce(pw.forward_batch(stars), torch.tensor(t.labels, dtype=torch.float64)).backward()
    assert torch.count_nonzero(pw.l1_of_patient.U.weight.grad) > 0  # it learns from round 1


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_star_path_equals_full_graph_with_piecewise_encoding(f64, encoding):
    t = small_tables()[1]
    m = encoded(t, shape=True, encoding=encoding)
    ref = encoded(t, encoding="linear", shape=True)
    star = m.forward_batch(star_batch(t))
    full = m.forward_graph(build_graph(t, k_similar=0), use_similar=False)
    assert torch.allclose(full, star, atol=1e-10)
    assert not torch.allclose(star, ref.forward_batch(star_batch(t)))  # the encoding does change the logits
    full = m.forward_graph(build_graph(t, k_similar=4))
    part = m.forward_batch(star_batch(t, k_similar=4), torch.tensor([0, 5, 17, 50]))
    assert torch.allclose(full[[0, 5, 17, 50]], part, atol=1e-10)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_theorem1_unobserved_features_rows_get_exactly_zero_gradient_with_piecewise_encoding(f64, encoding):
    t = small_tables()[2]  # lacks the blood-gas block
    m = encoded(t, shape=True, encoding=encoding)
    g, gc = build_graph(t, k_similar=3), build_graph(t, k_similar=3, complete_schema=True)
    y = g["patient"].y.double()
    grads = []
    for graph in (g, gc):
        m.zero_grad()
        bce(m.forward_graph(graph), y).backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters()})
    for n in grads[0]:  # isolated unobserved feature nodes change nothing
        assert torch.allclose(grads[0][n], grads[1][n], atol=1e-12), n
    idx = t.dictionary.node_index()
    for name in ("sao2", "svo2", "paco2"):
        for p in ("embedding.weight", "linear.weight"):
            assert torch.count_nonzero(grads[0][p][idx[name]]) == 0, (name, p)
    assert torch.count_nonzero(grads[0]["embedding.weight"][idx["heart_rate"]]) > 0


def _dp_model(t, encoding):
    m = encoded(t, encoding=encoding)
    for name in unused_star_parameters(m):
        dict(m.named_parameters())[name].requires_grad_(False)
    return m


def _batch(t, n=8):
    stars = star_batch(t)
    fi, x, m, y = stars.feature_index[:n], stars.values[:n].double(), stars.mask[:n].clone(), stars.labels[:n].double()
    m[0] = False  # a patient with no observed feature
    m[1, 3:] = False  # a small star
    x[2, :] = torch.linspace(-6, 6, x.shape[1])  # values across every knot and beyond the clip
    return fi, x, m, y


def _loop(reference, names, fi, x, m, y):
    ref = dict(reference.named_parameters())
    per = []
    for i in range(len(y)):
        reference.zero_grad(set_to_none=True)
        star_loss(reference(fi[i:i + 1], x[i:i + 1], m[i:i + 1]), y[i:i + 1]).backward()
        per.append({n: ref[n].grad.clone() if ref[n].grad is not None else torch.zeros_like(ref[n]) for n in names})
    return per


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_per_sample_gradients_stay_exact_with_piecewise_encoding(encoding):
    t = small_tables()[2]
    model = _dp_model(t, encoding)
    fi, x, m, y = _batch(t)
    reference = copy.deepcopy(model)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert {"l1_of_patient.U.weight", "l2_of_patient.U.weight"} <= set(names)
    per = _loop(reference, names, fi, x, m, y)
    # Opacus, hooks mode (the piecewise encoding's KnotLinear registered with it)
    register_opacus_samplers()
    gsm = get_gsm_class("hooks")(model, batch_first=True, loss_reduction="mean")
    star_loss(gsm(fi, x, m), y).backward()
    params = dict(model.named_parameters())
    for i in range(len(y)):
        for n in names:
            err = (params[n].grad_sample[i] - per[i][n]).abs().max().item()
            assert err <= 1e-5, f"{n}, patient {i}: off by {err:.2e}"
    assert per[2]["l2_of_patient.U.weight"].abs().max() > 0
    gsm._close()
    # the book-keeping engine (local and distributed DP)
    model = _dp_model(t, encoding)
    probe = star_probe(model.n_features)
    engine = PerPatientClipper(model, probe=(probe[0], probe[1].double(), probe[2]))
    grads, _ = engine.per_sample(fi, x, m, labels=y)
    got = engine.flat(grads, len(y), torch.float64)
    want = torch.stack([torch.cat([per[i][n].reshape(-1) for n in names]) for i in range(len(y))])
    assert (got - want).abs().max().item() <= 1e-9
    # its clipped sum (the knot-sorted product for U) against Σ_i min(1, C/‖g_i‖) g_i of the loop
    out = engine.clipped_sum(fi, x, m, labels=y, clip_norm=0.5)
    factor = (0.5 / (want.norm(dim=1) + 1e-6)).clamp(max=1.0)
    assert float(factor.min()) < 1  # some patient is clipped
    assert (out.summed - factor @ want).abs().max().item() <= 1e-9


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_exported_star_model_keeps_the_piecewise_encoding(tmp_path, encoding):
    from clinograph.sdk.model.export import export_model, star_risk
    from clinograph.sdk.model.load import load_exported, predict_exported

    from clinograph.core.identity import Identity

    me = Identity.generate("h")

    t = small_tables()[0]
    m = encoded(t, shape=True, encoding=encoding).float()
    path, _ = export_model(m, tmp_path / "m.safetensors", dictionary=t.dictionary, signer=me)
    loaded = load_exported(path, trusted=me.public, insecure_untrusted_model=True)
    got = predict_exported(loaded, t)
    np.testing.assert_allclose(got, star_risk(m, t, dictionary=t.dictionary), rtol=1e-5, atol=1e-6)
    lin = encoded(t, encoding="linear", shape=True).float()
    assert np.abs(got - star_risk(lin, t, dictionary=t.dictionary)).max() > 1e-4  # U is in the file
