"""NS-FL as a task: the relation-aware attention GNN over one hospital's knowledge graph.

Personal layers, local fine-tuning (PFGL-Net Alg. 2), patient-level DP, the DQ quality metrics,
model selection by federated validation loss (:mod:`clinograph.sdk.training.selection`) and
Platt calibration (:mod:`clinograph.sdk.training.calibration`) are configuration of this one
task (:class:`~clinograph.sdk.config.HospitalConfig`), not separate loops; so are the temporal
model, the survival head and (:mod:`.modality_task`) modality nodes.

DP is the trainer, chosen by ``[privacy]``: off, the plain trainer; ``mode = "local"``, DP-SGD at
the hospital (:class:`~clinograph.sdk.privacy.trainer.DPTrainer` and its survival and modality
forms); ``mode = "distributed"``, one DP-SGD step a round with a Skellam share inside the masked
sum (:class:`~clinograph.sdk.privacy.distributed_trainer.DistributedTrainer`, around the plain
trainer). The task's rounds, validation, scoring, calibration, candidates and checkpoints are the
same code in every mode; under distributed DP the validation loss rides in the round's noisy sum.

Lifecycle: rounds (``train`` / ``after_round``), then :meth:`NSFLTask.finish` -- keep the
selected model, fit the hospital's Platt scaling on its validation split -- then
:meth:`NSFLTask.predict_table` for new patients or :func:`clinograph.sdk.model.export.export_model`
(both from :class:`.nsfl_predict.NSFLPrediction`: the use of the kept model lives there).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from clinograph.secure.runtime.selection import released_loss_noise

from clinograph.core.errors import ConfigError
from clinograph.core.identity import Identity
from clinograph.core.spec import ModuleKind

from ..config import HospitalConfig
from ..ingest.table import PatientTable
from ..model.heads import nsfl_model
from ..model.modules import ModuleMap
from ..model.nsfl import NSFLModel
from ..model.nsfl_modules import SELECTION_MODULE
from ..ontology.dictionary import FeatureDictionary
from ..seeding import torch_seeded
from ..training.calibration import Platt
from ..training.personal import fine_tune_personal, personal_module_map
from ..training.quality import quality_evaluator
from ..training.selection import ModelSelection, decode_validation, encode_validation, value_bound
from ..training.trainer import GraphTrainer, Trainer, TrainOutcome
from .nsfl_predict import NSFLPrediction
from .split import Split

if TYPE_CHECKING:
    from clinograph.secure.dp import DistributedPolicy


class NSFLTask(NSFLPrediction):
    """NS-FL at one hospital (implements :class:`~clinograph.sdk.federation.task.Task`).

    ``policy``: under ``[privacy] mode = "distributed"``, the federation's policy the hospital's
    ``[privacy]`` must equal (default: its own values; the server checks every round)."""

    name = "nsfl"
    #: the hospital's modality signals (:class:`.modality_task.ModalityNSFLTask`); None: no modality model
    signals: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None

    def __init__(self, table: PatientTable, *, dictionary: FeatureDictionary, config: HospitalConfig, split: Split,
                 state_dir: Path | None = None, signer: Identity | None = None, policy: DistributedPolicy | None = None):
        if config.privacy.enabled and config.personal.fine_tune_epochs:
            raise ConfigError("[personal] fine_tune_epochs > 0 with [privacy] enabled: fine-tuning would train on "
                              "patients outside the DP accountant. Set fine_tune_epochs = 0 under DP.")
        from .candidates import private_choice

        config = private_choice(config)  # under DP with selection: σ, σ_s planned over the whole choice
        self.table, self.config, self.split = table, config, split
        #: "none", "local" or "distributed": which trainer ([privacy] enabled and mode)
        self.privacy_mode = config.privacy.mode if config.privacy.enabled else "none"
        node_ids = dictionary.node_ids()
        if config.model.modalities and self.signals is None:
            raise ConfigError(f"Hospital {table.site!r}: a modality model needs the hospital's signals; build its "
                              "task with build_modality_task(..., signals=...).")
        self.model, self.modules = nsfl_task_model(config, node_ids)
        self._node_ids = node_ids
        self.observed = {node_ids[i] for i in np.asarray(table.observed_nodes())}
        #: survival target (interval ends and horizon in days) or None for a binary label
        self.survival_target: tuple[np.ndarray, float] | None = None
        if config.target.kind == "survival":
            from ..ingest.survival import days_per

            scale = days_per(config.target.time_unit)
            breaks = np.asarray(config.target.breaks, float) * scale
            self.survival_target = (breaks, float(config.target.horizon or config.target.breaks[-1]) * scale)
        root: Path | None = None
        if config.privacy.enabled:
            if state_dir is None and config.privacy.state_dir is None:
                raise ConfigError(f"Hospital {table.site!r} trains with DP but has no state directory for its privacy "
                                  "ledger: set [privacy] state_dir (or pass state_dir).")
            root = Path(config.privacy.state_dir) / table.site if config.privacy.state_dir else Path(state_dir)  # type: ignore[arg-type]
            if signer is None:
                raise ConfigError(f"Hospital {table.site!r} trains with DP but was given no signing identity for its "
                                  "privacy ledger (there is no unsigned ledger): pass signer= (build_task: identity=), "
                                  "the hospital's Identity.")
        trainer = self._make_trainer(local=self.privacy_mode == "local", root=root, signer=signer)
        if config.model.temporal != "none":  # each patient's sequence of snapshot stars is one example
            from ..training.temporal import use_snapshots

            use_snapshots(trainer, table, train_idx=split.train, config=config.model)
        #: the hazard likelihood's per-patient targets (s, e) [n, K] (survival head only)
        self._hazard = (trainer.s, trainer.e) if self.survival_target is not None else None  # type: ignore[attr-defined]
        if self.privacy_mode == "distributed":  # one DP-SGD step a round around the plain trainer
            from ..privacy.distributed_trainer import distributed_trainer

            trainer = distributed_trainer(trainer, model=self.model, modules=self.modules, config=config,
                                          state_dir=root, signer=signer, policy=policy)  # type: ignore[arg-type]
            self.modules = trainer.modules
        self.trainer: Trainer = trainer
        self._rounds_done = 0
        #: (federation id, round) of the published global model the shared modules now hold, set by
        #: the hospital's client when it loads one (None: not from a federation round)
        self.global_origin: tuple[str, int] | None = None
        #: the federation's model selection as this hospital decodes it (None: selection off)
        self.selection: ModelSelection | None = None
        if config.selection_active() and SELECTION_MODULE in self.modules.names() and len(split.validation):
            q = config.privacy.sample_rate
            if self.privacy_mode == "distributed" and q != 1.0:
                raise ConfigError(f"Hospital {table.site!r}: [selection] under distributed DP needs the full-batch "
                                  f"schedule (sample_rate = 1; this one has {q:g}): the validation patients are in "
                                  "every round's sum, which the subsampled accountant does not cover. Use a preset "
                                  "of sdk/privacy/schedule.py, or [selection] enabled = false.")
            self.selection = ModelSelection(patience=config.selection.patience,
                                            min_delta=config.selection.min_delta)
        #: under local DP: the noisy, accounted release of the validation loss sum (sdk/privacy/selection.py)
        self.private_validation = None
        if self.selection is not None and self.privacy_mode == "local":
            self.private_validation = _private_validation(self.trainer, config, n_train=len(split.train))
        self._metric_before: np.ndarray | None = None
        #: under distributed DP: the round's aggregate of metric/validation, set by the hospital's client
        #: from the global model (None: unknown, the noise is then read as 0) and the plan's server lr
        self.validation_aggregate = None
        self._server_lr = 1.0
        #: set by the driver for a last round that only scores the current global model
        self.evaluate_only = False
        #: the hospital's Platt scaling (personal), fitted by :meth:`finish`
        self.calibration: Platt | None = None
        self._quality = None
        if config.release.metrics == "quality":
            if len(split.validation) == 0:
                raise ConfigError("[release] metrics = 'quality' needs a validation split: set [split] "
                                  "validation_fraction > 0.")
            self._quality = quality_evaluator(model=self.model, table=table, val_idx=split.validation,
                                              metric=config.release.quality_metric, predict=self.predict)

    def _make_trainer(self, *, local: bool, root: Path | None, signer: Identity | None) -> Trainer:
        """The plain trainer, or under local DP the DP trainer (the hazard likelihood's with a
        survival head), on the patients' stars."""
        config, table, train = self.config, self.table, self.split.train
        if self.survival_target is not None:
            breaks = self.survival_target[0]
            if local:  # patient-level DP on the hazard likelihood (sdk/privacy/survival.py)
                from ..privacy.survival import survival_dp_trainer

                return survival_dp_trainer(table=table, train_idx=train, config=config, site=table.site,
                                           state_dir=root, signer=signer, breaks=breaks)
            from ..training.survival import SurvivalTrainer

            return SurvivalTrainer(table, train_idx=train, k_similar=config.graph.k_similar, config=config.training,
                                   breaks=breaks)
        if local:
            from ..privacy import dp_trainer_factory

            return dp_trainer_factory(table=table, train_idx=train, config=config, site=table.site,
                                      state_dir=root, signer=signer)  # type: ignore[arg-type]
        return GraphTrainer(table, train_idx=train, k_similar=config.graph.k_similar, config=config.training)

    def __repr__(self) -> str:
        return f"NSFLTask(site={self.table.site!r}, {self.split!r})"

    @property
    def num_samples(self) -> float:
        """Training examples a round uses: n, or under distributed DP the expected Poisson batch q·n."""
        if self.privacy_mode == "distributed":
            return self.trainer.num_samples  # type: ignore[attr-defined]
        return int(len(self.split.train))

    def train(self, *, round_: int, epochs: int, plan_options: Mapping[str, float | int | str | bool]) -> TrainOutcome:
        self._metric_before = None
        self._server_lr = float(plan_options.get("strategy.server_lr", 1.0))
        if self.privacy_mode == "distributed":  # the plan and the budget checked before anything is scored
            self.trainer.begin_round(round_=round_, epochs=epochs, plan_options=plan_options)  # type: ignore[attr-defined]
            rows = self._score_global(plan_options, round_=round_)
            return self.trainer.train(self.model, round_=round_, epochs=epochs,  # type: ignore[call-arg]
                                      plan_options=dict(plan_options), extra_rows=rows,
                                      evaluate_only=self.evaluate_only)
        self._score_global(plan_options, round_=round_)
        if self.evaluate_only:
            ledger = None
            if self.private_validation is not None:  # the round released its noisy validation sum
                t = self.trainer
                ledger = t.ledger.release_entry(round_=round_, noise_multiplier=t.noise_multiplier,  # type: ignore[attr-defined]
                                                sample_rate=t.sample_rate, clip_norm=t.clip_norm)  # type: ignore[attr-defined]
            return TrainOutcome(loss=float("nan"), used_similar_to=False, ledger=ledger, extras={"evaluate_only": 1.0})
        out = self.trainer.train(self.model, round_=round_, epochs=epochs, plan_options=dict(plan_options))
        if self._metric_before is not None:  # training never touches it; write the encoded value back
            self.modules.set(SELECTION_MODULE, self._metric_local)
        return out

    def _score_global(self, plan_options: Mapping[str, float | int | str | bool], *, round_: int) -> np.ndarray | None:
        """Score the model just loaded (global + personal) on the validation split and encode
        (Σ loss, n_val) into ``metric/validation`` (see :mod:`clinograph.sdk.training.selection`);
        under local DP the loss sum is clipped and noised, and the release accounted
        (:mod:`clinograph.sdk.privacy.selection`); under distributed DP returns the validation
        patients' rows for the round's noisy sum (:func:`~clinograph.sdk.privacy.distributed.validation_rows`)."""
        if self.selection is None:
            return None
        from ..privacy.selection import binary_losses, survival_losses

        idx = self.split.validation
        if self._hazard is not None:  # the hazard likelihood (sdk/training/survival.py)
            losses = survival_losses(self.trainer.predict(self.model)[idx], self._hazard[0][idx], self._hazard[1][idx])
        else:
            losses = binary_losses(self._predict_raw()[idx], self.table.labels[idx])
        before = self.modules.get(SELECTION_MODULE)
        self.selection.offer(round_=self._rounds_done, state=self.model.state_dict(), tag=self.global_origin)
        self._metric_before = before
        if self.privacy_mode == "distributed":
            from ..privacy.distributed import validation_rows

            return validation_rows(losses, loss_clip=self.config.privacy.selection_loss_clip,
                                   clip_norm=self.trainer.policy.clip_norm)  # type: ignore[attr-defined]
        loss_sum = (float(np.sum(losses)) if self.private_validation is None
                    else self.private_validation.release(losses, round_=round_))
        fixed = plan_options.get(f"weight/{self.table.site}")  # the weight HospitalClient will use
        weight = float(fixed) if fixed is not None else float(min(self.num_samples,
                                                                  float(plan_options.get("weight.max", np.inf))))
        self._metric_local = encode_validation(global_value=before, loss_sum=loss_sum, count=len(idx), weight=weight,
                                               bound=value_bound(plan_options))
        self.modules.set(SELECTION_MODULE, self._metric_local)
        return None

    def trained_modules(self, outcome: TrainOutcome) -> list[str]:
        metric = [SELECTION_MODULE] if self._metric_before is not None else []
        if self.evaluate_only:
            return metric
        if self.privacy_mode == "distributed":  # every hospital noises every released coordinate
            return [*self.trainer.columns.modules, *metric]  # type: ignore[attr-defined]
        out = []
        for n in self.modules.names(ModuleKind.SHARED):
            if n == SELECTION_MODULE:
                continue
            if n.startswith(("feature_embedding/", "linear/", "trend/")) and n.split("/", 1)[1] not in self.observed:
                continue  # NS-FL Theorem 1: zero gradient; the hospital does not touch it
            if n.endswith("/similar_to") and not outcome.used_similar_to:
                continue
            if n == "temporal/attention" and self.table.n_snapshots == 1:
                continue  # one snapshot: attention over it has exactly zero gradient
            out.append(n)
        return out + metric

    def after_round(self) -> None:
        if self.selection is not None and self._metric_before is not None:
            after = self.modules.get(SELECTION_MODULE)
            loss = decode_validation(before=self._metric_before, after=after)
            noise = 0.0
            if loss is not None and self.privacy_mode == "distributed":  # Σ a·ℓ̃ / Σ a: mean clipped loss / B
                loss *= self.config.privacy.selection_loss_clip
                noise = self._released_noise(loss, after=after)
            self.selection.observe(loss, noise)
            self._metric_before = None
        if self.evaluate_only:
            return
        epochs = self.config.personal.fine_tune_epochs
        if epochs and self.modules.names(ModuleKind.PERSONAL):
            fine_tune_personal(self.model, self.modules, stars=self.trainer.stars, train_idx=self.split.train,  # type: ignore[attr-defined]
                               epochs=epochs, config=self.config.training, round_=self._rounds_done)
        self._rounds_done += 1

    def _released_noise(self, loss: float, *, after: np.ndarray) -> float:
        """The noise std of the released validation loss under distributed DP (0: the round's
        aggregate unknown), from public values and the released sums only: Σ n_val read back from the
        count coordinate's move (× Σ w / η, ÷ a = C/√2), the round's contributors, the federation's σ and h."""
        agg = self.validation_aggregate
        if agg is None:
            return 0.0
        policy = self.trainer.policy  # type: ignore[attr-defined]
        moved = float(np.asarray(self._metric_before, dtype=np.float64)[1] - np.asarray(after, dtype=np.float64)[1])
        count = moved * agg.weight / self._server_lr / (policy.clip_norm / np.sqrt(2.0))
        return released_loss_noise(mean=loss, count=count, noise_multiplier=policy.noise_multiplier,
                                   contributors=agg.contributors, min_honest=policy.min_honest,
                                   loss_clip=self.config.privacy.selection_loss_clip)

    def _predict_raw(self) -> np.ndarray:
        if self.survival_target is not None:  # risk 1 − S(t) at the horizon
            from ..training.survival import risk_at

            return risk_at(self.trainer.predict(self.model), *self.survival_target)
        return self.trainer.predict(self.model)

    def quality(self) -> dict[str, float]:
        if self.privacy_mode == "distributed":
            raise ConfigError("Quality metrics are not released under distributed DP (the DP accountant does not "
                              "cover them).")
        if self._quality is None:
            raise ConfigError("Quality metrics need [release] metrics = 'quality'.")
        return self._quality()

    def feature_relevance(self) -> dict[str, float]:
        if self.privacy_mode == "distributed":
            return {}  # the masks are frozen at their initial value: nothing learned to show
        with torch.no_grad():
            m = self.model.feature_mask(torch.arange(len(self._node_ids))).numpy()
        return {nid: float(m[i]) for i, nid in enumerate(self._node_ids) if nid in self.observed}


