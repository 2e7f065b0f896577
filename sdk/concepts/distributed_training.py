"""Patient-level distributed DP for :class:`~.task.ConceptTask` in the runtime (``[privacy] mode =
"distributed"``): one DP-SGD step a round over the federation's patients, each hospital's noise a
Skellam share of one Gaussian-like noise that exists only in the masked sum.

The concept-model counterpart of NS-FL's
:class:`~clinograph.sdk.privacy.distributed_trainer.DistributedTrainer`: the same round
(:mod:`clinograph.sdk.privacy.distributed_round`) around the same noised sum
(:func:`clinograph.sdk.privacy.distributed.noised_sum`), with the same per-patient engine as local
DP (:func:`.dp.concept_clipper`). Each round, at hospital k:

1. Poisson-sample its training patients at the federation's q (CSPRNG coins; q = 1: all of them).
2. Each sampled patient's gradient of its own F-CMs eq. (2) loss (:func:`.dp.row_losses`), over
   **every coordinate of the derived model** in spec order: the modules it trains (the encoder,
   its supervised concepts, the task head if it has task labels; section 4.2.3) carry the
   gradient, every other module zeros. The whole gradient is clipped (to C', step 3; not formed
   as a row); its width must be the spec's shared size (checked, nothing sent otherwise).
3. The clipped sum formed in float64 from the engine's parts, without per-patient rows
   (:func:`concept_sum`, :mod:`~clinograph.sdk.privacy.parts_sum`: ghost norms ‖a_p‖²‖b_p‖² of the
   one-position Linear weights plus the formed rows' norms, clip factors f_p, one (f∘b)ᵀa product
   a weight; clip C' = C·(1 − η), η ≈ 1.3e-5 covering the norms' and the sum's float errors),
   scaled by the ring scale s and rounded randomly **once**
   (:func:`~clinograph.sdk.privacy.distributed_sum.noised_clipped_sum`: d coins, not one per
   patient and coordinate; the same sensitivity Δ2 <= C·s + √d, so the same accountant -- docs/
   privacy.md, "Rounding the hospital's sum"), and the Skellam share Sk(μ/h), μ = (σ·C·s)², added
   to **every** coordinate -- the zeros included, so the server's noise test and its every-module
   rule hold whatever a hospital supervises. Where the parts' bound does not apply (parts not
   float32, a clip outside its range, a trained parameter not released once whole) the clipped
   rows are formed and summed (:func:`concept_rows`,
   :func:`~clinograph.sdk.privacy.distributed_sum.noised_rounded_sum`, the same bound with the
   rows' η); past 2^17 training patients each row is clipped at C and rounded
   (:func:`~clinograph.sdk.privacy.distributed.noised_sum`).
4. The client sends z/s as its weighted update with weight w = q·n (its expected batch) for every
   module; the masked mode sums the z exactly and FedSGD applies θ ← θ − η·Σ_k z_k/(s·Σ_k q·n_k)
   to every module.

Consequences of step 4: a module trained by some hospitals only is divided by every hospital's
expected batch, not only its trainers' (a smaller effective step; no privacy effect), as for the
modality encoders under distributed DP; and the step size is the server's (``[federation]
server_lr``), not the hospital's ``[concepts] lr`` (no local optimiser runs).

Guarantees: the aggregate each round is the Skellam mechanism over the honest hospitals' shares
(σ, q, C, s, d = the derived model's released coordinates), accounted per hospital in its signed
:class:`~clinograph.sdk.privacy.distributed.DistributedLedger` (ε relied on and ε alone), checked
before the round and committed after it; the server checks every share at its published scale and
dimension, the ε floors and the aggregate's noise (:mod:`clinograph.secure.dp_checks`), and
``[dp_policy]`` against the derived model's dimension when the training run is built
(:func:`clinograph.secure.runtime.build.build_server`, after the vote, before the first
training round). Does not cover: the DAG vote (graph-level, no patient values, before training),
:meth:`ConceptTask.evaluate` / ``predict`` outputs, or the validation split (no model choice for
concept runs: the last round's model is kept).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch
from clinograph.secure.dp import CsprngUniform, DistributedPolicy

from clinograph.core.errors import PrivacyError
from clinograph.core.identity import Identity
from clinograph.core.spec import ModuleKind

from ..model.modules import ModuleMap
from ..privacy.distributed import DistributedLedger, PatientRows, noised_sum, poisson_sample
from ..privacy.distributed_round import (
    ExactLocal,
    check_in_ring,
    commit_round,
    open_round,
    privacy_policy,
)
from ..privacy.distributed_sum import SUM_MAX_ROWS, noised_clipped_sum, noised_rounded_sum
from ..privacy.parts_sum import parts_clipped_sum, parts_sum_clip
from ..training.trainer import TrainOutcome
from .dp import ConceptLabels, concept_clipper, trainable_names


def concept_rows(model: torch.nn.Module, modules: ModuleMap, x: torch.Tensor, labels: Mapping[str, torch.Tensor],
                 interventions: Mapping[str, torch.Tensor], *, supervised: set[str], has_task: bool, task: str,
                 gamma: float, clip: float | None = None) -> PatientRows:
    """Each row's gradient of its own eq. (2) loss over every released coordinate, in spec order
    (the shared modules' pieces, as :meth:`ModuleMap.get` concatenates them), zeros on parameters
    the hospital does not train (frozen: no gradient), each row clipped to ``clip`` when given.
    Shapes: x [B, ...] -> [B, d] float64 rows, read a block at a time (:class:`PatientRows`).

    The per-patient engine of local DP (:func:`.dp.concept_clipper`, tested against a per-patient loop)."""
    b = int(x.shape[0])
    pieces = [(pc.param, pc.row) for name in modules.names(ModuleKind.SHARED) for pc in modules.pieces(name)]
    grads: list = []
    engine = concept_clipper(model, trainable_names(model), like=x) if b else None  # type: ignore[arg-type]
    if engine is not None:
        grads, _ = engine.per_sample(x, dict(interventions), labels=ConceptLabels(
            dict(labels), frozenset(supervised), bool(has_task), task, float(gamma)))
    index = {id(p): i for i, p in enumerate(engine.params)} if engine is not None else {}
    blocks = []
    for p, row in pieces:
        width = int(p.numel()) if row is None else int(p[row].numel())
        i = index.get(id(p))
        g = grads[i] if i is not None else None  # None: frozen, its columns stay zero
        blocks.append((width, None if g is None else (g.detach() if row is None else g.detach()[:, row])))
    return PatientRows(blocks, n=b, clip=clip)


def concept_sum(model: torch.nn.Module, modules: ModuleMap, x: torch.Tensor, labels: Mapping[str, torch.Tensor],
                interventions: Mapping[str, torch.Tensor], *, supervised: set[str], has_task: bool, task: str,
                gamma: float, clip: float) -> np.ndarray | None:
    """Σ_p min(1, clip/‖g_p‖)·g_p over every released coordinate, in spec order (zeros on parameters
    the hospital does not train), float64 [d], without per-patient rows: the engine's parts summed
    by :func:`~clinograph.sdk.privacy.parts_sum.parts_clipped_sum` (its float64 bound: clip at
    :func:`~clinograph.sdk.privacy.parts_sum.parts_sum_clip`). None when that path does not apply
    (the parts' dtypes or the clip outside its bound, or a trained parameter not released exactly
    once, whole: its norm would not be the released row's): :func:`concept_rows` then.

    Raises:
        PrivacyError: a patient's gradient is not finite, or more than ``SUM_MAX_ROWS`` patients."""
    b = int(x.shape[0])
    pieces = [(pc.param, pc.row) for name in modules.names(ModuleKind.SHARED) for pc in modules.pieces(name)]
    if b == 0:
        return np.zeros(sum(int(p.numel()) if row is None else int(p[row].numel()) for p, row in pieces))
    engine = concept_clipper(model, trainable_names(model), like=x)  # type: ignore[arg-type]
    index = {id(p): i for i, p in enumerate(engine.params)}
    released = [index[id(p)] for p, row in pieces if id(p) in index and row is None]
    if sorted(released) != list(range(len(engine.params))) or any(row is not None for p, row in pieces
                                                                  if id(p) in index):
        return None
    summed = parts_clipped_sum(engine, x, dict(interventions), clip=clip, labels=ConceptLabels(
        dict(labels), frozenset(supervised), bool(has_task), task, float(gamma)))
    if summed is None:
        return None
    by_param = torch.split(summed, engine.sizes)
    return torch.cat([by_param[index[id(p)]] if id(p) in index else torch.zeros(int(p.numel()), dtype=torch.float64)
                      for p, _ in pieces]).numpy()


class ConceptDistributedTrainer:
    """One DP-SGD step a round of one hospital's concept model under distributed DP, with its
    ledger (see the module docstring).

    Args:
        ledger: this hospital's :class:`DistributedLedger`.
        policy: the federation's mechanism as this hospital holds itself to it (its ``[privacy]``).
        n_train: training patients (public: fixes the expected batch q·n, the FedSGD weight).
    """

    #: every module of the derived model is released at every round (zeros + noise where untrained)
    releases_every_module = True

    def __init__(self, *, ledger: DistributedLedger, policy: DistributedPolicy, n_train: int):
        self.ledger, self.policy, self.n_train = ledger, policy, int(n_train)
        self.sampler = CsprngUniform()
        self.last_batch = 0

    def __repr__(self) -> str:
        p = self.policy
        return (f"ConceptDistributedTrainer(site={self.ledger.site!r}, sigma={p.noise_multiplier:g}, "
                f"q={p.sample_rate:g}, clip={p.clip_norm:g}, h={p.min_honest})")

    @property
    def expected_batch(self) -> float:
        """q·n: the hospital's FedSGD weight."""
        return self.policy.sample_rate * self.n_train

    def train(self, *, model: torch.nn.Module, modules: ExactLocal, batch: Callable[[torch.Tensor], object],
              labels: Mapping[str, torch.Tensor], train_idx: torch.Tensor,
              interventions: Callable[[Mapping[str, torch.Tensor]], dict], supervised: set[str], has_task: bool,
              task: str, gamma: float, round_: int, epochs: int,
              plan_options: Mapping[str, float | int | str | bool]) -> TrainOutcome:
        """One round: steps 1-3 of the module docstring; ``modules`` then reads θ − z/(s·w).

        Raises:
            PrivacyError: the plan is not a distributed-DP round (not masked, fixed weights, more
                than one epoch, threshold below h), a row's width is not the spec's shared size,
                the noisy sum leaves the masked range, or the encoding would not give z back --
                nothing is sent.
            PrivacyBudgetExceeded: the round would pass the budget (before training).
        """
        site = self.ledger.site
        weight, shared = self.expected_batch, modules.spec().shared
        dim = sum(m.size for m in shared)
        record, scale, bound = open_round(self.ledger, self.policy, plan_options, round_=round_, epochs=epochs,
                                          weight=weight, dim=dim)
        n = int(len(train_idx))
        idx = train_idx[torch.as_tensor(poisson_sample(n, self.policy.sample_rate, source=self.sampler),
                                        dtype=torch.long)]
        lab = {v: y[idx] for v, y in labels.items()}
        model.train()
        once = n <= SUM_MAX_ROWS  # round the hospital's clipped sum once (distributed_sum), else each row
        args = (model, modules, batch(idx), lab, interventions(lab))
        kw = {"supervised": supervised, "has_task": has_task, "task": task, "gamma": gamma}
        try:  # the sum from the engine's parts (parts_sum), else from per-patient rows
            summed = concept_sum(*args, **kw, clip=parts_sum_clip(self.policy.clip_norm, dim)) if once else None
            rows = None if summed is not None else concept_rows(  # type: ignore[arg-type]
                *args, **kw, clip=None if once else self.policy.clip_norm)
        finally:
            for p in model.parameters():
                p.grad = None
        width = int(summed.shape[0]) if summed is not None else int(rows.shape[1])  # type: ignore[union-attr]
        if width != dim:  # z would be cut into the modules at the wrong places
            raise PrivacyError(f"Hospital {site!r}: its per-patient gradients have {width} coordinates but the "
                               f"model spec's shared modules have {dim}; nothing is sent this round. The model "
                               "and its module map disagree: build both from the derived model (this is a bug).")
        kw_step = {"policy": self.policy, "scale": scale, "batch": int(idx.numel()), "source": self.sampler}
        step = noised_clipped_sum(summed, **kw_step) if summed is not None \
            else (noised_rounded_sum if once else noised_sum)(rows, **kw_step)
        check_in_ring(step.z, scale=scale, bound=bound, site=site)
        parts, at = {}, 0
        for m in shared:
            parts[m.name], at = step.z[at:at + m.size], at + m.size
        modules.set_local(parts, scale=scale, weight=weight)
        self.last_batch = step.batch
        return commit_round(self.ledger, record)


def concept_distributed_trainer(*, privacy: object, n_train: int, site: str, state_dir: str | Path,
                                signer: Identity) -> ConceptDistributedTrainer:
    """The concept task's distributed-DP trainer from ``[privacy]`` (``mode = "distributed"``;
    σ, q, h and ``planned_rounds`` given, as the federation's ``[dp_policy]``); its ledger in
    ``state_dir``, signed by ``signer``.

    Raises:
        ConfigError: a value of the mechanism is missing.
    """
    policy = privacy_policy(privacy)
    ledger = DistributedLedger(state_dir, site=site, budget_epsilon=policy.max_epsilon, delta=policy.delta,
                               signer=signer)
    return ConceptDistributedTrainer(ledger=ledger, policy=policy, n_train=n_train)
