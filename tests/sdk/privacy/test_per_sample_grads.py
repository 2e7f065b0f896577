"""Per-sample gradients on the DP (star) model equal a per-patient loop: Opacus's hooks/ew modes
and the book-keeping engine of sdk/privacy/per_patient.py (clipped sums too).

privacy.md: PyG layers under Opacus fail or give wrong per-sample gradients silently; the DP
model is correct only because this comparison passes, for every trainable parameter.
"""

from __future__ import annotations

import copy

import pytest
import torch
from clinograph.sdk.graph.star import star_batch
from clinograph.sdk.model.nsfl import NSFLConfig, NSFLModel
from clinograph.sdk.privacy import star_loss, unused_star_parameters
from clinograph.sdk.privacy.per_patient import PerPatientClipper, star_probe
from opacus import GradSampleModule
from opacus.grad_sample import get_gsm_class

from clinograph.core.errors import PrivacyError


def _model(n_features: int) -> NSFLModel:
    model = NSFLModel(n_features, NSFLConfig(hidden=8, init_seed=5)).double()
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():  # move off the deterministic init so no gradient is trivially symmetric
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    for name, p in model.named_parameters():
        if name in unused_star_parameters(model):
            p.requires_grad_(False)
    return model


def _batch(tables, n: int = 10):
    stars = star_batch(tables[2])  # the hospital without blood gases: stars of several sizes
    fi, x, m, y = stars.feature_index[:n], stars.values[:n].double(), stars.mask[:n].clone(), stars.labels[:n].double()
    m[0] = False  # a patient with no observed feature at all
    m[1, 3:] = False  # and a small star
    return fi, x, m, y


@pytest.mark.parametrize("mode", ["hooks", "ew"])
def test_opacus_per_sample_gradients_match_per_patient_loop(tables, dictionary, mode):
    model = _model(len(dictionary.node_ids()))
    fi, x, m, y = _batch(tables)
    reference = copy.deepcopy(model)
    gsm = get_gsm_class(mode)(model, batch_first=True, loss_reduction="mean")
    star_loss(gsm(fi, x, m), y).backward()
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert len(trainable) >= 15  # embeddings, masks, every Linear of both layers and the head
    ref_params = dict(reference.named_parameters())
    for i in range(len(y)):
        reference.zero_grad(set_to_none=True)
        star_loss(reference(fi[i:i + 1], x[i:i + 1], m[i:i + 1]), y[i:i + 1]).backward()
        for name, p in trainable:
            assert p.grad_sample is not None, name
            expected = ref_params[name].grad
            expected = torch.zeros_like(p) if expected is None else expected
            err = (p.grad_sample[i] - expected).abs().max().item()
            assert err <= 1e-5, f"{name}, patient {i}: per-sample gradient off by {err:.2e}"
    gsm._close()


def test_comparison_can_fail_on_a_coupled_batch(tables, dictionary):
    """Negative control: a batch-coupled loss (patients share a normaliser) breaks the match, so
    the comparison above is able to detect wrong per-sample gradients."""
    model = _model(len(dictionary.node_ids()))
    fi, x, m, y = _batch(tables)
    reference = copy.deepcopy(model)
    gsm = GradSampleModule(model, batch_first=True, loss_reduction="mean")
    logits = gsm(fi, x, m)
    star_loss(logits - logits.mean(), y).backward()  # couples every patient to the batch
    star_loss(reference(fi[2:3], x[2:3], m[2:3]), y[2:3]).backward()
    name = "head.weight"
    got = dict(model.named_parameters())[name].grad_sample[2]
    want = dict(reference.named_parameters())[name].grad
    assert (got - want).abs().max().item() > 1e-3
    gsm._close()


