"""Distributed DP as a trainer: what an NS-FL task trains with under ``[privacy] mode = "distributed"``.

Implements NS-FL eq. (6) (FedSGD with a server learning rate) as one DP-SGD step a round over
the federation's patients (:mod:`.distributed`): each hospital's "local model" is θ − z/(s·w),
where z is its noisy integer sum, s the masked ring's scale and w = q·n its expected batch, so
:class:`~clinograph.sdk.federation.client.HospitalClient`'s weighted delta w·(θ − θ_local) is
z/s and the masked mode encodes z exactly. The server's FedSGD then applies
θ ← θ − η·Σ_k z_k / (s·Σ_k q·n_k).

:class:`DistributedTrainer` wraps the task's plain trainer and takes its rows -- stars, each
patient's snapshot sequence (temporal), a patient's star and its signals (modalities) -- and its
predictions; the task supplies the objective's labels (0/1, or the hazard likelihood's [s | e]
rows) and engine. Everything else -- rounds, validation, scoring, calibration, candidates,
checkpoints -- is the task's own (:class:`~clinograph.sdk.federation.nsfl_task.NSFLTask`), the
same in every ``[privacy]`` mode.

Private model choice (``[selection] enabled = true``; issue 30): the task scores the global model
on its validation patients and hands their rows (a·min(ℓ_j, B)/B, a), a = C/√2
(:func:`~.distributed.validation_rows`), to :meth:`DistributedTrainer.train`: two more
coordinates of the same noisy integer sum (module ``metric/validation``), each row of L2 norm at
most C -- a patient's whole contribution, like a training patient's clipped gradient (every
patient is in one split). The Skellam share covers these coordinates too, so every coordinate of
the sum carries the federation's noise, and the accountant is unchanged: the dimension it accounts
over already counts ``metric/validation`` (the spec's shared modules). Full-batch schedules only
(q = 1): the validation patients are in every round, which a subsampled accountant would not
cover. The run's evaluation-only scoring round sends the two coordinates alone (no gradient rows)
and is accounted as one more round (:func:`clinograph.sdk.federation.candidates.distributed_rounds`).

The personal feature masks are frozen at their initial value (no personal training under
distributed DP: it would use the patients outside the accountant). ``similar_to`` is never built
(stars only), as in local DP.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch
from clinograph.secure.dp import DistributedPolicy

from clinograph.core.errors import PrivacyError
from clinograph.core.identity import Identity
from clinograph.core.spec import ModuleKind

from ..config import HospitalConfig
from ..model.modalities import ModalStarBatch
from ..model.modules import ModuleMap
from ..model.nsfl import NSFLModel
from ..model.nsfl_modules import SELECTION_MODULE
from ..training.trainer import Trainer, TrainOutcome
from .distributed import Columns, DistributedLedger, columns_clipper, distributed_step
from .distributed_round import ExactLocal, check_in_ring, commit_round, open_round, privacy_policy
from .modalities import modal_engine, modal_rows
from .per_patient import PerPatientClipper
from .survival import HazardClipper


class DistributedTrainer:
    """Trainer protocol (:mod:`clinograph.sdk.training.trainer`) in distributed-DP mode, around
    ``inner``, the task's plain trainer (module docstring).

    Guarantees: each round's released sum is the federation's distributed-DP mechanism over this
    hospital's patients (:mod:`.distributed`), recorded in ``ledger`` before anything leaves; a
    round past the budget or off the policy is refused before it is scored or trained.
    """

    def __init__(self, inner: Trainer, *, model: NSFLModel, modules: ModuleMap, labels: torch.Tensor,
                 engine: Callable[..., PerPatientClipper], policy: DistributedPolicy, ledger: DistributedLedger):
        self.inner, self.policy, self.ledger, self.labels = inner, policy, ledger, labels
        self.stars = inner.stars  # type: ignore[attr-defined]
        self.site: str = ledger.site
        #: the task's module map, reading the exact local model during a round
        self.modules = ExactLocal(modules)
        self.columns = Columns.of(model, self.modules, self.modules.names(ModuleKind.SHARED))
        #: the dimension the ledger accounts over: every coordinate the model spec releases (its
        #: shared modules), the server's own number. The noised columns are a subset (similar_to
        #: and metric/validation are off the star path), so the sensitivity bound Δ2 <= C·s + sqrt(d)
        #: at this d is valid, if slightly looser (the server refuses a share accounted over fewer).
        self.accounted_dim = sum(m.size for m in self.modules.spec().shared)
        #: the per-patient engine on the task's objective, built once for the whole run (not per round)
        self.clipper = columns_clipper(model, self.columns, row_shape=tuple(self.stars.feature_index.shape[1:]),
                                       engine=engine)
        self._train = torch.as_tensor(np.asarray(inner.train_idx), dtype=torch.long)  # type: ignore[attr-defined]
        self.last_batch = 0
        self._round: tuple[dict, float, float] | None = None
        self._sends = (True, False)  # (the gradient columns, metric/validation) of this round's z

    def __repr__(self) -> str:
        return (f"DistributedTrainer(site={self.site!r}, sigma={self.policy.noise_multiplier:g}, "
                f"q={self.policy.sample_rate:g}, clip={self.policy.clip_norm:g}, h={self.policy.min_honest})")

    @property
    def num_samples(self) -> float:
        """The expected Poisson batch q·n (the weight FedSGD divides by)."""
        return self.policy.sample_rate * len(self._train)

    def predict(self, model: NSFLModel) -> np.ndarray:
        """The plain trainer's predictions (local use, not a release)."""
        return self.inner.predict(model)

    def begin_round(self, *, round_: int, epochs: int, plan_options: Mapping[str, float | int | str | bool]) -> None:
        """Check the round's plan and budget before anything is scored or trained (PrivacyError,
        PrivacyBudgetExceeded); :meth:`train` then runs the round checked."""
        self._round = open_round(self.ledger, self.policy, plan_options, round_=round_, epochs=epochs,
                                 weight=self.num_samples, dim=self.accounted_dim)

    def train(self, model: NSFLModel, *, round_: int, epochs: int, plan_options: Mapping[str, float | int | str | bool],
              extra_rows: np.ndarray | None = None, evaluate_only: bool = False) -> TrainOutcome:
        """The round's noisy integer sum z over the training patients' clipped gradients and
        ``extra_rows`` (the validation patients', [m, 2]; :func:`~.distributed.validation_rows`),
        left in ``modules`` as the exact local model; ``evaluate_only``: the extra rows alone."""
        if self._round is None or self._round[0]["round"] != round_:
            self.begin_round(round_=round_, epochs=epochs, plan_options=plan_options)
        (record, scale, bound), self._round = self._round, None  # type: ignore[misc]
        if evaluate_only and extra_rows is None:
            return TrainOutcome(loss=float("nan"), used_similar_to=False, extras={"evaluate_only": 1.0})
        t, s = self._train, self.stars
        rows = modal_rows(s, t) if isinstance(s, ModalStarBatch) else (s.feature_index[t], s.values[t], s.mask[t])
        step = distributed_step(model, self.columns, policy=self.policy, scale=scale, inputs=rows,
                                labels=self.labels[t], clipper=self.clipper, extra_rows=extra_rows,
                                train=not evaluate_only)
        check_in_ring(step.z, scale=scale, bound=bound, site=self.site)
        self._sends = (not evaluate_only, extra_rows is not None)
        self._set_local(step.z, scale=scale, weight=self.num_samples)
        self.last_batch = step.batch
        return commit_round(self.ledger, record)

    def _set_local(self, z: np.ndarray, *, scale: float, weight: float) -> None:
        """θ_local = θ − z/(s·w) in float64, checked to give z back exactly through
        HospitalClient's delta w·(θ − θ_local) and the masked encoder's rint(x·s)."""
        z = z.astype(np.float64)
        columns, metric = self._sends
        parts = self.columns.split(z[:self.columns.dim]) if columns else {}
        if metric:
            parts[SELECTION_MODULE] = z[len(z) - 2:]
        self.modules.set_local(parts, scale=scale, weight=weight)


