"""[model] deep = false (issue 15, session 7): the GNN's term leaves the logit, which is then
the head's bias plus the wide path -- a federated logistic regression (or GAM with shape
functions) over every dictionary feature -- on every path; the GNN's weights get exactly zero
gradient (per sample too), the state_dict is unchanged, and the setting needs the wide path."""

import pytest
import torch
from clinograph.sdk.graph import build_graph, star_batch
from clinograph.sdk.model import NSFLConfig, NSFLModel
from clinograph.sdk.training import bce
from sdk_helpers import small_tables

from clinograph.core.errors import ConfigError


def _model(t, *, deep, shape=False):
    m = NSFLModel(len(t.dictionary.node_ids()), NSFLConfig(hidden=8, deep=deep, linear_shape=shape)).double()
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():  # the wide rows start at zero: move every weight so each term is exercised
        for p in m.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return m


@pytest.mark.parametrize("shape", [False, True])
def test_the_logit_is_the_bias_plus_the_wide_path_on_every_path(f64, shape):
    t = small_tables()[1]
    wide, deep = _model(t, deep=False, shape=shape), _model(t, deep=True, shape=shape)
    assert wide.state_dict().keys() == deep.state_dict().keys()
    stars = star_batch(t)
    expected = wide.head.bias + wide.linear_star(stars.feature_index, wide._clip(stars.values), stars.mask)
    assert torch.allclose(wide.forward_batch(stars), expected, atol=1e-12)
    assert torch.allclose(wide.forward_graph(build_graph(t, k_similar=4)), expected, atol=1e-12)
    part = torch.tensor([0, 7, 30])
    assert torch.allclose(wide.forward_batch(star_batch(t, k_similar=4), part), expected[part], atol=1e-12)
    assert not torch.allclose(deep.forward_batch(stars), expected)  # with the GNN the logit differs


def test_only_the_wide_rows_and_the_head_bias_get_gradient(f64):
    t = small_tables()[0]
    m = _model(t, deep=False)
    g = build_graph(t, k_similar=3)
    bce(m.forward_graph(g), g["patient"].y.double()).backward()
    moving = {n for n, p in m.named_parameters() if p.grad is not None and torch.count_nonzero(p.grad) > 0}
    assert moving == {"linear.weight", "head.bias"}


def test_per_sample_gradients_of_the_gnn_are_zero_under_opacus_hooks():
    from opacus.grad_sample import GradSampleModule

    t = small_tables()[0]
    m = GradSampleModule(_model(t, deep=False).float())
    stars = star_batch(t)
    b = torch.arange(6)
    logits = m(stars.feature_index[b], stars.values[b].float(), stars.mask[b])
    bce(logits, stars.labels[b].float()).backward()
    for n, p in m.named_parameters():
        gs = getattr(p, "grad_sample", None)
        if n.endswith(("linear.weight", "head.bias")):
            assert gs is not None and torch.count_nonzero(gs) > 0, n
        elif gs is not None:
            assert torch.count_nonzero(gs) == 0, n


def test_deep_off_needs_the_static_wide_path():
    with pytest.raises(ConfigError, match="deep = false"):
        NSFLConfig(deep=False, linear_path=False)
    with pytest.raises(ConfigError, match="deep = false"):
        NSFLConfig(deep=False, temporal="attention")
    assert NSFLConfig(deep=False).deep is False and NSFLConfig().deep is True


def test_an_exported_wide_only_model_predicts_as_in_the_federation(tmp_path):
    import numpy as np
    from clinograph.sdk.model.export import export_model, star_risk
    from clinograph.sdk.model.load import load_exported, predict_exported

    from clinograph.core.identity import Identity

    me = Identity.generate("h")

    t = small_tables()[0]
    m = _model(t, deep=False).float()
    path, _ = export_model(m, tmp_path / "m.safetensors", dictionary=t.dictionary, signer=me)
    loaded = load_exported(path, trusted=me.public, insecure_untrusted_model=True)
    got = predict_exported(loaded, t)
    np.testing.assert_allclose(got, star_risk(m, t, dictionary=t.dictionary), rtol=1e-5, atol=1e-6)
    deep = _model(t, deep=True).float()  # the same weights with the GNN's term: other risks
    assert np.abs(got - star_risk(deep, t, dictionary=t.dictionary)).max() > 1e-4
