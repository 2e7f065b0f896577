"""DPTrainer: patient-level DP-SGD on the NS-FL star model (issue 4, issue 14 item 6, privacy.md).

One training example per patient: its star (its own feature copies and values) as padded
dense tensors through :meth:`NSFLModel.forward_star`, built only from ``nn.Linear`` and
``nn.Embedding`` leaves, so per-patient gradients are exact (tested against a per-patient
loop). ``similar_to`` is never built; asking for it raises
:class:`~clinograph.core.errors.PrivacyError`.

DP-SGD (Abadi et al. 2016, Algorithm 1): Poisson sampling at q = 1/⌈n/B⌉ from a CSPRNG
(ChaCha20 under an ``os.urandom`` key, :class:`~clinograph.secure.hazmat.discrete_noise.CsprngUniform`;
never torch's or numpy's generators), per-patient clipping to C, Gaussian noise σ·C (CSPRNG,
:mod:`.noise`), the noised sum divided by the expected batch ⌊q·n⌋, then Adam; empty Poisson
batches are stepped (noise only), never skipped.

Per-patient gradients, clipping and the step: the one engine of every local-DP task
(:mod:`.per_patient`, :func:`~.per_patient.dp_sgd_step`); adaptive clipping on it
(:class:`~.adaptive.AdaptiveClip`). Opacus's ``GradSampleModule`` path (``grad_sample_mode =
"hooks"``/``"ew"``) was removed: the engine covers every DP model and is faster
(benchmarks/dp_step); Opacus stays for the accountants.

Lifecycle: everything is built once per hospital run, on the first round -- the sampler, the
per-patient engine, the optimizer, the adaptive clip and the accountant -- and carried across rounds (rebuilt only if a different model object comes in;
:attr:`DPTrainer.builds` counts it). The accountant steps once per DP-SGD step and is
checked against the hospital's ledger before every round; a round whose projected ε passes the
budget is refused before training. The optimizer object is kept, its moments are reset at
the start of each round (the round starts from the newly loaded global model, as before).
The outcome carries the signed-report :class:`LedgerEntry` (σ, q, steps, C, accountant, ε, δ).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from clinograph.secure.dp import CsprngUniform, bernoulli
from torch.nn import functional as F  # noqa: N812
from torch.utils.data import TensorDataset

from clinograph.core.errors import PrivacyError
from clinograph.core.identity import Identity

from ..config import HospitalConfig, PrivacySection
from ..graph.star import star_batch
from ..ingest.table import PatientTable
from ..model.nsfl import NSFLModel
from ..training.local import TrainConfig, predict
from ..training.optim import adam
from ..training.trainer import TrainOutcome
from .accountant import PrivacyLedger
from .adaptive import ADAPTIVE_DEFAULTS, AdaptiveClip
from .calibration import calibrate_noise_multiplier, poisson_plan
from .guard import refuse_coupled_plan, refuse_coupled_training
from .per_patient import PerPatientClipper, dp_sgd_step, star_probe

GRAD_SAMPLE_MODES = ("star",)


def star_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean BCE that is 0 (not NaN) on an empty Poisson batch (the non-DP step's loss on the star path)."""
    return F.binary_cross_entropy_with_logits(logits, y, reduction="sum") / max(int(y.shape[0]), 1)


def poisson_indices(n: int, sample_rate: float, source: CsprngUniform) -> torch.Tensor:
    """Positions in [0, n) each kept independently with probability q (CSPRNG coins, one per patient)."""
    return torch.from_numpy(np.flatnonzero(bernoulli(sample_rate, n, source=source)))


def unused_star_parameters(model: NSFLModel) -> list[str]:
    """Parameters the star path never touches (``similar_to`` attention, the uniform layer-1
    ``has_feature`` attention): frozen under DP (a parameter the batch never reaches would get noise
    alone). Found by a probe on a synthetic star (no patient data), on the *structural* star path
    (the GNN computed, :meth:`~clinograph.sdk.model.nsfl.NSFLModel.computing_gnn`): the same set with
    ``[model] deep`` on or off, so the released coordinates (the distributed step's columns) and the
    server's noise test keep their dimension; :func:`skipped_star_parameters` are the ones deep =
    false does not compute."""
    return _ungraded(model, structural=True)


