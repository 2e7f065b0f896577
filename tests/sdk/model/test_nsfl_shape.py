"""NS-FL's wide path with shape functions ([model] linear_shape): the hat basis, both forward
paths agree, Theorem 1 still holds, and the rows stay ``linear/<f>``."""

import numpy as np
import torch
from clinograph.sdk.graph import build_graph, star_batch
from clinograph.sdk.model import NSFLConfig, NSFLModel, nsfl_modules
from clinograph.sdk.model.nsfl import SHAPE_KNOTS, hat_basis
from clinograph.sdk.training import bce
from sdk_helpers import small_tables


def shaped(t, *, seed=0, shape=True):
    m = NSFLModel(len(t.dictionary.node_ids()), NSFLConfig(hidden=8, init_seed=seed, linear_shape=shape)).double()
    with torch.no_grad():  # zero at init: give the wide rows values so the shape term is exercised
        m.linear.weight.copy_(torch.randn(m.linear.weight.shape, generator=torch.Generator().manual_seed(1)))
    return m


def test_hat_basis_interpolates_the_knots_and_is_flat_beyond_them():
    k = torch.tensor([-1.0, 0.0, 2.0], dtype=torch.float64)
    x = torch.tensor([-5.0, -1.0, -0.5, 0.0, 1.0, 2.0, 9.0], dtype=torch.float64)
    b = hat_basis(x, k)
    expected = [[1, 0, 0], [1, 0, 0], [0.5, 0.5, 0], [0, 1, 0], [0, 0.5, 0.5], [0, 0, 1], [0, 0, 1]]
    np.testing.assert_allclose(b.numpy(), expected, atol=1e-12)
    # a shape f given at the knots is read back as its linear interpolation (a U here)
    f = torch.tensor([3.0, 0.0, 4.0], dtype=torch.float64)
    np.testing.assert_allclose((b * f).sum(-1).numpy(), [3, 3, 1.5, 0, 2, 4, 4], atol=1e-12)


def test_linear_shape_changes_the_rows_and_the_logits_but_not_the_default():
    t = small_tables()[0]
    ids = t.dictionary.node_ids()
    plain, shape = shaped(t, shape=False), shaped(t)
    assert plain.linear.weight.shape[1] == 2 and shape.linear.weight.shape[1] == 2 + len(SHAPE_KNOTS)
    assert nsfl_modules(shape, ids).get("linear/heart_rate").size == 2 + len(SHAPE_KNOTS)
    assert set(shape.state_dict()) == set(plain.state_dict())  # no new buffers or module names
    stars = star_batch(t)
    assert not torch.allclose(plain.forward_batch(stars), shape.forward_batch(stars))
    assert NSFLConfig().linear_shape is False


def test_star_path_equals_full_graph_with_shape_functions(f64):
    t = small_tables()[1]
    m = shaped(t)
    full = m.forward_graph(build_graph(t, k_similar=0), use_similar=False)
    assert torch.allclose(full, m.forward_batch(star_batch(t)), atol=1e-10)
    full = m.forward_graph(build_graph(t, k_similar=4))
    part = m.forward_batch(star_batch(t, k_similar=4), torch.tensor([0, 5, 17, 50]))
    assert torch.allclose(full[[0, 5, 17, 50]], part, atol=1e-10)


def test_theorem1_unobserved_features_shape_rows_get_exactly_zero_gradient():
    t = small_tables()[2]  # lacks the blood-gas block
    m = shaped(t).float()
    m.zero_grad()
    bce(m.forward_graph(build_graph(t, k_similar=3)), torch.tensor(t.labels, dtype=torch.float32)).backward()
    idx = t.dictionary.node_index()
    for name in ("sao2", "svo2", "paco2"):
        assert torch.count_nonzero(m.linear.weight.grad[idx[name]]) == 0
    assert torch.count_nonzero(m.linear.weight.grad[idx["heart_rate"], 2:]) > 0


def test_exported_star_model_keeps_the_shape_functions(tmp_path):
    from clinograph.sdk.model.export import export_model, star_risk
    from clinograph.sdk.model.load import load_exported, predict_exported

    from clinograph.core.identity import Identity

    me = Identity.generate("h")

    t = small_tables()[0]
    m = shaped(t).float()
    path, _ = export_model(m, tmp_path / "m.safetensors", dictionary=t.dictionary, signer=me)
    loaded = load_exported(path, trusted=me.public, insecure_untrusted_model=True)
    np.testing.assert_allclose(predict_exported(loaded, t), star_risk(m, t, dictionary=t.dictionary),
                               rtol=1e-5, atol=1e-6)
