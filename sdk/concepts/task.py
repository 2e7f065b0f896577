"""F-CMs as a task: a concept model (CBM, CEM, CGM, C2BM over any encoder) at one hospital.

Implements :class:`~clinograph.sdk.federation.task.Task`, so the one
:class:`~clinograph.sdk.federation.client.HospitalClient` runs it under every secure mode and
transport, with the project's sign convention (Δ = θ_global − θ_local, NS-FL eq. 7; the
server's fedavg/fedsgd applies it unchanged).

Module-specific training (F-CMs eq. 2, section 4.2.3): a hospital trains the encoder, the
modules of the concepts it has labels for, and the task head if it has task labels; every
other module is frozen (no gradient) and :meth:`ConceptTask.trained_modules` leaves it out,
so nothing is sent for it and the server averages each module over its contributors only.

Patient-level DP (F-CMs appendix E.4), from the ``[privacy]`` section NS-FL uses: with a local-DP
trainer (:mod:`.dp_training`) every local step is DP-SGD on those same modules; with a
distributed-DP trainer (:mod:`.distributed_training`) a round is one DP-SGD step whose noise is a
share of the federation's, and the task then releases **every** module (zeros + noise on those it
does not train) with weight q·n. Either way the round's ledger entry goes into the signed report.

DAG voting (section 4.2.1): with ``vote=True`` the task's module map holds one more shared
module, :data:`~clinograph.secure.dag_voting.VOTE_MODULE` (float64, never trained by the
optimiser), whose global value is the accumulated tally kept by the ``dag_voting`` strategy.
Each round the task sets its local value to ``tally − vote`` with ``vote`` the unit-weight
:func:`~clinograph.secure.dag_voting.encode_vote` of its view, so the client's
``w · (global − local)`` is exactly ``encode_vote(weight=w)``: the vote is weighted by the
hospital's aggregation weight and summed by the secure mode like any parameter.

``ConceptTask(model=None, vote=True)`` is a vote-only task (the first phase of
:func:`clinograph.sdk.concepts.federation.run_concept_federation`): its spec is the vote module alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from clinograph.secure.dag_voting import VOTE_MODULE, encode_vote, vote_length
from torch import nn

from clinograph.core.errors import ConfigError
from clinograph.core.spec import ModuleKind

from ..federation.task import TaskBase
from ..model.modules import ModuleMap, Piece
from ..privacy.distributed_round import ExactLocal
from ..training.optim import adam
from ..training.trainer import TrainOutcome
from .distributed_training import ConceptDistributedTrainer
from .dp_training import ConceptDPTrainer
from .model import ConceptModel, fcm_loss, random_interventions
from .params import freeze_unsupervised, module_parameters, trainable_modules


@dataclass(frozen=True)
class ConceptTraining:
    """Local training of one round (defaults after F-CMs appendix D.3)."""

    lr: float = 3e-3
    batch_size: int = 512
    gamma: float = 0.8
    p_intervention: float = 0.25
    seed: int = 0


@dataclass(frozen=True)
class ConceptVote:
    """A hospital's DAG proposal: the nodes it supervises (task included if labelled), its
    edges among them, and the federation's global concept list the vote is encoded over."""

    concepts: tuple[str, ...]
    nodes: tuple[str, ...]
    edges: tuple[tuple[str, str], ...]

    def unit_vote(self) -> np.ndarray:
        """:func:`encode_vote` with weight 1 (the client multiplies by its weight)."""
        idx = {v: i for i, v in enumerate(self.nodes)}
        a = np.zeros((len(self.nodes), len(self.nodes)))
        for u, v in self.edges:
            a[idx[u], idx[v]] = 1.0
        return encode_vote(concepts=self.concepts, local_nodes=self.nodes, scores=a, weight=1.0)


def concept_module_map(model: ConceptModel | None, *, concepts: Sequence[str] | None) -> tuple[ModuleMap, nn.Parameter | None]:
    """Every concept-model module as shared (``encoder/...``, ``concept/<c>``, ``head/task``),
    plus the vote module when ``concepts`` is given. Returns the map and the vote parameter."""
    modules = ModuleMap()
    if model is not None:
        for name, ps in module_parameters(model).items():
            modules.add(name, ModuleKind.SHARED, [Piece(p) for p in ps])
    vote = None
    if concepts is not None:
        vote = nn.Parameter(torch.zeros(vote_length(len(concepts)), dtype=torch.float64), requires_grad=False)
        modules.add(VOTE_MODULE, ModuleKind.SHARED, [Piece(vote)])
    return modules, vote