def distributed_trainer(inner: Trainer, *, model: NSFLModel, modules: ModuleMap, config: HospitalConfig,
                        state_dir: Path, signer: Identity, policy: DistributedPolicy | None = None) -> DistributedTrainer:
    """The distributed-DP trainer of a hospital around its plain trainer ``inner`` (a survival
    trainer's ``s``, ``e`` give the hazard likelihood's labels; modal stars the modality engine).
    ``policy``: the federation's (default :func:`~.distributed_round.privacy_policy` of the
    hospital's own ``[privacy]``; the server checks every round that they agree).

    Raises:
        PrivacyError: ``[graph] k_similar > 0``, or ``[privacy]`` differs from ``policy``.
        ConfigError: ``[privacy]`` lacks a distributed setting.
    """
    site, priv = inner.table.site, config.privacy  # type: ignore[attr-defined]
    if config.graph.k_similar:
        raise PrivacyError(f"Hospital {site!r}: [graph] k_similar = {config.graph.k_similar} couples "
                           "patients; distributed DP trains on stars only. Set k_similar = 0.")
    policy = policy or privacy_policy(priv)
    mine = (priv.mechanism, priv.noise_multiplier, priv.clip_norm, priv.sample_rate, priv.min_honest, priv.delta)
    theirs = (policy.mechanism, policy.noise_multiplier, policy.clip_norm, policy.sample_rate, policy.min_honest,
              policy.delta)
    if mine != theirs:
        raise PrivacyError(f"Hospital {site!r}: its [privacy] (mechanism, σ, C, q, h, δ) = {mine} differs "
                           f"from the federation's [dp_policy] {theirs}. Copy the federation's values.")
    stars = inner.stars  # type: ignore[attr-defined]
    engine: Callable[..., PerPatientClipper] = modal_engine if isinstance(stars, ModalStarBatch) else PerPatientClipper
    labels = stars.labels
    if config.target.kind == "survival":  # the hazard likelihood's [s | e] rows
        s, e = inner.s, inner.e  # type: ignore[attr-defined]
        labels, engine = torch.as_tensor(np.concatenate([s, e], axis=1), dtype=torch.float32), HazardClipper
    ledger = DistributedLedger(state_dir, site=site, budget_epsilon=priv.epsilon_budget, delta=priv.delta,
                               signer=signer)
    return DistributedTrainer(inner, model=model, modules=modules, labels=labels, engine=engine, policy=policy,
                              ledger=ledger)