def skipped_star_parameters(model: NSFLModel) -> list[str]:
    """Parameters on the structural star path that ``[model] deep = false`` does not compute: the GNN
    (no path runs it) and the head's weight (it reads g · h_p = 0, so its gradient is exactly zero).
    Under DP they are frozen -- not in the per-patient gradient, so a step costs the wide path alone --
    yet stay released: their delta is 0 (local DP: they do not move; distributed DP: zero columns of
    the sum that still get the hospital's noise share, so d and the server's noise test are unchanged).
    Empty with deep = true."""
    if not getattr(model, "skip_gnn", False):
        return []
    unused = set(_ungraded(model, structural=True))
    off = set(_ungraded(model, structural=False)) | {"head.weight"}
    return [n for n, p in model.named_parameters() if p.requires_grad and n in off and n not in unused]


def _ungraded(model: NSFLModel, *, structural: bool) -> list[str]:
    """Trainable parameters a synthetic star's backward gives no gradient (``structural``: the GNN computed)."""
    k = model.n_features
    fi = torch.arange(k).unsqueeze(0)
    model.zero_grad(set_to_none=True)
    computing = model.computing_gnn() if structural and hasattr(model, "computing_gnn") else contextlib.nullcontext()
    with computing:
        model.forward_star(fi, torch.ones(1, k), torch.ones(1, k, dtype=torch.bool)).sum().backward()
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    model.zero_grad(set_to_none=True)
    return unused


