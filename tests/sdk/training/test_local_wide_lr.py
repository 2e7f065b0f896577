"""Local training: ``[training] wide_lr_factor`` scales the step of the wide rows ``linear/<f>`` only."""

import numpy as np
from clinograph.sdk.config import TrainConfig
from clinograph.sdk.graph import star_batch
from clinograph.sdk.model import NSFLConfig, NSFLModel
from clinograph.sdk.training.local import train_epochs
from sdk_helpers import small_tables


def moved(factor: float) -> tuple[float, float]:
    t = small_tables()[0]
    m = NSFLModel(len(t.dictionary.node_ids()), NSFLConfig(hidden=8, linear_shape=True))
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    train_epochs(m, epochs=1, train_idx=np.arange(len(t.labels)), stars=star_batch(t),
                 config=TrainConfig(lr=0.01, batch_size=40, wide_lr_factor=factor))
    d = {n: float((p.detach() - before[n]).abs().max()) for n, p in m.named_parameters()}
    return d["linear.weight"], d["head.weight"]


def test_wide_lr_factor_scales_only_the_wide_rows_step():
    wide1, head1 = moved(1.0)
    wide10, head10 = moved(10.0)
    assert wide1 > 0 and head1 > 0
    assert wide10 > 5 * wide1  # Adam: the step is ~lr, so ~10x
    assert head10 < 3 * head1  # the GNN's learning rate is unchanged
    assert TrainConfig().wide_lr_factor == 1.0
