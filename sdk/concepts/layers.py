"""Linear layers whose input columns (or output rows) are labelled by named blocks.

They make warm start (F-CMs 4.2.2) exact: when a module's inputs change, the columns of
kept inputs are copied, the columns of new inputs are zero (the module computes what it
computed before), and the columns of removed inputs are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

Blocks = tuple[tuple[str, int], ...]


def _offsets(blocks: Blocks) -> dict[str, slice]:
    out, at = {}, 0
    for name, width in blocks:
        out[name] = slice(at, at + width)
        at += width
    return out


class BlockLinear(nn.Linear):
    """``nn.Linear`` with named input blocks and, optionally, named output blocks.

    Shapes:
        input: (B, sum of in-block widths); output: (B, out_features).
    """

    def __init__(self, in_blocks: Sequence[tuple[str, int]], out_features: int,
                 out_blocks: Sequence[tuple[str, int]] | None = None):
        self.in_blocks: Blocks = tuple((str(n), int(w)) for n, w in in_blocks)
        self.out_blocks: Blocks | None = (tuple((str(n), int(w)) for n, w in out_blocks)
                                          if out_blocks is not None else None)
        if self.out_blocks is not None:
            out_features = sum(w for _, w in self.out_blocks)
        super().__init__(max(1, sum(w for _, w in self.in_blocks)), max(1, out_features))
        self.empty_in = sum(w for _, w in self.in_blocks) == 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        if self.empty_in:
            return self.bias.expand(x.shape[0], -1)
        return super().forward(x)

    @torch.no_grad()
    def warm_start_from(self, old: BlockLinear, *, zero_new_rows: bool = True) -> None:
        """Copy the weights of blocks present in both; zero new input columns (and new output rows)."""
        old_in, new_in = _offsets(old.in_blocks), _offsets(self.in_blocks)
        if self.out_blocks is None or old.out_blocks is None:
            rows_new = {"*": slice(0, self.out_features)}
            rows_old = {"*": slice(0, old.out_features)}
        else:
            rows_new, rows_old = _offsets(self.out_blocks), _offsets(old.out_blocks)
        w = torch.zeros_like(self.weight)
        b = torch.zeros_like(self.bias) if zero_new_rows else self.bias.clone()
        for rname, rs in rows_new.items():
            ro = rows_old.get(rname)
            if ro is None or (ro.stop - ro.start) != (rs.stop - rs.start):
                if not zero_new_rows:
                    w[rs] = self.weight[rs]
                continue
            b[rs] = old.bias[ro]
            if self.empty_in or old.empty_in:
                continue
            for cname, cs in new_in.items():
                co = old_in.get(cname)
                if co is not None and (co.stop - co.start) == (cs.stop - cs.start):
                    w[rs, cs] = old.weight[ro, co]
        self.weight.copy_(w)
        self.bias.copy_(b)


def mlp_tail(hidden: int, out: int, depth: int = 1) -> nn.Sequential:
    """LeakyReLU MLP continuing from a hidden layer (appendix D.3: LeakyReLU throughout)."""
    layers: list[nn.Module] = []
    for _ in range(depth - 1):
        layers += [nn.LeakyReLU(), nn.Linear(hidden, hidden)]
    layers += [nn.LeakyReLU(), nn.Linear(hidden, out)]
    return nn.Sequential(*layers)
