"""The engine's Conv1d rule (sdk/privacy/part_rules.py): per-patient gradients equal a per-patient
loop for strided, padded and dilated convolutions (the windowed-view and the unfold paths)."""

from __future__ import annotations

import pytest
import torch
from clinograph.sdk.privacy.per_patient import PerPatientClipper
from torch import nn


def _objective(model, inputs, labels):
    return (model(inputs[0]) * labels).sum()


@pytest.mark.parametrize(("stride", "padding", "dilation"), [(2, 3, 1), (1, 0, 1), (2, 2, 2)],
                         ids=["strided-padded", "plain", "dilated"])
def test_conv1d_per_patient_gradients_equal_a_per_patient_loop(stride, padding, dilation):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(2, 3, 5, stride=stride, padding=padding, dilation=dilation), nn.Flatten(),
                          nn.LazyLinear(1)).double()
    x = torch.randn(4, 2, 17, dtype=torch.float64)
    model(x)  # materialise the lazy layer
    y = torch.randn(4, 1, dtype=torch.float64)
    engine = PerPatientClipper(model, objective=_objective)
    grads, _ = engine.per_sample(x, labels=y)
    for i in range(4):
        model.zero_grad(set_to_none=True)
        _objective(model, (x[i:i + 1],), y[i:i + 1]).backward()
        for p, g in zip(engine.params, grads, strict=True):
            torch.testing.assert_close(g[i], p.grad)
    assert isinstance(engine.leaves[0], nn.Conv1d)