@pytest.mark.parametrize("k_similar", [0, 4])
def test_star_model_equals_full_graph_without_similar_to(tables, dictionary, k_similar):
    """Same weights: PyG HeteroData path (edge lists, segment softmax) without similar_to == stars."""
    from clinograph.sdk.graph.build import build_graph

    model = _model(len(dictionary.node_ids()))
    for table in tables:
        data = build_graph(table, k_similar=k_similar)
        for store in data.stores:
            for key, value in store.items():
                if torch.is_tensor(value) and value.is_floating_point():
                    store[key] = value.double()
        stars = star_batch(table)
        with torch.no_grad():
            full = model.forward_graph(data, use_similar=False)
            star = model.forward_star(stars.feature_index, stars.values.double(), stars.mask)
            coupled = model.forward_graph(data, use_similar=True)
        assert full.shape == star.shape == (table.n_patients,)
        assert (full - star).abs().max().item() <= 1e-9
        if k_similar > 0:  # control: with similar_to the outputs do differ
            assert (coupled - star).abs().max().item() > 1e-6


# -- the book-keeping engine of the local and distributed DP paths (sdk/privacy/per_patient.py) --
def _loop_clipped_sum(reference, params, fi, x, m, y, clip):
    """Σ_i clip(g_i) from one backward pass per patient (the definition)."""
    ref = dict(reference.named_parameters())
    total, per = None, []
    for i in range(len(y)):
        reference.zero_grad(set_to_none=True)
        star_loss(reference(fi[i:i + 1], x[i:i + 1], m[i:i + 1]), y[i:i + 1]).backward()
        g = torch.cat([(ref[n].grad if ref[n].grad is not None else torch.zeros_like(ref[n])).reshape(-1)
                       for n in params])
        per.append(g)
        c = g * min(1.0, clip / (float(g.norm()) + 1e-6))
        total = c if total is None else total + c
    return torch.stack(per), total


@pytest.mark.parametrize("clip", [0.05, 1e6])  # clipping active / inactive
def test_star_engine_per_patient_gradients_and_clipped_sum_equal_a_per_patient_loop(tables, dictionary, clip):
    model = _model(len(dictionary.node_ids()))
    fi, x, m, y = _batch(tables, n=12)
    reference = copy.deepcopy(model)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    probe = star_probe(model.n_features)
    engine = PerPatientClipper(model, probe=(probe[0], probe[1].double(), probe[2]))
    assert [id(p) for p in engine.params] == [id(p) for n, p in model.named_parameters() if p.requires_grad]
    grads, _ = engine.per_sample(fi, x, m, labels=y)
    per, want = _loop_clipped_sum(reference, names, fi, x, m, y, clip)
    got_per = engine.flat(grads, len(y), torch.float64)
    assert (got_per - per).abs().max().item() <= 1e-9
    out = engine.clipped_sum(fi, x, m, labels=y, clip_norm=clip)
    assert (out.summed - want).abs().max().item() <= 1e-9
    assert torch.allclose(out.norms, per.norm(dim=1), rtol=1e-9, atol=1e-12)
    assert all(p.grad is None for p in model.parameters())  # nothing left on the model
    assert not any("forward" in leaf.__dict__ for leaf in engine.leaves)  # the recording wrappers are gone
    # the clipped sum's formed parts reuse buffers step to step (ghost.Workspace): a smaller batch
    # in between, then the first again, give the same sums, and per_sample's tensors are untouched
    _, want_small = _loop_clipped_sum(reference, names, fi[:5], x[:5], m[:5], y[:5], clip)
    assert (engine.clipped_sum(fi[:5], x[:5], m[:5], labels=y[:5], clip_norm=clip).summed - want_small).abs().max() <= 1e-9
    assert torch.equal(engine.clipped_sum(fi, x, m, labels=y, clip_norm=clip).summed, out.summed)
    assert torch.equal(engine.flat(grads, len(y), torch.float64), got_per)