class DPTrainer:
    """Trainer protocol (:mod:`clinograph.sdk.training.trainer`) with patient-level DP.

    Guarantees: the released model parameters are (ε, δ)-DP with respect to adding or removing
    one patient's star at this hospital, ε composed over every step of every round recorded
    in ``ledger``. Does not hide which hospitals took part, nor protect :meth:`predict`'s
    outputs or anything released outside the ledger (docs/privacy.md).

    Args:
        table: the hospital's patients. train_idx: the patients it trains on.
        ledger: this hospital's :class:`PrivacyLedger` (budget, δ, accountant, state dir).
        noise_multiplier: σ. clip_norm: C (flat clipping; the adaptive clip's maximum otherwise).
        batch_size: expected Poisson batch size B. train_config: optimiser settings (Adam lr, seed).
        clipping: ``"flat"`` or ``"adaptive"`` (Andrew et al. 2021, :class:`~.adaptive.AdaptiveClip`).
        adaptive: keyword arguments of :class:`~.adaptive.AdaptiveClip`. k_similar: must be 0.
        grad_sample_mode: ``"star"``, the per-patient engine (the only one).
    """

    def __init__(self, table: PatientTable, *, train_idx: np.ndarray, ledger: PrivacyLedger, noise_multiplier: float,
                 clip_norm: float, batch_size: int, train_config: TrainConfig, clipping: str = "flat",
                 adaptive: dict[str, float] | None = None, k_similar: int = 0, optimizer: str = "adam",
                 lr: float | None = None, grad_sample_mode: str = "star"):
        refuse_coupled_training(k_similar=k_similar, site=ledger.site)
        if clipping not in ("flat", "adaptive"):
            raise PrivacyError(f"Unknown clipping {clipping!r}. Registered: flat, adaptive.")
        if optimizer not in ("adam", "sgd"):
            raise PrivacyError(f"Unknown optimizer {optimizer!r}. Registered: adam, sgd.")
        if grad_sample_mode not in GRAD_SAMPLE_MODES:
            raise PrivacyError(f"grad_sample_mode {grad_sample_mode!r} is not available: every DP task uses the "
                               "per-patient engine ('star'; Opacus's hooks/ew path was removed). Registered: "
                               f"{', '.join(GRAD_SAMPLE_MODES)}.")
        default_factor = type(train_config).model_fields["mask_lr_factor"].default
        # a candidate's config is re-validated from a full dump (every field "set"): warn on a changed value only
        if "mask_lr_factor" in train_config.model_fields_set and train_config.mask_lr_factor != default_factor:
            warnings.warn(f"Hospital {ledger.site!r}: [training] mask_lr_factor applies to non-DP training only; under "
                          "local DP the feature masks m_f learn at the base lr (the setting the DP presets were tuned "
                          "with). Remove mask_lr_factor from this hospital's config to silence this.", UserWarning,
                          stacklevel=2)
        self.grad_sample_mode = grad_sample_mode
        self.optimizer, self.lr = optimizer, float(lr if lr is not None else train_config.lr)
        self.table, self.ledger = table, ledger
        self.train_idx = np.asarray(train_idx)
        self.noise_multiplier, self.clip_norm, self.batch_size = float(noise_multiplier), float(clip_norm), batch_size
        self.config, self.clipping, self.adaptive = train_config, clipping, dict(adaptive or {})
        #: the adaptive clip bound, carried across rounds (None: flat clipping at clip_norm)
        self.adaptive_clip = AdaptiveClip(noise_multiplier=self.noise_multiplier, clip=self.clip_norm,
                                          **{**ADAPTIVE_DEFAULTS, "max_clipbound": self.clip_norm,
                                             **self.adaptive}) if clipping == "adaptive" else None
        self.stars = star_batch(table, k_similar=0)
        self.sample_rate, self.steps_per_epoch = poisson_plan(n_train=len(self.train_idx), batch_size=batch_size)
        #: Opacus's normaliser (loss_reduction = "mean"): the noised sum is divided by ⌊q·n⌋
        self.expected_batch = max(int(len(self.train_idx) * self.sample_rate), 1)
        idx = torch.as_tensor(self.train_idx, dtype=torch.long)
        s = self.stars
        #: one row a patient (sdk/training/temporal.py swaps in snapshot sequences)
        self.dataset = TensorDataset(s.feature_index[idx], s.values[idx], s.mask[idx], s.labels[idx])
        self.last_empty_batches = 0
        self.last_timings: dict[str, object] = {}
        #: Poisson coins for the whole run: ChaCha20 keystream under a fresh os.urandom key
        self.sampler = CsprngUniform()
        #: the accountant, carried across rounds (restored from the ledger once, checked every round)
        self.accountant = ledger.make_accountant()
        #: how many times the per-patient engine / optimizer were built (1 for a whole run)
        self.builds = 0
        self._model: NSFLModel | None = None
        self._frozen_names: set[str] = set()

    def planned_steps(self, epochs: int) -> int:
        """Steps one round of ``epochs`` epochs takes (⌈n/B⌉ Poisson batches an epoch, as Opacus)."""
        return epochs * self.steps_per_epoch

    # -- built once per run ---------------------------------------------------------------------
    def _build(self, model: NSFLModel) -> None:
        """The per-patient engine and the optimizer, for ``model``."""
        # off the star path, and (deep = false) the GNN the star path skips: no per-patient gradient,
        # delta 0 (skipped_star_parameters)
        self._frozen_names = set(unused_star_parameters(model)) | set(skipped_star_parameters(model))
        frozen = self._freeze(model)
        try:
            trainable = [p for p in model.parameters() if p.requires_grad]
            # the wide rows at wide_lr_factor × lr, as in non-DP training: a per-group step size is
            # post-processing of the noised gradient, so the guarantee is unchanged
            wide = {id(p) for n, p in model.named_parameters() if p.requires_grad and n.startswith("linear.")}
            groups = [{"params": [p for p in trainable if id(p) not in wide]},
                      {"params": [p for p in trainable if id(p) in wide], "lr": self.lr * self.config.wide_lr_factor}]
            groups = [g for g in groups if g["params"]]
            self._opt = self._optimizer(groups)
            fi, x, m = star_probe(model.n_features, row_shape=tuple(self.dataset.tensors[0].shape[1:]))
            self._clipper = self._engine(model, (fi, x.to(trainable[0].dtype), m))
        finally:
            self._unfreeze(frozen)
        self._model = model
        self.builds += 1

    def _optimizer(self, groups: list) -> torch.optim.Optimizer:
        return (adam(groups, lr=self.lr, weight_decay=self.config.weight_decay)
                if self.optimizer == "adam" else
                torch.optim.SGD(groups, lr=self.lr, momentum=0.9, weight_decay=self.config.weight_decay))

    def _engine(self, model: NSFLModel, probe: tuple[torch.Tensor, ...]) -> PerPatientClipper:
        """The per-patient engine on this task's objective (the survival trainer swaps in its own)."""
        return PerPatientClipper(model, probe=probe)

    def _freeze(self, model: NSFLModel) -> list[torch.nn.Parameter]:
        frozen = [p for n, p in model.named_parameters() if n in self._frozen_names and p.requires_grad]
        for p in frozen:
            p.requires_grad_(False)
        return frozen

    @staticmethod
    def _unfreeze(frozen: list[torch.nn.Parameter]) -> None:
        for p in frozen:
            p.requires_grad_(True)

    # -- one DP-SGD step ---------------------------------------------------------------------------
    def _star_step(self, *rows: torch.Tensor) -> float | None:
        """One step on a Poisson batch's rows: the model's inputs (feature index, values, mask, and
        whatever else a task's objective reads, e.g. the modality signals), then the labels."""
        inputs, y = rows[:-1], rows[-1]
        if self.adaptive_clip is not None:
            out = self.adaptive_clip.step(self._clipper, self._opt, inputs, labels=y,
                                          expected_batch=self.expected_batch)
        else:
            out = dp_sgd_step(self._clipper, self._opt, inputs, labels=y, noise_multiplier=self.noise_multiplier,
                              clip_norm=self.clip_norm, expected_batch=self.expected_batch)
        return out.loss if y.shape[0] else None

    def train(self, model: NSFLModel, *, round_: int, epochs: int,
              plan_options: dict[str, float | int | str | bool]) -> TrainOutcome:
        t0 = time.perf_counter()
        refuse_coupled_plan(plan_options, site=self.ledger.site)
        self.accountant = self.ledger.begin_round(self.accountant, round_=round_, noise_multiplier=self.noise_multiplier,
                                                  sample_rate=self.sample_rate, steps=self.planned_steps(epochs))
        if self._model is not model:
            self._build(model)
        frozen = self._freeze(model)
        model.train()
        for state in self._opt.state.values():  # a new round starts from the newly loaded global model
            state.clear()
        step = self._star_step
        rows = self.dataset.tensors  # the model's inputs, then the labels: one row a patient
        n = int(rows[-1].shape[0])
        losses: list[float] = []
        self.last_empty_batches = 0
        epoch_seconds: list[float] = []
        t_setup = time.perf_counter() - t0
        completed = False
        try:
            for _ in range(epochs):
                t_epoch = time.perf_counter()
                for _ in range(self.steps_per_epoch):
                    idx = poisson_indices(n, self.sample_rate, self.sampler)
                    if idx.numel() == 0:  # an empty Poisson batch is stepped all the same (noise only)
                        self.last_empty_batches += 1
                    loss = step(*(r[idx] for r in rows))
                    self.accountant.step(noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate)
                    if loss is not None:
                        losses.append(loss)
                epoch_seconds.append(time.perf_counter() - t_epoch)
            completed = True
        finally:
            self._unfreeze(frozen)
            for p in model.parameters():
                p.grad = None
            if not completed:
                self.ledger.commit_interrupted(self.accountant, round_=round_, noise_multiplier=self.noise_multiplier,
                                               sample_rate=self.sample_rate, clip_norm=self.clip_norm)
        clip = self.adaptive_clip.max_clip if self.adaptive_clip is not None else self.clip_norm
        t_acc = time.perf_counter()
        entry = self.ledger.commit(round_=round_, history=self.accountant.history,
                                   noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate, clip_norm=clip)
        self.last_timings = {"setup_and_check_seconds": t_setup, "epoch_seconds": epoch_seconds,
                             "commit_seconds": time.perf_counter() - t_acc}
        return TrainOutcome(loss=float(np.mean(losses)) if losses else 0.0, used_similar_to=False, ledger=entry,
                            extras={"epsilon": entry.epsilon, "empty_batches": float(self.last_empty_batches)})

    def predict(self, model: NSFLModel) -> np.ndarray:
        """Probabilities for every patient (star path; local use, not a release)."""
        return predict(model, self.stars)

    def __repr__(self) -> str:
        return (f"DPTrainer(site={self.ledger.site!r}, patients={len(self.train_idx)}, sigma={self.noise_multiplier:g}, "
                f"q={self.sample_rate:.4g}, clip={self.clip_norm:g}, clipping={self.clipping!r}, "
                f"grad_sample_mode={self.grad_sample_mode!r})")


