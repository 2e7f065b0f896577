"""Model selection by federated validation loss, with early stopping (issue: "the SDK reports
the last round, no validation").

Each round a hospital scores the global model it just received (with its personal layers) on
its own validation patients and contributes the vector v_k = (Σ_i loss_i, n_k) -- its
validation loss times its validation count, and the count -- as the update of the shared
module ``metric/validation``. The client sends w_k · (global − local); the task sets
local = global − c · v_k / w_k (c a public scale that keeps the values inside the masked mode's
fixed-point range, :func:`encode_validation`), so the summed update is c · Σ_k v_k and the secure mode (masked by
default) reveals the sum only, never one hospital's figure. With a strategy linear in the sums
(fedavg, fedsgd with any server learning rate, fedprox, dq_weighted) the global module moves by
−η · Σ_k v_k / Σ_k w_k; the ratio of its two components is the federated validation loss
L = Σ_k loss_k n_k / Σ_k n_k, independent of η and of the weights. Every hospital decodes the
same L from the signed global model, so all keep the same round.

Under DP each hospital's loss sum is clipped and noised before it is encoded, and the release
accounted in its ledger (:mod:`clinograph.sdk.privacy.selection`; off by default under DP).
Does not work with fedopt (Adam on the summed module is not linear).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from clinograph.secure.runtime.selection import selection_step

#: a hospital's mean validation loss is capped here before encoding, so a diverged model cannot
#: push its update out of the masked mode's fixed-point range
MAX_LOSS = 10.0
#: public bound on a hospital's validation count (larger counts are capped, not refused)
MAX_COUNT = 100_000


def value_bound(plan_options: Mapping[str, float | int | str | bool]) -> float:
    """The bound B on a weighted value the round accepts: ``masked.clip`` when masked, else
    4 · ``weight.max`` (1 when unbounded)."""
    if "masked.clip" in plan_options:
        return float(plan_options["masked.clip"])
    w = float(plan_options.get("weight.max", np.inf))
    return 4.0 * w if np.isfinite(w) else 1.0


def encode_validation(*, global_value: np.ndarray, loss_sum: float, count: int, weight: float,
                      bound: float = 1.0) -> np.ndarray:
    """The local value of ``metric/validation`` whose weighted delta is c · (loss_sum, count),
    with the public scale c = bound / (MAX_LOSS · MAX_COUNT) -- the same at every hospital, so
    it cancels in the ratio, and every weighted value stays within ``bound``."""
    g = np.asarray(global_value, dtype=np.float64)
    if weight <= 0 or count <= 0:
        return g.copy()
    n = min(int(count), MAX_COUNT)
    mean = float(np.clip(float(loss_sum) / count, -MAX_LOSS, MAX_LOSS))  # below 0: a noisy sum under DP
    c = float(bound) / (MAX_LOSS * MAX_COUNT)
    return g - c * np.array([mean * n, float(n)]) / weight


#: significant digits the federated validation loss is decoded to (and so reported to the server and
#: used for selection): under ``ckks`` the hospitals decode it from a CKKS decryption, whose low-order
#: bits carry the decryption error, a function of the secret key (Li & Micciancio 2021); the server
#: knows the ciphertext, so a full-precision float a round would hand it those bits. Six digits (a
#: relative 5e-7) sit far above that error (~1e-13 relative at the presets' scale 2^40) and far below
#: any selection step (``min_delta``); every mode decodes the same way, so transports stay bit for bit.
LOSS_DIGITS = 6


def decode_validation(*, before: np.ndarray, after: np.ndarray) -> float | None:
    """The federated validation loss Σ loss·n / Σ n from the module's move, to :data:`LOSS_DIGITS`
    significant digits (None: nobody reported)."""
    d = np.asarray(before, dtype=np.float64) - np.asarray(after, dtype=np.float64)
    if not d[1] > 1e-12:
        return None
    return float(f"{float(d[0] / d[1]):.{LOSS_DIGITS}g}")


@dataclass
class ModelSelection:
    """A hospital's record of the federation's selection: the best model so far (a full copy,
    shared and personal modules) and the early-stopping counter.

    ``losses[i]`` is the federated validation loss of the global model after ``rounds[i]``
    completed rounds (0: the initial model), ``noises[i]`` its noise std under distributed DP (0
    without DP). The rule is the server's (:func:`clinograph.secure.runtime.selection.selection_step`):
    ``best_*`` is the kept round, the latest not worse than ``low_loss`` (the lowest released loss,
    of noise ``low_noise``) beyond their noise; without DP, the lowest loss.
    """

    patience: int
    min_delta: float
    rounds: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    noises: list[float] = field(default_factory=list)
    best_round: int | None = None
    best_loss: float = float("inf")
    low_loss: float = float("inf")
    low_noise: float = 0.0
    best_state: dict[str, torch.Tensor] | None = None
    #: where the best model's shared modules came from (the driver's tag: federation id and round)
    best_tag: tuple[str, int] | None = None
    _candidate: tuple[int, dict[str, torch.Tensor], tuple[str, int] | None] | None = None
    _bad: int = 0

    def offer(self, *, round_: int, state: dict[str, torch.Tensor], tag: tuple[str, int] | None = None) -> None:
        """The model about to be scored (a copy is kept until its loss is known); ``tag``: the
        federation id and round whose published global model its shared modules hold."""
        self._candidate = (round_, {k: v.detach().clone() for k, v in state.items()}, tag)

    def observe(self, loss: float | None, noise: float = 0.0) -> None:
        """The federated validation loss of the last offered model and its noise std (0: no DP)."""
        if self._candidate is None or loss is None or not np.isfinite(loss):
            self._candidate = None
            return
        round_, state, tag = self._candidate
        self._candidate = None
        self.rounds.append(round_)
        self.losses.append(float(loss))
        self.noises.append(float(noise))
        low = None if self.best_state is None else (self.low_loss, self.low_noise)
        keep, new_low = selection_step(loss=float(loss), noise=float(noise), low=low, min_delta=self.min_delta)
        if new_low:
            self.low_loss, self.low_noise = float(loss), float(noise)
        if keep:
            self.best_round, self.best_loss, self.best_state, self.best_tag = round_, float(loss), state, tag
            self._bad = 0
        else:
            self._bad += 1

    @property
    def should_stop(self) -> bool:
        """Early stopping: ``patience`` evaluated rounds in a row that were worse."""
        return self.patience > 0 and self._bad >= self.patience

    def record(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """Everything this record holds, for a restart: ``(meta, tensors)`` (the best and the
        offered models' states under ``best/`` and ``offered/``)."""
        meta: dict[str, Any] = {"rounds": list(self.rounds), "losses": list(self.losses), "noises": list(self.noises),
                                "best_round": self.best_round,
                                "best_loss": None if math.isinf(self.best_loss) else self.best_loss, "bad": self._bad,
                                "low_loss": None if math.isinf(self.low_loss) else self.low_loss,
                                "low_noise": self.low_noise,
                                "best_tag": None if self.best_tag is None else list(self.best_tag),
                                "offered": None if self._candidate is None else self._candidate[0],
                                "offered_tag": None if self._candidate is None or self._candidate[2] is None
                                else list(self._candidate[2])}
        tensors = {f"best/{k}": v for k, v in (self.best_state or {}).items()}
        if self._candidate is not None:
            tensors.update({f"offered/{k}": v for k, v in self._candidate[1].items()})
        return meta, tensors

    def take_back(self, meta: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore :meth:`record`."""
        self.rounds = [int(x) for x in meta["rounds"]]
        self.losses = [float(x) for x in meta["losses"]]
        self.best_round = None if meta["best_round"] is None else int(meta["best_round"])
        self.best_loss = math.inf if meta["best_loss"] is None else float(meta["best_loss"])
        self.noises = [float(x) for x in meta.get("noises", [0.0] * len(self.losses))]
        low = meta.get("low_loss", meta["best_loss"])  # a record from before the noise-aware rule: the kept round's
        self.low_loss = math.inf if low is None else float(low)
        self.low_noise = float(meta.get("low_noise", 0.0))
        self._bad = int(meta["bad"])
        best = {k[5:]: v for k, v in tensors.items() if k.startswith("best/")}
        self.best_state = best or None
        self.best_tag = _tag(meta.get("best_tag"))
        offered = {k[8:]: v for k, v in tensors.items() if k.startswith("offered/")}
        self._candidate = None if meta["offered"] is None else (int(meta["offered"]), offered,
                                                                _tag(meta.get("offered_tag")))


def _tag(value: Any) -> tuple[str, int] | None:
    """A (federation id, round) tag from its JSON form."""
    return None if value is None else (str(value[0]), int(value[1]))
