"""The server's rule generator T_θ(r_1 ∧ … ∧ r_l | r_head): a small transformer over relation tokens.

FedNSL section 3.4.1: a sequence model gives the prior over rule bodies for each head
(eq. 5: the prior is a multinomial with these probabilities); the M-step trains it on rule
samples drawn from the hospitals' posteriors by maximising their log-likelihood (eq. 6),
added to the pool of earlier samples (Algorithm 1 lines 12-14; appendix A.10).

Model: decoder-only (causal) transformer over the tokens ``[PAD, EOS, heads…, predicates…]``;
a rule is the sequence ``head, r_1, …, r_l, EOS`` with the body in canonical order, and
``log T_θ(body | head) = Σ_t log p_θ(token_t | prefix)``. The prior over the enumerated
:class:`~.rules.RuleSpace` is this renormalised over the space's bodies (mass the model puts on
non-canonical sequences is dropped). Sizes follow appendix A.6 scaled down for a clinical
vocabulary (A.6: 256-wide embeddings, two layers, rule length 4): :class:`GeneratorPreset`.

Where it runs: it is the *server's* model. It imports torch, and the lean server
(``clinograph.secure``) never does, so in a deployment it runs in a separate rule service
beside the server that reads the published mixture and returns the next prior; in simulation
(:mod:`.federation`) it runs in the SDK's process and is handed to the server strategy
``fednsl_rules`` as its M-step. Hospitals never run it: they receive its prior.

Shapes:
    prior() -> (n_heads, n_bodies), rows sum to 1
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..seeding import torch_seeded
from .rules import RuleSpace

PAD, EOS = 0, 1


@dataclass(frozen=True)
class GeneratorPreset:
    """Transformer size and M-step schedule. ``SMALL``: ~70k parameters, seconds per M-step on a CPU."""

    d_model: int = 64
    layers: int = 2
    heads: int = 4
    lr: float = 3e-3
    epochs: int = 30
    batch_size: int = 512
    samples_per_head: int = 512


SMALL = GeneratorPreset()


class _Decoder(nn.Module):
    def __init__(self, vocab: int, max_len: int, p: GeneratorPreset):
        super().__init__()
        self.tok = nn.Embedding(vocab, p.d_model, padding_idx=PAD)
        self.pos = nn.Embedding(max_len, p.d_model)
        layer = nn.TransformerEncoderLayer(p.d_model, p.heads, 2 * p.d_model, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, p.layers, enable_nested_tensor=False)
        self.out = nn.Linear(p.d_model, vocab)

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        n = seq.shape[1]
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
        h = self.tok(seq) + self.pos(torch.arange(n))[None]
        return self.out(self.body(h, mask=mask, src_key_padding_mask=seq == PAD))


class RuleGenerator:
    """T_θ over a rule space (see the module docstring). ``seed`` fixes the initial weights."""

    def __init__(self, space: RuleSpace, *, preset: GeneratorPreset = SMALL, seed: int = 0):
        self.space, self.preset = space, preset
        self._head_tok = {h: 2 + i for i, h in enumerate(space.heads)}
        self._pred_tok = {p: 2 + len(space.heads) + i for i, p in enumerate(space.predicates)}
        width = max(len(b) for b in space.bodies)
        self.max_len = width + 2
        with torch_seeded(seed):
            self.model = _Decoder(2 + len(space.heads) + len(space.predicates), self.max_len, preset)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=preset.lr)
        self._bodies = torch.tensor([[self._pred_tok[p] for p in b] + [EOS] + [PAD] * (width - len(b))
                                     for b in space.bodies], dtype=torch.long)
        self.pool: list[tuple[int, int]] = []  # (head index, body index) samples, eq. (6)'s z̄
        self._gen = torch.Generator().manual_seed(seed)  # batch order only; public seed, nothing secret

    def __repr__(self) -> str:
        return f"RuleGenerator(heads={len(self.space.heads)}, bodies={self.space.n_bodies}, pool={len(self.pool)})"

    def _sequences(self, heads: torch.Tensor, bodies: torch.Tensor) -> torch.Tensor:
        head_tok = torch.tensor([2 + int(h) for h in heads.tolist()], dtype=torch.long)[:, None]
        return torch.cat([head_tok, self._bodies[bodies]], dim=1)

    def _log_prob(self, seq: torch.Tensor) -> torch.Tensor:
        logits = self.model(seq[:, :-1]).log_softmax(-1)
        target = seq[:, 1:]
        lp = logits.gather(-1, target[..., None])[..., 0]
        return (lp * (target != PAD)).sum(1)

    @torch.no_grad()
    def log_prior(self) -> np.ndarray:
        """``log T_θ(body | head)`` renormalised over the rule space, shape (n_heads, n_bodies)."""
        self.model.eval()
        nb = self.space.n_bodies
        out = []
        for h in range(len(self.space.heads)):
            lp = torch.cat([self._log_prob(self._sequences(torch.full((len(idx),), h), idx))
                            for idx in torch.arange(nb).split(4096)])
            out.append((lp - torch.logsumexp(lp, 0)).double().numpy())
        return np.stack(out)

    def prior(self) -> np.ndarray:
        """The prior (eq. 5's multinomial probabilities), shape (n_heads, n_bodies)."""
        return np.exp(self.log_prior())

    def m_step(self, mixture: np.ndarray, *, rng: np.random.Generator) -> float:
        """Algorithm 1 lines 12-14: draw ``samples_per_head`` rules per head from the posterior
        ``mixture`` (n_heads, n_bodies), add them to the pool, maximise eq. (6) on the pool.
        Returns the last epoch's mean negative log-likelihood."""
        mixture = np.asarray(mixture, dtype=np.float64).reshape(len(self.space.heads), self.space.n_bodies)
        for h, row in enumerate(mixture):
            total = row.clip(0).sum()
            if total <= 0:
                continue
            # rules drawn from the public mixture (the server sees it) with a public-seeded rng: not a secret
            draws = rng.choice(self.space.n_bodies, size=self.preset.samples_per_head, p=row.clip(0) / total)
            self.pool.extend((h, int(j)) for j in draws)
        return self.fit(self.pool)

    def fit(self, samples: Sequence[tuple[int, int]]) -> float:
        """Maximise ``Σ log T_θ(body | head)`` over ``samples`` (eq. 6) for ``epochs`` passes."""
        if not samples:
            return float("nan")
        heads = torch.tensor([h for h, _ in samples])
        bodies = torch.tensor([j for _, j in samples])
        self.model.train()
        loss_value = float("nan")
        for _ in range(self.preset.epochs):
            perm = torch.randperm(len(samples), generator=self._gen)
            total, count = 0.0, 0
            for idx in perm.split(self.preset.batch_size):
                loss = -self._log_prob(self._sequences(heads[idx], bodies[idx])).mean()
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
                total, count = total + float(loss.detach()) * len(idx), count + len(idx)
            loss_value = total / count
        return loss_value
