"""DPTrainer: patient-level DP-SGD on the NS-FL star model (issue 4, privacy.md).

One training example per patient: its star (its own feature copies and values) as padded
dense tensors through :meth:`NSFLModel.forward_star`, built only from ``nn.Linear`` and
``nn.Embedding`` leaves, so Opacus's hooks-mode per-sample gradients are exact (tested
against a per-patient loop). ``similar_to`` is never built; asking for it raises
:class:`~clinograph.secure.errors.PrivacyError`.

Per round: restore the accountant's history from the hospital's ledger, refuse the round if
its projected ε passes the budget, then DP-SGD (Abadi et al. 2016): Poisson sampling at
q = 1/⌈n/B⌉, per-patient clipping to C, Gaussian noise σ·C (CSPRNG, :mod:`.noise`), Adam on
the noised mean; empty Poisson batches are stepped (noise only), never skipped. The outcome
carries the signed-report :class:`LedgerEntry` (σ, q, steps, C, accountant, ε so far, δ).
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np
import torch
from clinograph.secure.errors import PrivacyError
from clinograph.secure.identity import Identity
from torch.nn import functional as F  # noqa: N812
from torch.utils.data import DataLoader, TensorDataset

from ..config import HospitalConfig
from ..graph.star import star_batch
from ..ingest.table import PatientTable
from ..model.nsfl import NSFLModel
from ..training.local import TrainConfig, predict
from ..training.trainer import TrainOutcome
from .accountant import PrivacyLedger, normalise
from .calibration import calibrate_noise_multiplier, poisson_plan
from .guard import refuse_coupled_plan, refuse_coupled_training
from .noise import install_secure_noise, os_seeded_generator


def star_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean BCE that is 0 (not NaN) on an empty Poisson batch; Opacus's ``loss_reduction="mean"``
    rescales per-sample gradients by the actual batch size, so per-patient terms are exact."""
    return F.binary_cross_entropy_with_logits(logits, y, reduction="sum") / max(int(y.shape[0]), 1)