class ConceptTask(TaskBase):
    """A concept model at one hospital (implements :class:`~clinograph.sdk.federation.task.Task`).

    Args:
        model: the concept model (identical initial weights at every hospital), or None for a
            vote-only task.
        inputs: encoder input for all patients (a tensor indexed by rows), or ``batch(idx)``
            returning the encoder's input for those rows (e.g. NS-FL star batches).
        labels: node -> LongTensor ``(n,)`` of states, ``-1`` where missing; only the nodes
            this hospital has (concept labels from its table, and the task).
        task: the task node's name.
        split: train / validation / test row indices.
        vote: the hospital's DAG proposal, or None to send no vote.
        training: local training settings.
        privacy: patient-level DP-SGD from ``[privacy]`` (:func:`.dp_training.concept_dp_trainer`:
            local or distributed by ``mode``), or None to train without DP (no guarantee).
    """

    name = "concepts"

    def __init__(self, *, model: ConceptModel | None, inputs: torch.Tensor | Callable[[torch.Tensor], Any],
                 labels: Mapping[str, torch.Tensor], task: str, split: Any, vote: ConceptVote | None = None,
                 training: ConceptTraining | None = None,
                 privacy: ConceptDPTrainer | ConceptDistributedTrainer | None = None):
        if model is None and vote is None:
            raise ConfigError("A ConceptTask needs a model, a vote, or both.")
        if isinstance(privacy, ConceptDistributedTrainer) and (model is None or vote is not None):
            raise ConfigError("Distributed DP trains a concept model alone: the vote runs before it, outside the "
                              "accountant (build the vote task without privacy).")
        self.model, self.task, self.split = model, task, split
        self.training = training or ConceptTraining()
        self.privacy = privacy
        self.labels = {v: torch.as_tensor(y, dtype=torch.long) for v, y in labels.items()}
        self._inputs = inputs
        self.vote = vote
        self.modules, self._vote_param = concept_module_map(model, concepts=vote.concepts if vote else None)
        if isinstance(privacy, ConceptDistributedTrainer):  # released modules read θ − z/(s·w) in a round
            self.modules = ExactLocal(self.modules)
        train = torch.as_tensor(np.asarray(split.train), dtype=torch.long)
        #: nodes with at least one training label here: the concepts this hospital supervises, I^(k)
        self.supervised = {v for v, y in self.labels.items() if len(train) and bool((y[train] >= 0).any())}
        self.has_task = task in self.supervised
        self._gen = torch.Generator().manual_seed(self.training.seed)

    def __repr__(self) -> str:
        return f"ConceptTask(kind={self.model.kind if self.model else None!r}, supervised={len(self.supervised)})"

    @property
    def num_samples(self) -> float:  # type: ignore[override]
        """Training patients; under distributed DP the expected batch q·n (FedSGD's weight)."""
        if isinstance(self.privacy, ConceptDistributedTrainer):
            return self.privacy.expected_batch
        return int(len(self.split.train))

    def _batch(self, idx: torch.Tensor) -> Any:
        return self._inputs(idx) if callable(self._inputs) and not isinstance(self._inputs, torch.Tensor) \
            else self._inputs[idx]

    def train(self, *, round_: int, epochs: int, plan_options: Mapping[str, float | int | str | bool]) -> TrainOutcome:
        """Eq. (2) on this hospital's supervision, with random interventions; then the vote."""
        loss_sum, steps = 0.0, 0
        if self.model is not None:
            cfg, model = self.training, self.model
            concepts = self.supervised - {self.task}
            freeze_unsupervised(model, supervised=concepts, has_task=self.has_task)
            train = torch.as_tensor(np.asarray(self.split.train), dtype=torch.long)
            nodes = sorted(concepts & set(model.graph.nodes))
            if isinstance(self.privacy, ConceptDistributedTrainer):  # one step, a share of the noise
                if not isinstance(self.modules, ExactLocal):  # pragma: no cover - set in __init__
                    raise ConfigError("distributed DP needs the task's exact local module map")
                return self.privacy.train(
                    model=model, modules=self.modules, batch=self._batch, labels=self.labels, train_idx=train,
                    interventions=lambda lab: random_interventions(lab, nodes=nodes, p=cfg.p_intervention,
                                                                   generator=self._gen),
                    supervised=concepts, has_task=self.has_task, task=self.task, gamma=cfg.gamma, round_=round_,
                    epochs=epochs, plan_options=plan_options)
            if self.privacy is not None:  # DP-SGD on the same modules (F-CMs E.4, .dp_training)
                outcome = self.privacy.train(
                    model=model, batch=self._batch, labels=self.labels, train_idx=train, lr=cfg.lr,
                    interventions=lambda lab: random_interventions(lab, nodes=nodes, p=cfg.p_intervention,
                                                                   generator=self._gen),
                    supervised=concepts, has_task=self.has_task, task=self.task, gamma=cfg.gamma, round_=round_,
                    epochs=epochs, plan_options=plan_options)
                self._send_vote()
                return outcome
            params = [p for p in model.parameters() if p.requires_grad]
            opt = adam(params, lr=cfg.lr)
            model.train()
            for _ in range(epochs):
                perm = train[torch.randperm(len(train), generator=self._gen)]
                for s in range(0, len(perm), cfg.batch_size):
                    idx = perm[s:s + cfg.batch_size]
                    labels = {v: y[idx] for v, y in self.labels.items()}
                    iv = random_interventions(labels, nodes=nodes, p=cfg.p_intervention, generator=self._gen)
                    out = model(self._batch(idx), interventions=iv)
                    loss = fcm_loss(out, labels, supervised=concepts, has_task=self.has_task, task=self.task,
                                    gamma=cfg.gamma)
                    if not loss.requires_grad:
                        continue
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    loss_sum, steps = loss_sum + float(loss.detach()), steps + 1
        self._send_vote()
        return TrainOutcome(loss=loss_sum / max(steps, 1), used_similar_to=False)

    def _send_vote(self) -> None:
        if self.vote is not None and self._vote_param is not None:
            with torch.no_grad():  # local = tally − vote, so w · (global − local) = encode_vote(weight=w)
                self._vote_param.sub_(torch.from_numpy(self.vote.unit_vote()))

    def trained_modules(self, outcome: TrainOutcome) -> list[str]:
        """The encoder, the supervised concepts' modules, the task head if labelled, the vote; under
        distributed DP every module (each carries this hospital's noise share)."""
        if isinstance(self.privacy, ConceptDistributedTrainer):
            return self.modules.names(ModuleKind.SHARED)
        out: list[str] = []
        if self.model is not None:
            out = trainable_modules(self.model, supervised=self.supervised - {self.task}, has_task=self.has_task)
        if self.vote is not None:
            out.append(VOTE_MODULE)
        return out

    def finish(self) -> dict[str, float | int | None]:
        """``run/finish``: no selection and no calibration for concept models -- the last round's
        model is kept (the vote's task has no model at all)."""
        return {"round": None}

    def after_round(self) -> None:
        if isinstance(self.modules, ExactLocal):
            self.modules.clear()

    @torch.no_grad()
    def _output(self, idx: np.ndarray):
        if self.model is None:
            raise ConfigError("A vote-only ConceptTask has no model to evaluate.")
        self.model.eval()
        return self.model(self._batch(torch.as_tensor(np.asarray(idx), dtype=torch.long)))

    def evaluate(self, split: str) -> dict[str, float]:
        """Task accuracy and mean accuracy over the concepts this hospital has labels for."""
        idx = {"test": self.split.test, "validation": self.split.validation}.get(split)
        if idx is None:
            raise ConfigError(f"Unknown split {split!r}; expected 'validation' or 'test'.")
        if len(idx) == 0:
            raise ConfigError(f"This hospital has no {split} patients.")
        out = self._output(idx)
        t = torch.as_tensor(np.asarray(idx), dtype=torch.long)
        accs: dict[str, float] = {}
        for v, y in self.labels.items():
            yy = y[t]
            keep = yy >= 0
            if v in out.logits and bool(keep.any()):
                accs[v] = float((out.logits[v][keep].argmax(1) == yy[keep]).float().mean())
        metrics = {"concept_acc": float(np.mean([a for v, a in accs.items() if v != self.task]))
                   if any(v != self.task for v in accs) else float("nan")}
        if self.task in accs:
            metrics["task_acc"] = accs[self.task]
        return metrics

    def quality(self) -> dict[str, float]:
        raise ConfigError("Quality metrics (DQ weighting) are not defined for concept models; use "
                          "[release] metrics = 'none' or 'validation'.")

    def feature_relevance(self) -> dict[str, float]:
        return {}

    def predict(self) -> np.ndarray:
        """Task-state probabilities ``(n, card)`` for every patient (rows of ``inputs``)."""
        n = len(self.split.train) + len(self.split.validation) + len(self.split.test)
        out = self._output(np.arange(n))
        if self.task not in out.probs:
            raise ConfigError(f"The model does not predict the task {self.task!r} (no hospital labels it).")
        return out.probs[self.task].numpy()
