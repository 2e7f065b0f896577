"""OpaqNN, the centralised opaque baseline (F-CMs Table 1)."""

from __future__ import annotations

import pytest
import torch
from clinograph.sdk.concepts.opaque import train_centralised

from clinograph.core.errors import ConfigError


@pytest.fixture()
def xor_data():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1500, 4, generator=gen)
    y = ((x[:, 0] > 0) ^ (x[:, 1] > 0)).long()  # not linearly separable; majority is ~50%
    return x[:1000], y[:1000], x[1000:1250], y[1000:1250], x[1250:], y[1250:]


def test_learns_a_nonlinear_task_and_early_stops(xor_data):
    torch.set_num_threads(1)
    xtr, ytr, xva, yva, xte, yte = xor_data
    res = train_centralised(xtr, ytr, xva, yva, card=2, seed=0, lr=1e-2, max_epochs=60, patience=5)
    assert res.accuracy(xte, yte) > 0.85
    assert 0 <= res.best_epoch < 60
    # the returned network is the selected one: its validation loss is the reported one
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(res.model(xva), yva).item()
    assert loss == pytest.approx(res.val_loss, rel=1e-5)


def test_accuracy_skips_missing_labels(xor_data):
    xtr, ytr, xva, yva, xte, yte = xor_data
    res = train_centralised(xtr, ytr, xva, yva, card=2, seed=0, max_epochs=2)
    y = yte.clone()
    y[: len(y) // 2] = -1
    with torch.no_grad():
        pred = res.model(xte[len(y) // 2:]).argmax(1)
    assert res.accuracy(xte, y) == pytest.approx(float((pred == yte[len(y) // 2:]).float().mean()))


@pytest.mark.parametrize("bad", ["label", "length"])
def test_bad_data_is_refused(xor_data, bad):
    xtr, ytr, xva, yva, _, _ = xor_data
    if bad == "label":
        ytr = ytr.clone()
        ytr[3] = 2
        match = r"labels must lie in \[0, 2\)"
    else:
        xva = xva[:-1]
        match = "need the same, non-zero count"
    with pytest.raises(ConfigError, match=match):
        train_centralised(xtr, ytr, xva, yva, card=2, seed=0, max_epochs=1)