def unused_star_parameters(model: NSFLModel) -> list[str]:
    """Parameters the star path never touches (``similar_to`` attention, the uniform layer-1
    ``has_feature`` attention): frozen under DP, since Opacus needs a per-sample gradient for every
    trainable parameter. Found by a probe on a synthetic star (no patient data)."""
    k = model.n_features
    fi = torch.arange(k).unsqueeze(0)
    model.zero_grad(set_to_none=True)
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
        clipping: ``"flat"`` or ``"adaptive"`` (Andrew et al. 2021, Opacus ``AdaClipDPOptimizer``).
        adaptive: keyword arguments of Opacus's adaptive clipping. k_similar: must be 0.
    """

    def __init__(self, table: PatientTable, *, train_idx: np.ndarray, ledger: PrivacyLedger, noise_multiplier: float,
                 clip_norm: float, batch_size: int, train_config: TrainConfig, clipping: str = "flat",
                 adaptive: dict[str, float] | None = None, k_similar: int = 0, optimizer: str = "adam",
                 lr: float | None = None, grad_sample_mode: str = "hooks"):
        refuse_coupled_training(k_similar=k_similar, site=ledger.site)
        if clipping not in ("flat", "adaptive"):
            raise PrivacyError(f"Unknown clipping {clipping!r}. Registered: flat, adaptive.")
        if optimizer not in ("adam", "sgd"):
            raise PrivacyError(f"Unknown optimizer {optimizer!r}. Registered: adam, sgd.")
        if grad_sample_mode not in ("hooks", "ew"):
            raise PrivacyError(f"Unknown grad_sample_mode {grad_sample_mode!r}. Registered: hooks, ew "
                               "(both checked against a per-patient loop in tests).")
        self.grad_sample_mode = grad_sample_mode
        self.optimizer, self.lr = optimizer, float(lr if lr is not None else train_config.lr)
        self.table, self.ledger = table, ledger
        self.train_idx = np.asarray(train_idx)
        self.noise_multiplier, self.clip_norm, self.batch_size = float(noise_multiplier), float(clip_norm), batch_size
        self.config, self.clipping, self.adaptive = train_config, clipping, dict(adaptive or {})
        self.stars = star_batch(table, k_similar=0)
        self.sample_rate, self.steps_per_epoch = poisson_plan(n_train=len(self.train_idx), batch_size=batch_size)
        idx = torch.as_tensor(self.train_idx, dtype=torch.long)
        s = self.stars
        self.last_empty_batches = 0
        self.last_timings: dict[str, object] = {}
        self.dataset = TensorDataset(s.feature_index[idx], s.values[idx], s.mask[idx], s.labels[idx])

    def planned_steps(self, epochs: int) -> int:
        """Steps one round of ``epochs`` epochs takes (Opacus: ⌈n/B⌉ Poisson batches an epoch)."""
        return epochs * self.steps_per_epoch

    def train(self, model: NSFLModel, *, round_: int, epochs: int,
              plan_options: dict[str, float | int | str | bool]) -> TrainOutcome:
        from opacus import PrivacyEngine

        t0 = time.perf_counter()
        refuse_coupled_plan(plan_options, site=self.ledger.site)
        self.ledger.check_round(round_=round_, noise_multiplier=self.noise_multiplier,
                                sample_rate=self.sample_rate, steps=self.planned_steps(epochs))
        unused = set(unused_star_parameters(model))
        frozen = [p for n, p in model.named_parameters() if n in unused]
        for p in frozen:
            p.requires_grad_(False)
        model.train()  # Opacus validates training mode
        with warnings.catch_warnings():  # we install our own noise source below (see .noise)
            warnings.filterwarnings("ignore", message="Secure RNG turned off")
            engine = PrivacyEngine(accountant=self.ledger.accountant)
        # Restored before every round through Opacus's own interface (history + mechanism checked).
        engine.accountant.load_state_dict({"history": list(self.ledger.history),
                                           "mechanism": engine.accountant.mechanism()})
        engine.secure_rng = os_seeded_generator()  # Poisson sampling: OS-seeded, not the seeded global RNG
        loader = DataLoader(self.dataset, batch_size=self.batch_size)
        trainable = [p for p in model.parameters() if p.requires_grad]
        opt = (torch.optim.Adam(trainable, lr=self.lr, weight_decay=self.config.weight_decay) if self.optimizer == "adam"
               else torch.optim.SGD(trainable, lr=self.lr, momentum=0.9, weight_decay=self.config.weight_decay))
        extra: dict[str, float] = {}
        if self.clipping == "adaptive":
            extra = {"target_unclipped_quantile": 0.5, "clipbound_learning_rate": 0.2, "max_clipbound": self.clip_norm,
                     "min_clipbound": 0.01, "unclipped_num_std": 10.0, **self.adaptive}
        gsm, dp_opt, dp_loader = engine.make_private(
            module=model, optimizer=opt, data_loader=loader, noise_multiplier=self.noise_multiplier,
            max_grad_norm=self.clip_norm, poisson_sampling=True, clipping=self.clipping, grad_sample_mode=self.grad_sample_mode,
            noise_generator=os_seeded_generator(), **extra)
        if self.clipping == "flat":
            install_secure_noise(dp_opt)
        losses: list[float] = []
        self.last_empty_batches = 0
        epoch_seconds: list[float] = []
        t_setup = time.perf_counter() - t0
        completed = False
        try:
            with warnings.catch_warnings():  # Opacus's hooks on a model whose inputs need no grad
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                for _ in range(epochs):
                    t_epoch = time.perf_counter()
                    for fi, x, m, y in dp_loader:
                        dp_opt.zero_grad(set_to_none=True)
                        if y.shape[0] == 0:  # an empty Poisson batch is stepped all the same (noise only)
                            self.last_empty_batches += 1
                            if self.grad_sample_mode == "ew":  # torch's ExpandedWeights refuses batch size 0
                                for p in dp_opt.params:
                                    p.grad_sample = p.new_zeros((0, *p.shape))
                                dp_opt.step()
                                continue
                        loss = star_loss(gsm(fi, x, m), y)
                        loss.backward()
                        dp_opt.step()
                        losses.append(float(loss.detach()))
                    epoch_seconds.append(time.perf_counter() - t_epoch)
            completed = True
        finally:
            gsm._close()  # remove hooks and per-sample gradient attributes
            for p in frozen:
                p.requires_grad_(True)
            if not completed and normalise(engine.accountant.state_dict()["history"]) != self.ledger.history:
                # steps taken before a failure changed the model (personal modules persist): they count
                self.ledger.commit(round_=round_, history=engine.accountant.state_dict()["history"],
                                   noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate, clip_norm=self.clip_norm)
        clip = float(extra.get("max_clipbound", self.clip_norm))
        t_acc = time.perf_counter()
        entry = self.ledger.commit(round_=round_, history=engine.accountant.state_dict()["history"],
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
                f"q={self.sample_rate:.4g}, clip={self.clip_norm:g}, clipping={self.clipping!r})")


def dp_trainer_factory(*, table: PatientTable, train_idx: np.ndarray, config: HospitalConfig, site: str,
                       state_dir: str | Path, signer: Identity | None = None) -> DPTrainer:
    """The DP trainer of a hospital built from its :class:`~clinograph.sdk.config.HospitalConfig`.

    σ is ``privacy.noise_multiplier`` or, if unset, calibrated to ``target_epsilon`` (default
    ``epsilon_budget``) over ``planned_rounds`` × ``planned_local_epochs`` epochs. The ledger
    lives in ``state_dir`` (one folder per hospital).

    Raises:
        PrivacyError: DP is not enabled, ``[graph] k_similar > 0``, or σ must be calibrated
            but ``planned_rounds`` is unset.
    """
    priv = config.privacy
    if not priv.enabled:
        raise PrivacyError("dp_trainer_factory needs [privacy] enabled = true (it would otherwise claim a DP "
                           "guarantee the federation's policy does not check).")
    refuse_coupled_training(k_similar=config.graph.k_similar, site=site)
    ledger = PrivacyLedger(Path(state_dir), site=site, budget_epsilon=priv.epsilon_budget, delta=priv.delta,
                           accountant=priv.accountant, signer=signer)  # signer: the ledger file is signed
    q, steps_epoch = poisson_plan(n_train=len(train_idx), batch_size=priv.batch_size)
    sigma = priv.noise_multiplier
    if sigma is None:
        if priv.planned_rounds is None:
            raise PrivacyError(f"Hospital {site!r}: [privacy] needs noise_multiplier, or planned_rounds to calibrate "
                               "σ to the ε budget over the run. Set one of them in the hospital config.")
        epochs = priv.planned_rounds * (priv.planned_local_epochs or 1)
        sigma = calibrate_noise_multiplier(target_epsilon=priv.target_epsilon or priv.epsilon_budget, delta=priv.delta,
                                           sample_rate=q, steps=epochs * steps_epoch, accountant=priv.accountant)
    adaptive = {k: getattr(priv, k) for k in ("target_unclipped_quantile", "clipbound_learning_rate", "max_clipbound",
                                              "min_clipbound", "unclipped_num_std")}
    return DPTrainer(table, train_idx=train_idx, ledger=ledger, noise_multiplier=sigma, clip_norm=priv.clip_norm,
                     batch_size=priv.batch_size, train_config=config.training, clipping=priv.clipping,
                     adaptive=adaptive if priv.clipping == "adaptive" else None,
                     grad_sample_mode=priv.grad_sample_mode)
