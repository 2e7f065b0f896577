"""Input encoders ``g_theta: X -> R^d`` (F-CMs 4.1), shared by every instantiation.

Any module can serve as the encoder if it satisfies the interface::

    forward(batch) -> Tensor[B, d]          # one row per patient, d = out_dim

:class:`MLPEncoder` is the encoder of the bnlearn benchmarks. :class:`EmbeddingAdapter` wraps
any patient-embedding module (the NS-FL graph encoder, whose ``forward(batch)`` returns the
patient embeddings ``[B, d]``) so that it plugs into :class:`~.model.ConceptModel`. Its
parameters become modules named ``encoder/<child>``, or, when the wrapped module defines
``clinograph_modules() -> dict[str, list[nn.Parameter]]``, those names verbatim (so the NS-FL
modules keep their house names such as ``gnn/layer1/has_feature``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn


class MLPEncoder(nn.Module):
    """LeakyReLU MLP ``x (B, in_dim) -> z (B, out_dim)``; one module ``encoder/mlp``."""

    def __init__(self, in_dim: int, out_dim: int = 64, hidden: Sequence[int] = (128,)):
        super().__init__()
        layers: list[nn.Module] = []
        d = in_dim
        for h in hidden:
            layers += [nn.Linear(d, h), nn.LeakyReLU()]
            d = h
        layers += [nn.Linear(d, out_dim), nn.LeakyReLU()]
        self.net = nn.Sequential(*layers)
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return self.net(x)

    def clinograph_modules(self) -> dict[str, list[nn.Parameter]]:
        """The encoder is one shared module, FedAvg-ed over all participants (4.2.3)."""
        return {"encoder/mlp": list(self.parameters())}


class EmbeddingAdapter(nn.Module):
    """Wrap a patient-embedding module ``forward(batch) -> [B, d]`` as a concept-model encoder.

    Args:
        module: the embedding module (e.g. the NS-FL GNN); its output must be ``[B, out_dim]``.
        out_dim: ``d``.
        prefix: module-name prefix for its parameters when it has no ``clinograph_modules``.
        embed: how to get the embeddings, ``embed(module, batch) -> [B, d]``; default
            ``module(batch)``. For a model whose ``forward`` returns task logits, point this at
            its patient-embedding method (e.g. the NS-FL layer-2 patient state ``h_p^(2)``).
    """

    def __init__(self, module: nn.Module, out_dim: int, prefix: str = "encoder",
                 embed: Callable[[nn.Module, Any], torch.Tensor] | None = None):
        super().__init__()
        self.inner, self.out_dim, self.prefix = module, out_dim, prefix
        self._embed = embed

    def forward(self, batch) -> torch.Tensor:  # noqa: D102
        z = self._embed(self.inner, batch) if self._embed is not None else self.inner(batch)
        if z.dim() != 2 or z.shape[1] != self.out_dim:
            from clinograph.core.errors import ConfigError

            raise ConfigError(f"The wrapped encoder returned shape {tuple(z.shape)}; expected "
                              f"[B, {self.out_dim}]. Pass out_dim equal to its embedding size.")
        return z

    def clinograph_modules(self) -> dict[str, list[nn.Parameter]]:
        """Named parameter groups of the wrapped module."""
        own = getattr(self.inner, "clinograph_modules", None)
        if callable(own):
            return dict(own())
        out: dict[str, list[nn.Parameter]] = {}
        for name, child in self.inner.named_children():
            params = list(child.parameters())
            if params:
                out[f"{self.prefix}/{name}"] = params
        direct = [p for n, p in self.inner.named_parameters(recurse=False)]
        if direct:
            out[f"{self.prefix}/root"] = direct
        return out
