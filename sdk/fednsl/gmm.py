"""FedNSL's numerical experiment (paper section 4.1.1, appendix A.5-A.6): a server 3-GMM as the
prior over three "rule categories", two client classifiers as the posteriors.

Data (A.5): three 2-D Gaussian classes, means ``[20, 20]``, ``[10, 10]``, ``[2, 2]`` with
covariances ``[[.5, .1], [.1, .5]]``, ``[[.5, .2], [.2, .5]]``, ``[[.5, −.3], [−.3, .5]]``, 200 points
each. Client 1 trains on classes 0 and 1 plus 150 class-2 points relabelled at random with
``{0, 1, 2}``; the other 50 class-2 points are its unseen test set. Client 2 mirrors it with
classes 1 and 2 and class 0 unseen. Each client draws its own 600 points (the paper does not
say whether class 1 is shared).

FedNSL here (A.6): each client is a 2-64-3 classifier ``p_w(z | x)``; the server's prior is a
3-component GMM, ``p_θ(z | x)`` its responsibilities (component k = class k). A round:

- client (eq. 2): minimise ``CE(labels) + λ · D_KL(p_w(z|x) ‖ p_θ(z|x))`` over its points;
- client posterior (eq. 10): ``q(z | x) ∝ p_w(z | x) · p_θ(z | x)``; the client sends, per
  component, ``Σ q``, ``Σ q x``, ``Σ q x xᵀ`` -- the expectation of the statistics of samples
  ``z ~ q`` (Algorithm 1 line 13's samples, in expectation) -- a sum, so it can be securely
  aggregated: the server learns only the federation's totals;
- server (eq. 6): the GMM maximising the expected log-likelihood of those samples (the
  weighted MLE), the first round initialising it from the classifiers' outputs (A.6).

Shapes:
    x: (n, 2); labels: (n,) in {0, 1, 2}
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..seeding import torch_seeded

MEANS = np.array([[20.0, 20.0], [10.0, 10.0], [2.0, 2.0]])
COVS = np.array([[[0.5, 0.1], [0.1, 0.5]], [[0.5, 0.2], [0.2, 0.5]], [[0.5, -0.3], [-0.3, 0.5]]])
INPUT_SCALE = 10.0  # public constant: inputs enter the networks as x / 10


@dataclass(frozen=True, repr=False)
class ClientData:
    """One client's training set (seen classes + relabelled unseen points) and test sets."""

    x_train: np.ndarray
    y_train: np.ndarray
    seen_mask: np.ndarray  # training points of the seen classes (clean labels)
    x_unseen: np.ndarray
    y_unseen: np.ndarray
    unseen_class: int


def make_clients(seed: int, *, per_class: int = 200, relabelled: int = 150,
                 shared_pool: bool = False) -> list[ClientData]:
    """The two clients of A.5 (see the module docstring). ``shared_pool``: A.5 read literally --
    ONE pool of ``3 × per_class`` points that both clients draw from (client 1's relabelled
    class-2 points are among client 2's clean ones), instead of a fresh sample per client."""
    rng = np.random.default_rng(seed)  # synthetic data from a public seed: nothing secret is drawn (style 13)
    pool = [rng.multivariate_normal(MEANS[c], COVS[c], size=per_class) for c in range(3)] if shared_pool else None
    out = []
    for unseen in (2, 0):
        xs = pool or [rng.multivariate_normal(MEANS[c], COVS[c], size=per_class) for c in range(3)]
        seen = [c for c in range(3) if c != unseen]
        perm = rng.permutation(per_class)
        noisy, test = xs[unseen][perm[:relabelled]], xs[unseen][perm[relabelled:]]
        x = np.concatenate([xs[seen[0]], xs[seen[1]], noisy])
        y = np.concatenate([np.full(per_class, seen[0]), np.full(per_class, seen[1]), rng.integers(0, 3, relabelled)])
        mask = np.concatenate([np.ones(2 * per_class, bool), np.zeros(relabelled, bool)])
        out.append(ClientData(x, y, mask, test, np.full(len(test), unseen), unseen))
    return out


def mlp(seed: int) -> nn.Module:
    """A.6's classifier: 2 inputs, 64 hidden units, 3 outputs (softmax in the loss)."""
    with torch_seeded(seed):
        return nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 3))


def tensor(x: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(x / INPUT_SCALE, dtype=torch.float32)


@dataclass(frozen=True)
class GMM:
    """The server's prior: weights (3,), means (3, 2), covariances (3, 2, 2)."""

    weights: np.ndarray
    means: np.ndarray
    covs: np.ndarray

    def responsibilities(self, x: np.ndarray) -> np.ndarray:
        """``p_θ(z | x)``, (n, 3)."""
        logp = []
        for w, m, c in zip(self.weights, self.means, self.covs, strict=True):
            d = x - m
            inv = np.linalg.inv(c)
            logp.append(np.log(w + 1e-300) - 0.5 * np.einsum("ni,ij,nj->n", d, inv, d)
                        - 0.5 * np.log(np.linalg.det(c)) - np.log(2 * np.pi))
        lp = np.stack(logp, 1)
        lp -= lp.max(1, keepdims=True)
        p = np.exp(lp)
        return p / p.sum(1, keepdims=True)

    @classmethod
    def from_stats(cls, stats: np.ndarray, *, reg: float = 1e-3) -> GMM:
        """Eq. (6) for a GMM: the weighted MLE from summed ``[Σq, Σqx (2), Σqxxᵀ (4)]`` per component."""
        s0, s1, s2 = stats[:, 0], stats[:, 1:3], stats[:, 3:7].reshape(-1, 2, 2)
        means = s1 / np.maximum(s0[:, None], 1e-12)
        covs = s2 / np.maximum(s0[:, None, None], 1e-12) - np.einsum("ki,kj->kij", means, means) + reg * np.eye(2)
        return cls(s0 / s0.sum(), means, covs)


def posterior_stats(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    """A client's summed statistics of its posterior ``q`` (n, 3): (3, 7)."""
    xx = np.einsum("ni,nj->nij", x, x).reshape(len(x), 4)
    return np.concatenate([q.sum(0)[:, None], q.T @ x, q.T @ xx], axis=1)


def client_round(model: nn.Module, data: ClientData, prior: GMM | None, *, kl_weight: float, steps: int,
                 lr: float) -> np.ndarray:
    """One FedNSL client round (module docstring); returns the statistics it sends."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    x, y = tensor(data.x_train), torch.as_tensor(data.y_train)
    log_prior = None if prior is None else torch.log(torch.as_tensor(prior.responsibilities(data.x_train),
                                                                     dtype=torch.float32) + 1e-12)
    for _ in range(steps):
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        if log_prior is not None and kl_weight > 0:
            logq = logits.log_softmax(1)
            loss = loss + kl_weight * (logq.exp() * (logq - log_prior)).sum(1).mean()  # eq. (2)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        p = model(x).softmax(1).double().numpy()
    if prior is not None:
        p = p * prior.responsibilities(data.x_train)  # eq. (10): likelihood × prior
        p /= p.sum(1, keepdims=True)
    return posterior_stats(data.x_train, p)


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    with torch.no_grad():
        return float((model(tensor(x)).argmax(1).numpy() == y).mean())
