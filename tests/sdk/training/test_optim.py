"""The trainers' optimizer: fused Adam, the same update as PyTorch's per-tensor loop."""

import pytest
import torch
from clinograph.sdk.training.optim import adam


def _params(dtype):
    gen = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(7, 5, generator=gen, dtype=dtype)) for _ in range(3)]


def test_cpu_float_parameters_get_the_fused_kernel_and_keep_their_groups():
    p = _params(torch.float32)
    opt = adam([{"params": p[:2]}, {"params": p[2:], "lr": 0.5}, {"params": []}], lr=0.1, weight_decay=0.01)
    assert opt.defaults["fused"] is True
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5, 0.1]
    assert all(g["weight_decay"] == 0.01 for g in opt.param_groups)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_fused_steps_follow_the_per_tensor_loop(dtype, tol):
    ours, loop = _params(dtype), _params(dtype)
    a = adam([{"params": ours[:2]}, {"params": ours[2:], "lr": 0.05}], lr=0.01, weight_decay=1e-3)
    b = torch.optim.Adam([{"params": loop[:2]}, {"params": loop[2:], "lr": 0.05}], lr=0.01, weight_decay=1e-3)
    gen = torch.Generator().manual_seed(1)
    for _ in range(50):
        for x, y in zip(ours, loop, strict=True):
            g = torch.randn(x.shape, generator=gen, dtype=dtype)
            x.grad, y.grad = g.clone(), g.clone()
        a.step()
        b.step()
    moved = max(float((x - y0).abs().max()) for x, y0 in zip(ours, _params(dtype), strict=True))
    assert moved > 0.1  # the parameters did move
    assert max(float((x - y).detach().abs().max()) for x, y in zip(ours, loop, strict=True)) < tol
