"""NS-FL over time: per-snapshot graphs, Theorem 1 on snapshots, the sequence as one DP unit, the task."""

from __future__ import annotations

import copy
import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch
from clinograph.sdk.config import HospitalConfig, NSFLConfig
from clinograph.sdk.datasets import timeseries as ts
from clinograph.sdk.federation.build import build_task, initial_model_for
from clinograph.sdk.graph import build_graph, star_batch
from clinograph.sdk.graph.temporal import observed_feature_nodes, snapshot_batch, snapshot_stars
from clinograph.sdk.ingest import ingest
from clinograph.sdk.model.nsfl import NSFLModel
from clinograph.sdk.model.temporal import TemporalNSFL, add_temporal_modules
from clinograph.sdk.privacy import star_loss, unused_star_parameters
from clinograph.sdk.training import bce
from opacus import GradSampleModule

from clinograph.core.errors import ConfigError
from clinograph.core.identity import Identity
from clinograph.core.spec import ModuleKind

WINDOW = 6


@pytest.fixture(scope="module")
def tables():
    hospitals = (replace(ts.DEFAULT_TS_HOSPITALS[0], n_patients=36),  # hourly, 12 snapshots
                 replace(ts.DEFAULT_TS_HOSPITALS[7], n_patients=30),  # 4-hourly, no lactate: 3 snapshots
                 replace(ts.MODALITY_GAP_HOSPITALS[5], n_patients=20))  # static only: 1 snapshot
    d = ts.load_dictionary()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [ingest(s.table, schema=s.schema, dictionary=d) for s in ts.make_timeseries_sites(seed=1,
                                                                                                  hospitals=hospitals)]


def _moved(model, seed=3):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # off the identity/zero init, so every temporal parameter matters
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


def _temporal(n, window=WINDOW):
    return TemporalNSFL(n, NSFLConfig(hidden=8, init_seed=2, temporal="attention", temporal_window=window)).double()


def _f64(b):
    return b.feature_index, b.values.double(), b.mask


def test_snapshot_graphs_decompose_into_the_snapshot_stars(tables, f64):
    t = tables[0]
    m = NSFLModel(len(t.dictionary.node_ids()), NSFLConfig(hidden=8)).double()
    stars = snapshot_stars(t, window=t.n_snapshots, carry_forward=False)
    assert len(stars) == t.n_snapshots == 12
    for step in (0, 5, 11):  # G_t (observations at step t) on the full graph == its stars
        full = m.forward_graph(build_graph(t, k_similar=0, snapshot=step), use_similar=False)
        s = stars[step]
        assert torch.allclose(full, m.forward_star(s.feature_index, s.values.double(), s.mask), atol=1e-10)
    locf = snapshot_batch(t, window=WINDOW)  # carry-forward: the last snapshot is the static star
    static = star_batch(t)
    assert torch.equal(locf.last().feature_index, static.feature_index)
    assert torch.equal(locf.last().values, static.values)
    coarse = snapshot_batch(tables[1], window=WINDOW)  # 3 snapshots, padded at the front
    assert coarse.present[:, :3].sum() == 0 and coarse.present[:, 3:].all()


def test_sequence_embedding_is_the_star_embedding_per_snapshot_and_starts_as_the_static_model(tables, f64):
    t = tables[0]
    n = len(t.dictionary.node_ids())
    model = _temporal(n)
    b = snapshot_batch(t, window=WINDOW)
    fi, x, m = _f64(b)
    static = NSFLModel(n, model.config).double()
    static.load_state_dict({k: v for k, v in model.state_dict().items() if k in static.state_dict()})
    # at initialisation (W_now = I, W_ctx = 0, trend 0) the temporal model IS the static one
    assert torch.allclose(model.forward_sequence(fi, x, m), static.forward_batch(star_batch(t)).double(), atol=1e-10)
    _moved(model)
    h = model.embed_sequence(fi, x, m)
    for step in range(WINDOW):
        assert torch.allclose(h[:, step], model.embed_star(fi[:, step], x[:, step], m[:, step]), atol=1e-10)
    later = model.forward_sequence(fi, x, m)
    assert not torch.allclose(later, model.forward_star(fi[:, -1], x[:, -1], m[:, -1]))  # time now matters
    xr = x.clone()
    xr[:, :-1] = 0.0  # change only the history
    assert not torch.allclose(later, model.forward_sequence(fi, xr, m))


def test_theorem1_on_snapshots_unobserved_features_get_zero_gradient_and_change_nothing(tables, f64):
    t = tables[1]  # lacks lactate
    n = len(t.dictionary.node_ids())
    node_ids = t.dictionary.node_ids()
    for step in range(t.n_snapshots):  # schema completion of every snapshot graph changes nothing
        m = _moved(NSFLModel(n, NSFLConfig(hidden=8)).double())
        g, gc = build_graph(t, k_similar=0, snapshot=step), build_graph(t, k_similar=0, snapshot=step,
                                                                         complete_schema=True)
        assert gc["feature"].num_nodes > g["feature"].num_nodes
        assert torch.allclose(m.forward_graph(g), m.forward_graph(gc), atol=1e-12)
    model = _moved(_temporal(n))
    b = snapshot_batch(t, window=WINDOW)
    fi, x, m = _f64(b)
    seen = set(observed_feature_nodes(b).tolist())
    unseen = [i for i in range(n) if i not in seen]
    assert node_ids.index("lactate") in unseen
    bce(model.forward_sequence(fi, x, m), b.labels.double()).backward()
    for name in ("embedding", "mask_logit", "linear", "trend"):
        g = getattr(model, name).weight.grad
        assert torch.count_nonzero(g[unseen]) == 0, name
        assert torch.count_nonzero(g[sorted(seen)]) > 0, name
    before = model.forward_sequence(fi, x, m)
    with torch.no_grad():  # another hospital's training moves the rows of features this one lacks
        for name in ("embedding", "mask_logit", "linear", "trend"):
            getattr(model, name).weight[unseen] += 5.0
    assert torch.equal(before, model.forward_sequence(fi, x, m))