def ledger_and_sigma(privacy: PrivacySection, *, site: str, state_dir: str | Path, n_train: int,
                     signer: Identity) -> tuple[PrivacyLedger, float]:
    """A hospital's ledger (in ``state_dir``, signed by ``signer``) and σ: ``noise_multiplier``
    or, if unset, calibrated to ``target_epsilon`` (default ``epsilon_budget``) over
    ``planned_rounds`` × ``planned_local_epochs`` epochs of ⌈n/B⌉ Poisson steps. Every local-DP
    trainer (NS-FL, survival, concept models) starts here.

    Raises:
        PrivacyError: σ must be calibrated but ``planned_rounds`` is unset.
    """
    ledger = PrivacyLedger(Path(state_dir), site=site, budget_epsilon=privacy.epsilon_budget, delta=privacy.delta,
                           accountant=privacy.accountant, signer=signer)  # the ledger file is signed
    sigma = privacy.noise_multiplier
    from .selection import selection_plan

    plan = selection_plan(privacy, n_train=n_train)  # validation releases planned: σ calibrated beside them
    if plan is not None:
        sigma = plan.noise_multiplier
    elif sigma is None:
        if privacy.planned_rounds is None:
            raise PrivacyError(f"Hospital {site!r}: [privacy] needs noise_multiplier, or planned_rounds to calibrate "
                               "σ to the ε budget over the run. Set one of them in the hospital config.")
        q, steps_epoch = poisson_plan(n_train=n_train, batch_size=privacy.batch_size)
        epochs = privacy.planned_rounds * (privacy.planned_local_epochs or 1)
        sigma = calibrate_noise_multiplier(target_epsilon=privacy.target_epsilon or privacy.epsilon_budget,
                                           delta=privacy.delta, sample_rate=q, steps=epochs * steps_epoch,
                                           accountant=privacy.accountant)
    return ledger, float(sigma)