def nsfl_task_model(config: HospitalConfig, node_ids: Sequence[str]) -> tuple[NSFLModel, ModuleMap]:
    """The model of ``config`` -- [target]'s head, [model] temporal or modalities -- and its module
    map, drawn from ``[model] init_seed``: the same at every hospital and at the server."""
    from ..model.modalities import ModalityNSFL, add_modality_modules
    from ..model.temporal import add_temporal_modules, temporal_task_model

    n = len(node_ids)
    with torch_seeded(config.model.init_seed):  # the host's global generator is put back after
        model = temporal_task_model(n, config) if config.model.temporal != "none" else nsfl_model(n, config)
        if config.model.modalities:  # modality nodes (sdk/model/modalities.py)
            model = ModalityNSFL(n, config.model, modalities=tuple(config.model.modalities))
    modules = personal_module_map(model, node_ids, personal=config.personal.modules)
    return model, add_modality_modules(add_temporal_modules(modules, model, node_ids), model)


def _private_validation(trainer, config: HospitalConfig, *, n_train: int):  # noqa: ANN001, ANN202
    """The DP release of the validation loss of a hospital whose trainer keeps a ledger.

    Raises:
        ConfigError: no selection release is planned (σ_s would be unknown).
    """
    from ..privacy.selection import PrivateValidation, selection_plan

    plan = selection_plan(config.privacy, n_train=n_train)
    if plan is None or plan.selection_noise_multiplier is None:
        raise ConfigError("[selection] under [privacy] needs the validation releases planned, so σ and σ_s are "
                          "calibrated for them: set [privacy] planned_rounds (or planned_selection_releases), or "
                          "[selection] enabled = false.")
    return PrivateValidation(trainer.ledger, noise_multiplier=plan.selection_noise_multiplier,
                             clip=config.privacy.selection_loss_clip)