def test_a_patients_whole_sequence_is_one_dp_sample(tables, f64):
    """Opacus hooks-mode per-sample gradients of the sequence model == a per-patient loop, so
    per-patient clipping clips the gradient of the whole sequence."""
    t = tables[0]
    model = _moved(_temporal(len(t.dictionary.node_ids())))
    unused = set(unused_star_parameters(model))
    assert not any(u.startswith(("t_", "trend")) for u in unused)  # the DP probe sees the temporal parts
    for name, p in model.named_parameters():
        p.requires_grad_(name not in unused)
    b = snapshot_batch(t, window=WINDOW)
    fi, x, m, y = b.feature_index[:8], b.values[:8].double(), b.mask[:8].clone(), b.labels[:8].double()
    m[0, :3] = False  # a patient whose early snapshots are empty
    reference = copy.deepcopy(model)
    gsm = GradSampleModule(model, batch_first=True, loss_reduction="mean")
    star_loss(gsm(fi, x, m), y).backward()
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert {"t_position.weight", "t_key.weight", "t_context.weight", "trend.weight"} <= {n for n, _ in trainable}
    ref = dict(reference.named_parameters())
    for i in range(len(y)):
        reference.zero_grad(set_to_none=True)
        star_loss(reference(fi[i:i + 1], x[i:i + 1], m[i:i + 1]), y[i:i + 1]).backward()
        for name, p in trainable:
            expected = ref[name].grad if ref[name].grad is not None else torch.zeros_like(p)
            err = (p.grad_sample[i] - expected).abs().max().item()
            assert err <= 1e-8, f"{name}, patient {i}: per-sample gradient off by {err:.2e}"
    gsm._close()


def test_temporal_task_trains_sends_per_feature_modules_only_where_observed_and_matches_model_init(tables):
    cfg = HospitalConfig(model=NSFLConfig(hidden=8, temporal="attention", temporal_window=WINDOW),
                         graph={"k_similar": 0})
    d = tables[0].dictionary
    init = initial_model_for(cfg, dictionary=d)
    for t in tables:
        task = build_task(t, dictionary=d, config=cfg)
        assert isinstance(task.model, TemporalNSFL)
        assert task.modules.spec(version=0).digest() == init.spec.digest()
        out = task.train(round_=0, epochs=1, plan_options={})
        sent = task.trained_modules(out)
        assert "temporal/combine" in sent
        assert ("temporal/attention" in sent) == (t.n_snapshots > 1)
        observed = {d.node_ids()[i] for i in t.observed_nodes()}
        assert {n.split("/", 1)[1] for n in sent if n.startswith("trend/")} == observed
        assert np.isfinite(task.predict()).all()
    with pytest.raises(ConfigError, match="k_similar = 0"):
        build_task(tables[0], dictionary=d, config=cfg.model_copy(update={"graph": cfg.graph.model_copy(
            update={"k_similar": 5})}))
    static = NSFLModel(len(d.node_ids()), NSFLConfig(hidden=8))
    from clinograph.sdk.model.modules import ModuleMap

    assert add_temporal_modules(ModuleMap(), static, d.node_ids()).names(ModuleKind.SHARED) == []


def test_temporal_task_trains_under_patient_level_dp(tables, tmp_path):
    cfg = HospitalConfig(model=NSFLConfig(hidden=8, temporal="attention", temporal_window=WINDOW),
                         graph={"k_similar": 0}, privacy={"enabled": True, "noise_multiplier": 1.0, "batch_size": 8,
                                                          "state_dir": str(tmp_path)})
    t = tables[0]
    task = build_task(t, dictionary=t.dictionary, config=cfg, identity=Identity.generate(t.site))
    fi, x, m, y = task.trainer.dataset.tensors
    assert fi.shape[1:] == (WINDOW, fi.shape[2]) and len(y) == len(task.split.train)  # one row a patient
    before = task.modules.get("temporal/combine")
    out = task.train(round_=0, epochs=1, plan_options={})
    assert out.ledger is not None and out.ledger.epsilon > 0
    assert not np.allclose(before, task.modules.get("temporal/combine"))


def test_predict_table_scores_new_patients_from_their_sequences(tables, tmp_path):
    cfg = HospitalConfig(model=NSFLConfig(hidden=8, temporal="attention", temporal_window=WINDOW),
                         graph={"k_similar": 0})
    t = tables[0]
    task = build_task(t, dictionary=t.dictionary, config=cfg)
    task.train(round_=0, epochs=1, plan_options={})
    task.finish()
    assert np.allclose(task.predict_table(t), task.predict(), atol=1e-6)  # the same patients, the same risks
    later = t.subset(np.arange(10))
    assert np.allclose(task.predict_table(later), task.predict()[:10], atol=1e-6)
    with pytest.raises(ConfigError, match="temporal model"):
        task.export(tmp_path / "m.safetensors", signer=Identity.generate("h"))
