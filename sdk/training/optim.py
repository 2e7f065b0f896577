"""The optimizer every trainer builds: Adam (Kingma & Ba 2015), with PyTorch's fused kernel.

``torch.optim.Adam`` on CPU defaults to a loop over the parameter tensors, several tensor
operations each (about 0.43 ms a step for the NS-FL star model's 28 tensors, 12 k values, on this
machine); ``fused=True`` runs the same update as one kernel over every tensor (0.09 ms). The
update is the same formula; results differ from the loop's at rounding level only (float32:
≤ 2.4e-7 after 100 steps in our check), and a run stays deterministic
(``benchmarks/runtime_speed/README.md``, "Fused Adam"). The fused kernel takes CPU floating-point
tensors; anything else (another device, a non-float parameter) gets the loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["adam"]


def _fusable(params: Any) -> bool:
    tensors = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
    return all(isinstance(p, torch.Tensor) and p.device.type == "cpu" and p.is_floating_point() for p in tensors)


def adam(params: Iterable[Any], *, lr: float, weight_decay: float = 0.0) -> torch.optim.Adam:
    """``torch.optim.Adam(params, lr, weight_decay)``, fused where every parameter allows it.
    ``params``: tensors or param-group dicts, as ``torch.optim.Adam`` takes them."""
    params = list(params)
    return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, fused=_fusable(params) or None)
