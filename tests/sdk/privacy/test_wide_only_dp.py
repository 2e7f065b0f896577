"""[model] deep = false under DP: the star path skips the GNN (no per-patient gradient for it), yet
the released coordinates -- and so the server's noise test -- are those of deep = true."""

from __future__ import annotations

import numpy as np
import torch
from clinograph.sdk.graph.star import star_batch
from clinograph.sdk.model.nsfl import NSFLConfig, NSFLModel
from clinograph.sdk.model.nsfl_modules import nsfl_modules
from clinograph.sdk.privacy import DPTrainer, PrivacyLedger
from clinograph.sdk.privacy.distributed import Columns, columns_clipper, patient_rows
from clinograph.sdk.training.local import TrainConfig

from clinograph.core.identity import Identity
from clinograph.core.spec import ModuleKind

SIGNER = Identity.generate("alpha")
TRAINED = {"linear.weight", "head.bias"}  # all a deep = false step may compute a gradient for


def _model(n: int, *, deep: bool) -> NSFLModel:
    return NSFLModel(n, NSFLConfig(hidden=8, deep=deep, init_seed=5))


def _gnn_calls(model: NSFLModel) -> list[str]:
    """Names of GNN modules called (forward hooks on every module but the head and the wide path)."""
    calls: list[str] = []
    for name, mod in model.named_modules():
        if name and not name.startswith(("head", "linear")):
            mod.register_forward_hook(lambda m, i, o, name=name: calls.append(name))
    return calls


def test_a_local_dp_step_of_the_wide_only_model_does_not_compute_the_gnn(tables, dictionary, tmp_path):
    model = _model(len(dictionary.node_ids()), deep=False)
    calls = _gnn_calls(model)
    ledger = PrivacyLedger(tmp_path, site=tables[0].site, budget_epsilon=50.0, delta=1e-5, signer=SIGNER)
    tr = DPTrainer(tables[0], train_idx=np.arange(tables[0].n_patients), ledger=ledger, noise_multiplier=1.0,
                   clip_norm=1.0, batch_size=16, train_config=TrainConfig(lr=0.01))
    tr.train(model, round_=0, epochs=1, plan_options={})  # builds the engine (its probes compute the GNN)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    calls.clear()
    tr.train(model, round_=1, epochs=1, plan_options={})
    assert calls == []
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in tr._clipper.params} == TRAINED
    after = dict(model.named_parameters())
    for n in before:  # the GNN is released unchanged (delta 0); the wide path trained
        assert torch.equal(before[n], after[n]) is (n not in TRAINED), n


def test_the_distributed_step_keeps_the_gnn_columns_as_noised_zeros(tables, dictionary):
    n = len(dictionary.node_ids())
    model = _model(n, deep=False)
    mm = nsfl_modules(model, dictionary.node_ids())
    cols = Columns.of(model, mm, mm.names(ModuleKind.SHARED))
    deep = _model(n, deep=True)
    deep_mm = nsfl_modules(deep, dictionary.node_ids())
    assert (cols.modules, cols.sizes) == (lambda c: (c.modules, c.sizes))(
        Columns.of(deep, deep_mm, deep_mm.names(ModuleKind.SHARED)))  # same d for the noise test
    clipper = columns_clipper(model, cols)
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in clipper.params} == TRAINED
    calls = _gnn_calls(model)
    s = star_batch(tables[2])
    rows = patient_rows(model, cols, inputs=(s.feature_index[:12], s.values[:12], s.mask[:12]),
                        labels=s.labels[:12], clipper=clipper)[0:12]
    assert calls == [] and rows.shape == (12, cols.dim)
    at, trained = 0, np.zeros(cols.dim, dtype=bool)
    for (_, p, _), size in zip(cols.pieces, cols.sizes, strict=True):
        trained[at:at + size] = names[id(p)] in TRAINED
        at += size
    assert not rows[:, ~trained].any() and rows[:, trained].any()