def test_assign_gives_every_parameter_its_slice_in_its_dtype_step_after_step(dictionary):
    model = _model(len(dictionary.node_ids())).float()
    engine = PerPatientClipper(model)
    for step in range(2):  # the second assign reuses the gradient buffer: new values, same slices
        flat = torch.arange(engine.dim, dtype=torch.float64) * (step + 1)
        engine.assign(flat)
        want = torch.split(flat.float(), engine.sizes)
        for p, w in zip(engine.params, want, strict=True):
            assert p.grad.dtype == torch.float32 and p.grad.shape == p.shape
            assert torch.equal(p.grad.reshape(-1), w)


def test_star_engine_on_snapshot_sequences_equals_a_per_patient_loop(tables, dictionary):
    """[B, T, K] rows (the temporal model: a patient's whole sequence is one unit)."""
    from clinograph.sdk.model.temporal import TemporalNSFL

    model = TemporalNSFL(len(dictionary.node_ids()), NSFLConfig(hidden=8, init_seed=5, temporal="attention",
                                                                temporal_window=3)).double()
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    for name in unused_star_parameters(model):
        dict(model.named_parameters())[name].requires_grad_(False)
    fi, x, m, y = _batch(tables, n=8)
    fi, x, m = (t.unsqueeze(1).repeat(1, 3, 1) for t in (fi, x, m))
    x = x * torch.tensor([0.5, 1.0, 1.5], dtype=x.dtype).reshape(1, 3, 1)  # values change over time
    m[2, 0] = False  # an empty early snapshot
    reference = copy.deepcopy(model)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    probe = star_probe(model.n_features, row_shape=(3, 6))
    engine = PerPatientClipper(model, probe=(probe[0], probe[1].double(), probe[2]))
    per, want = _loop_clipped_sum(reference, names, fi, x, m, y, 0.1)
    grads, _ = engine.per_sample(fi, x, m, labels=y)
    assert (engine.flat(grads, len(y), torch.float64) - per).abs().max().item() <= 1e-9
    assert (engine.clipped_sum(fi, x, m, labels=y, clip_norm=0.1).summed - want).abs().max().item() <= 1e-9


class _UsesAWeightOutsideItsLayer(NSFLModel):
    def forward(self, feature_index, values, mask):
        return super().forward(feature_index, values, mask) + 0.1 * self.head.weight.sum()


def test_star_engine_refuses_a_model_it_would_get_wrong(dictionary):
    """Negative control: a parameter used outside its Linear makes Σ_i g_i differ from the batch
    gradient on the synthetic probe, and the engine refuses to be built."""
    model = _UsesAWeightOutsideItsLayer(len(dictionary.node_ids()), NSFLConfig(hidden=8))
    for name in unused_star_parameters(model):
        dict(model.named_parameters())[name].requires_grad_(False)
    with pytest.raises(PrivacyError, match="do not add up to the batch gradient"):
        PerPatientClipper(model, probe=star_probe(model.n_features))
    PerPatientClipper(NSFLModel(len(dictionary.node_ids()), NSFLConfig(hidden=8)))  # no probe: not checked


