"""Patient-level local DP for :class:`~.task.ConceptTask` in the runtime (F-CMs appendix E.4).

The concept-model counterpart of NS-FL's :class:`clinograph.sdk.privacy.trainer.DPTrainer`,
configured from the same ``[privacy]`` section (:class:`clinograph.sdk.config.PrivacySection`)
and built on the same pieces: Poisson sampling at q = 1/⌈n/B⌉ from the CSPRNG
(:func:`~clinograph.sdk.privacy.trainer.poisson_indices`), σ calibrated over the planned
rounds × epochs × ⌈n/B⌉ steps (:func:`~clinograph.sdk.privacy.calibration.calibrate_noise_multiplier`),
and the hospital's persistent :class:`~clinograph.sdk.privacy.accountant.PrivacyLedger`
(checked before every round, committed after it; the entry goes into the signed report and the
server checks it against ``[dp_policy]``).

Each step is F-CMs eqs. (3)-(4) (:func:`.dp.dp_sgd_step`): the per-patient gradients of eq. (2)
over the modules the hospital trains (module-specific training, section 4.2.3; frozen modules
get no gradient and are not sent), each clipped to C, plus N(0, σ²C²), divided by the expected
batch ⌊q·n⌋, then Adam. Empty Poisson batches are stepped (noise only), never skipped.

Guarantees: the modules a hospital releases are (ε, δ)-DP with respect to adding or removing one
of its training patients (its row, its concept labels and its task label), ε composed over every
step of every round in the ledger. Does not cover: the DAG vote (graph-level, no patient
values; sent before training, outside the accountant), :meth:`ConceptTask.evaluate` /
``predict`` outputs, or the validation split. ``mode = "distributed"`` is
:mod:`.distributed_training` (one step a round, a Skellam share of the federation's noise);
:func:`concept_dp_trainer` builds either from ``[privacy]``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from clinograph.secure.dp import CsprngUniform

from clinograph.core.errors import ConfigError, PrivacyError
from clinograph.core.identity import Identity

from ..config import PrivacySection
from ..privacy.accountant import PrivacyLedger
from ..privacy.calibration import poisson_plan
from ..privacy.guard import refuse_coupled_plan
from ..privacy.trainer import ledger_and_sigma, poisson_indices
from ..training.optim import adam
from ..training.trainer import TrainOutcome
from .distributed_training import ConceptDistributedTrainer, concept_distributed_trainer
from .dp import dp_sgd_step, trainable_names


class ConceptDPTrainer:
    """DP-SGD rounds of one hospital's concept model, with its ledger.

    Args:
        ledger: this hospital's :class:`PrivacyLedger`.
        n_train: training patients (public: fixes q). noise_multiplier: σ. clip_norm: C.
        batch_size: expected Poisson batch size B.
    """

    def __init__(self, *, ledger: PrivacyLedger, n_train: int, noise_multiplier: float, clip_norm: float,
                 batch_size: int):
        self.ledger = ledger
        self.noise_multiplier, self.clip_norm = float(noise_multiplier), float(clip_norm)
        self.sample_rate, self.steps_per_epoch = poisson_plan(n_train=n_train, batch_size=batch_size)
        #: Opacus's normaliser (loss_reduction = "mean"), as DPTrainer: ⌊q·n⌋
        self.expected_batch = max(int(n_train * self.sample_rate), 1)
        self.sampler = CsprngUniform()
        self.accountant = ledger.make_accountant()
        self.last_empty_batches = 0
        #: None: the engine's CSPRNG noise (drawn several steps ahead, :class:`~..privacy.noise.NoiseRows`); tests swap it
        self._noise: Callable[[float, torch.Size, torch.dtype], torch.Tensor] | None = None
        #: the trainers' Adam (fused where the parameters allow, as the non-DP concept task's); tests swap in SGD
        self._optimizer: Callable[..., torch.optim.Optimizer] = adam

    def __repr__(self) -> str:
        return (f"ConceptDPTrainer(site={self.ledger.site!r}, sigma={self.noise_multiplier:g}, "
                f"q={self.sample_rate:.4g}, clip={self.clip_norm:g})")

    def planned_steps(self, epochs: int) -> int:
        return epochs * self.steps_per_epoch

    def train(self, *, model, batch: Callable[[torch.Tensor], object], labels: Mapping[str, torch.Tensor],
              train_idx: torch.Tensor, interventions: Callable[[Mapping[str, torch.Tensor]], dict], lr: float,
              supervised: set[str], has_task: bool, task: str, gamma: float, round_: int, epochs: int,
              plan_options: Mapping[str, float | int | str | bool]) -> TrainOutcome:
        """One round: ``epochs`` × ⌈n/B⌉ DP-SGD steps on the currently trainable modules."""
        refuse_coupled_plan(plan_options, site=self.ledger.site)
        self.accountant = self.ledger.begin_round(self.accountant, round_=round_, noise_multiplier=self.noise_multiplier,
                                                  sample_rate=self.sample_rate, steps=self.planned_steps(epochs))
        names = trainable_names(model)
        opt = self._optimizer([p for p in model.parameters() if p.requires_grad], lr=lr)
        n = int(len(train_idx))
        self.last_empty_batches = 0
        model.train()
        completed = False
        try:
            for _ in range(epochs * self.steps_per_epoch):
                idx = train_idx[poisson_indices(n, self.sample_rate, self.sampler)]
                if idx.numel() == 0:
                    self.last_empty_batches += 1
                lab = {v: y[idx] for v, y in labels.items()}
                dp_sgd_step(model, opt, names, batch(idx), lab, interventions(lab),
                            noise_multiplier=self.noise_multiplier, clip=self.clip_norm,
                            expected_batch=self.expected_batch, supervised=supervised, has_task=has_task, task=task,
                            gamma=gamma, noise=self._noise)
                self.accountant.step(noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate)
            completed = True
        finally:
            for p in model.parameters():
                p.grad = None
            if not completed:  # steps taken before a failure count
                self.ledger.commit_interrupted(self.accountant, round_=round_, noise_multiplier=self.noise_multiplier,
                                               sample_rate=self.sample_rate, clip_norm=self.clip_norm)
        entry = self.ledger.commit(round_=round_, history=self.accountant.history,
                                   noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate,
                                   clip_norm=self.clip_norm)
        return TrainOutcome(loss=0.0, used_similar_to=False, ledger=entry,
                            extras={"epsilon": entry.epsilon, "empty_batches": float(self.last_empty_batches)})


def concept_dp_trainer(*, privacy: PrivacySection, n_train: int, site: str, state_dir: str | Path,
                       signer: Identity) -> ConceptDPTrainer | ConceptDistributedTrainer:
    """The concept task's DP trainer from ``[privacy]``, chosen by ``mode``. ``local``: as NS-FL's
    ``dp_trainer_factory``, σ is ``noise_multiplier`` or calibrated to ``target_epsilon`` (default
    ``epsilon_budget``) over ``planned_rounds`` × ``planned_local_epochs`` epochs. ``distributed``:
    :func:`.distributed_training.concept_distributed_trainer` (σ, q, h and ``planned_rounds`` as
    the federation's ``[dp_policy]``).

    Raises:
        PrivacyError: DP not enabled, or σ to calibrate without ``planned_rounds``.
        ConfigError: adaptive clipping (not implemented for concept models); a distributed value missing.
    """
    if not privacy.enabled:
        raise PrivacyError("concept_dp_trainer needs [privacy] enabled = true.")
    if privacy.clipping != "flat":
        raise ConfigError(f"Hospital {site!r}: [privacy] clipping = {privacy.clipping!r} is not implemented for "
                          "concept tasks. Fix: set clipping = 'flat'.")
    if privacy.mode == "distributed":
        return concept_distributed_trainer(privacy=privacy, n_train=n_train, site=site, state_dir=state_dir,
                                           signer=signer)
    ledger, sigma = ledger_and_sigma(privacy, site=site, state_dir=state_dir, n_train=n_train, signer=signer)
    return ConceptDPTrainer(ledger=ledger, n_train=n_train, noise_multiplier=float(sigma),
                            clip_norm=privacy.clip_norm, batch_size=privacy.batch_size)