def dp_trainer_factory(*, table: PatientTable, train_idx: np.ndarray, config: HospitalConfig, site: str,
                       state_dir: str | Path, signer: Identity,
                       trainer_cls: type[DPTrainer] | None = None, **extra) -> DPTrainer:
    """The DP trainer of a hospital built from its :class:`~clinograph.sdk.config.HospitalConfig`.

    σ and the ledger as :func:`ledger_and_sigma` (the ledger lives in ``state_dir``, one folder
    per hospital, signed by ``signer``, the hospital's identity). ``trainer_cls`` (default :class:`DPTrainer`) and ``extra`` keyword arguments
    build a subclass on the same settings (the survival head's trainer).

    Raises:
        PrivacyError: DP is not enabled, ``[graph] k_similar > 0``, or σ must be calibrated
            but ``planned_rounds`` is unset.
    """
    priv = config.privacy
    if not priv.enabled:
        raise PrivacyError("dp_trainer_factory needs [privacy] enabled = true (it would otherwise claim a DP "
                           "guarantee the federation's policy does not check).")
    refuse_coupled_training(k_similar=config.graph.k_similar, site=site)
    ledger, sigma = ledger_and_sigma(priv, site=site, state_dir=state_dir, n_train=len(train_idx), signer=signer)
    adaptive = {k: getattr(priv, k) for k in ("target_unclipped_quantile", "clipbound_learning_rate", "max_clipbound",
                                              "min_clipbound", "unclipped_num_std")}
    return (trainer_cls or DPTrainer)(table, train_idx=train_idx, ledger=ledger, noise_multiplier=sigma,
                                      clip_norm=priv.clip_norm, batch_size=priv.batch_size,
                                      train_config=config.training, clipping=priv.clipping,
                                      adaptive=adaptive if priv.clipping == "adaptive" else None,
                                      grad_sample_mode=priv.grad_sample_mode, **extra)