def test_engine_on_the_modality_model_with_its_waveform_convolutions_equals_a_per_patient_loop(tables, dictionary):
    """ModalityNSFL: stars plus a waveform through Conv1d layers (the engine's unfold rule), one
    patient = its star and its signal; patients without the signal included."""
    from clinograph.sdk.model.modalities import ModalityNSFL

    model = ModalityNSFL(len(dictionary.node_ids()), NSFLConfig(hidden=8, init_seed=5),
                         modalities=("waveform",)).double()
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    fi, x, m, y = _batch(tables, n=7)
    sig = torch.randn(7, 40, generator=gen, dtype=torch.float64)
    has = torch.tensor([True, False, True, True, False, True, True])

    def objective(mo, inputs, labels):
        logits = mo.forward_modal(inputs[0], inputs[1], inputs[2], [inputs[3]], [inputs[4]])
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum")

    model.zero_grad(set_to_none=True)
    objective(model, (fi, x, m, sig, has), y).backward()
    for p in model.parameters():  # what the batch never reaches stays out (similar_to), as under DP
        p.requires_grad_(p.grad is not None)
    model.zero_grad(set_to_none=True)
    engine = PerPatientClipper(model, objective=objective, probe=(fi, x, m, sig, has), probe_labels=y)
    assert any(isinstance(leaf, torch.nn.Conv1d) for leaf in engine.leaves)
    params = engine.params
    loop = []
    for i in range(7):
        model.zero_grad(set_to_none=True)
        objective(model, (fi[i:i + 1], x[i:i + 1], m[i:i + 1], sig[i:i + 1], has[i:i + 1]), y[i:i + 1]).backward()
        loop.append(torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]))
    model.zero_grad(set_to_none=True)
    per = torch.stack(loop)
    grads, _ = engine.per_sample(fi, x, m, sig, has, labels=y)
    assert (engine.flat(grads, 7, torch.float64) - per).abs().max().item() <= 1e-9
    factor = (0.1 / (per.norm(dim=1) + 1e-6)).clamp(max=1.0)
    got = engine.clipped_sum(fi, x, m, sig, has, labels=y, clip_norm=0.1).summed
    assert (got - factor @ per).abs().max().item() <= 1e-9


def test_dp_sgd_step_adds_sigma_c_times_the_engines_next_noise_row_over_the_expected_batch(monkeypatch):
    from clinograph.sdk.privacy import noise as noise_mod
    from clinograph.sdk.privacy.per_patient import dp_sgd_step

    torch.manual_seed(0)
    model = NSFLModel(6, NSFLConfig(hidden=4, deep=False))
    fi, x, m = star_probe(6, patients=5)
    y = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0])
    clipper = PerPatientClipper(model)
    row = torch.arange(clipper.dim, dtype=torch.float32) / clipper.dim  # a known "noise" row
    monkeypatch.setattr(noise_mod.NoiseRows, "next", lambda self: row)
    want = clipper.clipped_sum(fi, x, m, labels=y, clip_norm=0.5).summed
    dp_sgd_step(clipper, torch.optim.SGD(clipper.params, lr=0.0), (fi, x, m), labels=y, noise_multiplier=3.0,
                clip_norm=0.5, expected_batch=4.0)
    got = torch.cat([p.grad.reshape(-1) for p in clipper.params])
    torch.testing.assert_close(got, (want + 1.5 * row) / 4.0)


class _Tied(torch.nn.Module):
    """Two Linear layers holding one weight parameter (tied), and a Linear called twice."""

    def __init__(self):
        super().__init__()
        self.first, self.second, self.twice = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
        self.second.weight = self.first.weight

    def forward(self, x):
        return self.twice(torch.tanh(self.second(torch.tanh(self.first(x))))).squeeze(-1) + self.twice(x).squeeze(-1)


def _squared_error(model, inputs, labels):
    return ((model(inputs[0]) - labels) ** 2).sum()


def test_a_parameter_tied_across_two_modules_is_refused_without_a_probe():
    """The engine keeps one part a parameter: a weight two Linear modules share would get one
    module's per-patient gradient only (the other's share left out of the norm and the clipped
    sum: 0.28 off on this model through parts_sum before the check), so it is refused at
    construction, probe or not. One module called twice stays supported."""
    torch.manual_seed(0)
    model = _Tied()
    with pytest.raises(PrivacyError, match="shared by modules 'first' and 'second'"):
        PerPatientClipper(model, objective=_squared_error)
    model.second.weight = torch.nn.Parameter(model.first.weight.detach().clone())  # untied: accepted
    x, y = torch.randn(6, 4), torch.randn(6)
    engine = PerPatientClipper(model, objective=_squared_error, probe=(x,), probe_labels=y)
    grads, _ = engine.per_sample(x, labels=y)
    model.zero_grad()
    _squared_error(model, (x[2:3],), y[2:3]).backward()
    twice = [id(p) for p in engine.params].index(id(model.twice.weight))
    assert torch.allclose(grads[twice][2], model.twice.weight.grad, atol=1e-6)
