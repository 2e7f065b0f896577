"""AGAT as a task (implements :class:`~clinograph.sdk.federation.task.Task`).

A round at one hospital (AGAT section 3.3): load the global model, estimate the Gaussians
of the features it observes (eq. 3), augment every patient to the n dictionary features
(eq. 4), build the kNN graph over the augmented vectors, add the temporal embedding of the
previous snapshot for long tables (eqs. 7-8), and train the GAT layers and the head with Adam
on minibatches of its training patients (each step runs the whole graph, the loss on the
batch). Module-wise like NS-FL: :meth:`AGATTask.trained_modules` lists only what the hospital
touched, so a hospital without feature f sends nothing for ``augmentation/f``, and a
hospital with a static table nothing for ``temporal/mlp``.

Attention (eq. 1): under the ``agat_secure_attention`` strategy the plan carries
``attention.rule = "fedatt"``; after training the task computes its FedAtt logit
s = ||θ_global − θ_local||_2 over its network modules (``gat/``, ``temporal/``, ``head/``;
not the Gaussians' moment estimates, not the selection module), and its aggregation weight
becomes exp(min(s, max_logit)) (:attr:`AGATTask.num_samples`), which the client applies
before the secure mode (see :mod:`clinograph.secure.strategies.attention`).

Model selection, the evaluation-only last round, Platt calibration on the validation split
and ``finish()`` work as in :class:`~clinograph.sdk.federation.nsfl_task.NSFLTask`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping

import numpy as np
import torch
from clinograph.secure.strategies.attention import (
    ATTENTION_OPTION,
    MAX_LOGIT_OPTION,
    attention_weight,
)

from clinograph.core.errors import ConfigError
from clinograph.core.spec import ModuleKind

from ..config import HospitalConfig
from ..federation.split import Split
from ..federation.task_base import SelectedCalibrated
from ..ingest.table import PatientTable
from ..model.nsfl_modules import SELECTION_MODULE
from ..ontology.dictionary import FeatureDictionary
from ..seeding import torch_seeded
from ..training.calibration import Platt
from ..training.local import bce
from ..training.optim import adam
from ..training.selection import ModelSelection, decode_validation, encode_validation, value_bound
from ..training.trainer import TrainOutcome
from .augmentation import level_groups, one_hot_levels
from .graph import knn_graph
from .model import AGATModel, agat_modules

#: the modules a hospital's FedAtt logit is computed over
NETWORK_PREFIXES = ("gat/", "temporal/", "head/")


def _draw_seed(site: str, seed: int) -> int:
    return int.from_bytes(hashlib.sha256(f"clinograph/agat/augment/{site}/{seed}".encode()).digest()[:8], "big") >> 1


class AGATTask(SelectedCalibrated):
    """AGAT at one hospital (see the module docstring)."""

    name = "agat"

    def __init__(self, table: PatientTable, *, dictionary: FeatureDictionary, config: HospitalConfig, split: Split):
        if config.privacy.enabled:
            raise ConfigError("task = 'agat' with [privacy] enabled: AGAT trains on the full kNN graph "
                              "(transductive), which patient-level DP-SGD cannot bound. Use task = 'nsfl' for DP.")
        self.table, self.config, self.split = table, config, split
        self._node_ids = dictionary.node_ids()
        n = len(self._node_ids)
        with torch_seeded(config.model.init_seed):  # identical initial weights at every hospital
            self.model = AGATModel(n, config.agat)
        self.modules = agat_modules(self.model, self._node_ids, personal=config.personal.modules,
                                    selection=config.model.selection_module)
        self.temporal = table.n_snapshots > 1
        clip = config.agat.value_clip
        self._steps = []  # (values, observed) of the last step and, for long tables, the one before
        groups = level_groups(dictionary)
        for snap in ([table.n_snapshots - 2, table.n_snapshots - 1] if self.temporal else [None]):
            v, o = one_hot_levels(*table.dense(snapshot=snap), groups)
            self._steps.append((np.clip(np.nan_to_num(v), -clip, clip), o))
        gen = torch.Generator().manual_seed(_draw_seed(table.site, config.training.seed))
        self._z = torch.randn(table.n_patients, n, generator=gen, dtype=torch.float64)
        values, observed = self._steps[-1]
        with torch_seeded(config.model.init_seed):  # the estimator alone is kept; the caller's generator put back
            est = AGATModel(n, config.agat).augmentation
        own = est.estimate(values, observed, split.train)
        self.observed = {self._node_ids[f] for f in own}
        #: this hospital's own Gaussians (eq. 3's N(μ_(k), σ²_(k))) of the features it observes: its
        #: missing cells of those features are drawn from them in training *and* in evaluation
        self._own_rows = torch.as_tensor(own, dtype=torch.long)
        self._own_gaussian = est.gaussian.detach()[self._own_rows].clone()
        self._labels = torch.tensor(table.labels, dtype=torch.float32)
        self._graph_key: bytes | None = None
        self._graph: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor] | None = None
        self._weight: float | None = None
        #: this round's FedAtt logit (None before training or without the attention rule)
        self.attention_logit: float | None = None
        self.selection: ModelSelection | None = None
        if config.selection_active() and SELECTION_MODULE in self.modules.names() and len(split.validation):
            self.selection = ModelSelection(patience=config.selection.patience, min_delta=config.selection.min_delta)
        self._metric_before: np.ndarray | None = None
        self._val_loss: float | None = None
        self.evaluate_only = False
        self.calibration: Platt | None = None
        self._rounds_done = 0

    def __repr__(self) -> str:
        return f"AGATTask(site={self.table.site!r}, {self.split!r}, temporal={self.temporal})"

    # -- inputs --------------------------------------------------------------------------------
    def _inputs(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(current, previous or None, edge_index) with the Gaussians now loaded (cached per value):
        the global ones for the features this hospital lacks, its own for those it observes
        (whatever global model is loaded -- a selected round's, the last round's)."""
        gaussian = self.model.augmentation.gaussian.detach().clone()
        gaussian[self._own_rows] = self._own_gaussian
        key = gaussian.numpy().tobytes()
        if self._graph is None or key != self._graph_key:
            aug = self.model.augmentation
            with torch.no_grad():
                xs = [aug(torch.as_tensor(v), torch.as_tensor(o), self._z, gaussian) for v, o in self._steps]
            current, previous = xs[-1], (xs[0] if self.temporal else None)
            self._graph = (current, previous, knn_graph(current, k=self.config.agat.k_neighbours))
            self._graph_key = key
        return self._graph

    # -- Task ----------------------------------------------------------------------------------
    @property
    def num_samples(self) -> float:
        """The aggregation weight: exp(FedAtt logit) under the attention rule, else the training count."""
        return self._weight if self._weight is not None else float(len(self.split.train))

    def train(self, *, round_: int, epochs: int, plan_options: Mapping[str, float | int | str | bool]) -> TrainOutcome:
        self._metric_before, self._weight, self.attention_logit = None, None, None
        if self.selection is not None:
            self._score_global()
        before = self.modules.state(ModuleKind.SHARED)
        loss = float("nan")
        if not self.evaluate_only:
            loss = self._train_local(round_=round_, epochs=epochs)
        rule = plan_options.get(ATTENTION_OPTION)
        if rule is not None:
            if rule != "fedatt":
                raise ConfigError(f"Plan asks for attention rule {rule!r}; this SDK knows 'fedatt'. Update the SDK.")
            s = math.sqrt(sum(float(np.sum((before[n] - self.modules.get(n)) ** 2))
                              for n in self.trained_modules(None) if n.startswith(NETWORK_PREFIXES)))
            self.attention_logit = s
            self._weight = attention_weight(s, max_logit=float(plan_options.get(MAX_LOGIT_OPTION, 8.0)))
        if self._metric_before is not None and self._val_loss is not None:
            fixed = plan_options.get(f"weight/{self.table.site}")
            weight = float(fixed) if fixed is not None else float(
                min(self.num_samples, float(plan_options.get("weight.max", np.inf))))
            self.modules.set(SELECTION_MODULE, encode_validation(
                global_value=self._metric_before, loss_sum=self._val_loss, count=len(self.split.validation),
                weight=weight, bound=value_bound(plan_options)))
        return TrainOutcome(loss=loss, used_similar_to=True, extras={"evaluate_only": float(self.evaluate_only)})

    def _train_local(self, *, round_: int, epochs: int) -> float:
        values, observed = self._steps[-1]
        self.model.augmentation.estimate(values, observed, self.split.train)  # eq. (3): this hospital's Gaussians
        current, previous, edges = self._inputs()
        tc = self.config.training
        params = self.model.network_parameters(temporal=self.temporal)
        opt = adam(params, lr=tc.lr, weight_decay=tc.weight_decay)
        gen = torch.Generator().manual_seed(tc.seed * 100_003 + round_)
        idx = torch.as_tensor(self.split.train)
        self.model.train()
        total, batches = 0.0, 0
        # dropout draws from torch's process-wide generator: seeded here by this hospital and round alone
        # (restored after), so a hospital trains the same whatever ran before it in this process (worker processes)
        with torch_seeded(_draw_seed(self.table.site, tc.seed * 100_003 + round_)):
            for _ in range(epochs):
                perm = idx[torch.randperm(len(idx), generator=gen)]
                for s in range(0, len(perm), tc.batch_size):
                    b = perm[s:s + tc.batch_size]
                    loss = bce(self.model(current, previous, edges)[b], self._labels[b])
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    total, batches = total + loss.item(), batches + 1
        self.model.eval()
        return total / max(batches, 1)

    def _score_global(self) -> None:
        """Validation loss of the model just loaded; encoded into ``metric/validation`` after training."""
        idx = self.split.validation
        p = np.clip(self._predict_raw()[idx], 1e-7, 1 - 1e-7)
        y = self.table.labels[idx].astype(float)
        self._val_loss = float(-np.sum(y * np.log(p) + (1 - y) * np.log(1 - p)))
        self.selection.offer(round_=self._rounds_done, state=self.model.state_dict())  # type: ignore[union-attr]
        self._metric_before = self.modules.get(SELECTION_MODULE)

    def trained_modules(self, outcome: TrainOutcome | None) -> list[str]:
        metric = [SELECTION_MODULE] if self._metric_before is not None else []
        if self.evaluate_only:
            return metric
        out = []
        for n in self.modules.names(ModuleKind.SHARED):
            if n == SELECTION_MODULE:
                continue
            if n.startswith("augmentation/") and n.split("/", 1)[1] not in self.observed:
                continue  # a feature this hospital lacks: it only draws from the global Gaussian
            if n.startswith("temporal/") and not self.temporal:
                continue  # a static table has no previous step (eqs. 7-8 unused)
            out.append(n)
        return out + metric

    def after_round(self) -> None:
        if self.selection is not None and self._metric_before is not None:
            self.selection.observe(decode_validation(before=self._metric_before,
                                                     after=self.modules.get(SELECTION_MODULE)))
            self._metric_before = None
        if not self.evaluate_only:
            self._rounds_done += 1

    @torch.no_grad()
    def _predict_raw(self) -> np.ndarray:
        self.model.eval()
        current, previous, edges = self._inputs()
        return torch.sigmoid(self.model(current, previous, edges)).double().numpy()

    def quality(self) -> dict[str, float]:
        raise ConfigError("task = 'agat' releases no DQ quality metrics; use [release] metrics = 'none' or "
                          "'validation', or task = 'nsfl' with strategy = 'dq_weighted'.")

    def feature_relevance(self) -> dict[str, float]:
        """Per observed feature: the norm of its column in the first GAT layer's W (normalised to max 1)."""
        w = self.model.encoder.layer1.lin.weight.detach().double().norm(dim=0).numpy()
        w = w / max(float(w.max()), 1e-12)
        return {nid: float(w[i]) for i, nid in enumerate(self._node_ids) if nid in self.observed}
