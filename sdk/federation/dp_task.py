"""NS-FL under distributed DP: the task a hospital runs in ``[privacy] mode = "distributed"``.

Implements NS-FL eq. (6) (FedSGD with a server learning rate) as one DP-SGD step a round over
the federation's patients (:mod:`clinograph.sdk.privacy.distributed`): each hospital's
"local model" is θ − z/(s·w), where z is its noisy integer sum, s the masked ring's scale and
w = q·n its expected batch, so :class:`HospitalClient`'s weighted delta w·(θ − θ_local) is
z/s and the masked mode encodes z exactly. The server's FedSGD then applies
θ ← θ − η·Σ_k z_k / (s·Σ_k q·n_k).

Private model choice (``[selection] enabled = true``; issue 30): each round the hospital scores
the global model it received on its validation patients and adds, as two more coordinates of the
same noisy integer sum (module ``metric/validation``), each validation patient's row
(a·min(ℓ_j, B)/B, a) with a = C/√2 -- L2 norm at most C, a patient's whole contribution, like a
training patient's clipped gradient (every patient is in one split). The Skellam share covers
these coordinates too, so every coordinate of the sum carries the federation's noise, and the
accountant is unchanged: the dimension it accounts over already counts ``metric/validation``
(the spec's shared modules). Full-batch schedules only (q = 1): the validation patients are in
every round, which a subsampled accountant would not cover. The run's evaluation-only scoring
round sends the two coordinates alone (no gradient rows) and is accounted as one more round
(:func:`.candidates.distributed_rounds`). The ratio of the two summed coordinates is the federated mean
clipped loss / B, noisy; the kept round, early stopping and the choice among candidates are
post-processing of it.

Every NS-FL model trains here through the one per-patient engine, the task supplying the model,
its rows and its objective (one patient, one row): the binary star model (BCE); the survival
head (``[target] kind = "survival"``: the discrete-time hazard likelihood, a sum of per-patient
terms, :mod:`clinograph.sdk.privacy.survival`; under selection the validation loss is the
per-patient hazard NLL); the temporal model (``[model] temporal = "attention"``: a patient's
whole snapshot sequence is its row, :mod:`clinograph.sdk.training.temporal`); the modality model
(``[model] modalities``: a patient's star and its signals, :mod:`clinograph.sdk.privacy.modalities`;
built by :func:`.modality_task.build_modality_task`, which has the signals). The ring encoding,
the ledger and the share checks are the same for all of them.

The personal feature masks are frozen at their initial value (no personal training under
distributed DP: it would use the patients outside the accountant). ``similar_to`` is never
built (stars only), as in local DP.

:func:`.simulate.build_simulation` builds a whole federation in process with these tasks when
``[privacy] mode = "distributed"`` (the same server builder, transport and loop as every
federation), after checking the policy with :func:`check_simulation`
(:func:`clinograph.secure.dp.check_configuration`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from clinograph.secure.dp import DistributedPolicy, check_configuration, wrap_free
from clinograph.secure.runtime.build import masked_options, weight_bound
from clinograph.secure.runtime.config import DPPolicySection

from clinograph.core.errors import ConfigError, PrivacyError
from clinograph.core.identity import Identity
from clinograph.core.spec import ModuleKind

from ..config import HospitalConfig, SimulationConfig
from ..graph.star import star_batch
from ..graph.temporal import snapshot_batch
from ..ingest.table import PatientTable
from ..model.heads import nsfl_model
from ..model.modalities import ModalityNSFL, ModalStarBatch, add_modality_modules, modal_stars
from ..model.modules import ModuleMap
from ..model.nsfl import NSFLModel
from ..model.nsfl_modules import SELECTION_MODULE
from ..model.temporal import add_temporal_modules, temporal_task_model
from ..ontology.dictionary import FeatureDictionary
from ..privacy.distributed import Columns, DistributedLedger, columns_clipper, distributed_step
from ..privacy.modalities import modal_engine, modal_rows
from ..privacy.per_patient import PerPatientClipper
from ..privacy.survival import HazardClipper
from ..training.local import predict
from ..training.personal import personal_module_map
from ..training.selection import ModelSelection, decode_validation
from ..training.survival import risk_at
from ..training.trainer import TrainOutcome
from .candidates import distributed_rounds
from .split import Split
from .task_base import SelectedCalibrated


class _ExactLocal(ModuleMap):
    """The task's module map, whose released modules read as the exact float64 local model
    θ − z/(s·w) during a round (a float32 torch copy would not give z back in the ring)."""

    def __init__(self, base: ModuleMap):
        super().__init__()
        self._modules = base._modules
        self.pending: dict[str, np.ndarray] = {}

    def get(self, name: str) -> np.ndarray:
        return self.pending[name].copy() if name in self.pending else super().get(name)

    def load(self, state: Mapping[str, np.ndarray]) -> None:
        self.pending = {}
        self.global64 = {n: np.asarray(v, dtype=np.float64).copy() for n, v in state.items()}
        super().load(state)


class DistributedDPTask(SelectedCalibrated):
    """One hospital's NS-FL task in distributed-DP mode (implements :class:`.task.Task`)."""

    name = "nsfl"

    def __init__(self, table: PatientTable, *, dictionary: FeatureDictionary, config: HospitalConfig, split: Split,
                 policy: DistributedPolicy, state_dir: Path, signer: Identity,
                 signals: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None):
        priv = config.privacy
        if not priv.enabled or priv.mode != "distributed":
            raise ConfigError("DistributedDPTask needs [privacy] enabled = true and mode = 'distributed'.")
        if config.graph.k_similar:
            raise PrivacyError(f"Hospital {table.site!r}: [graph] k_similar = {config.graph.k_similar} couples "
                               "patients; distributed DP trains on stars only. Set k_similar = 0.")
        mine = (priv.mechanism, priv.noise_multiplier, priv.clip_norm, priv.sample_rate, priv.min_honest, priv.delta)
        theirs = (policy.mechanism, policy.noise_multiplier, policy.clip_norm, policy.sample_rate, policy.min_honest,
                  policy.delta)
        if mine != theirs:
            raise PrivacyError(f"Hospital {table.site!r}: its [privacy] (mechanism, σ, C, q, h, δ) = {mine} differs "
                               f"from the federation's [dp_policy] {theirs}. Copy the federation's values.")
        self.table, self.config, self.split, self.policy = table, config, split, policy
        node_ids = dictionary.node_ids()
        torch.manual_seed(config.model.init_seed)  # identical initial weights at every hospital
        temporal, modal = config.model.temporal != "none", tuple(config.model.modalities)
        if modal and signals is None:
            raise ConfigError(f"Hospital {table.site!r}: a modality model under distributed DP needs the hospital's "
                              "signals; build its task with build_modality_task(..., signals=...).")
        if modal:
            self.model: NSFLModel = ModalityNSFL(len(node_ids), config.model, modalities=modal)
        else:
            self.model = temporal_task_model(len(node_ids), config) if temporal else nsfl_model(len(node_ids), config)
        self.modules = _ExactLocal(add_modality_modules(add_temporal_modules(
            personal_module_map(self.model, node_ids, personal=config.personal.modules), self.model, node_ids),
            self.model))
        self.columns = Columns.of(self.model, self.modules, self.modules.names(ModuleKind.SHARED))
        #: the dimension the ledger accounts over: every coordinate the model spec releases (its
        #: shared modules), the server's own number. The noised columns are a subset (similar_to
        #: and metric/validation are off the star path), so the sensitivity bound Δ2 <= C·s + sqrt(d)
        #: at this d is valid, if slightly looser (the server refuses a share accounted over fewer).
        self.accounted_dim = sum(m.size for m in self.modules.spec().shared)
        #: the patients' rows: stars, or each patient's snapshot sequence (temporal)
        self.stars = snapshot_batch(table, window=config.model.temporal_window,
                                    carry_forward=config.model.temporal_carry_forward) if temporal else \
            star_batch(table, k_similar=0)
        engine: Callable[..., PerPatientClipper] = PerPatientClipper
        if modal:  # a patient's row: its star and its signals (sdk/privacy/modalities.py)
            self.stars, engine = modal_stars(self.stars, modal, signals or {}), modal_engine
        #: the objective's labels: 0/1, or the hazard likelihood's [s | e] rows (survival)
        self.survival_target: tuple[np.ndarray, float] | None = None
        self.labels = self.stars.labels
        if config.target.kind == "survival":
            self.survival_target, self._s, self._e = _survival_rows(table, config)
            self.labels = torch.as_tensor(np.concatenate([self._s, self._e], axis=1), dtype=torch.float32)
            engine = HazardClipper
        #: the per-patient engine on the task's objective, built once for the whole run (not per round)
        self.clipper = columns_clipper(self.model, self.columns, row_shape=tuple(self.stars.feature_index.shape[1:]),
                                       engine=engine)
        self.ledger = DistributedLedger(state_dir, site=table.site, budget_epsilon=priv.epsilon_budget,
                                        delta=priv.delta, signer=signer)
        self._train = torch.as_tensor(np.asarray(split.train), dtype=torch.long)
        self.last_batch = 0
        self._rounds_done = 0
        #: (federation id, round) of the published global model the shared modules hold (set by the client)
        self.global_origin: tuple[str, int] | None = None
        #: set by the client for the run's evaluation-only scoring round
        self.evaluate_only = False
        #: private model choice: the validation patients' clipped losses ride in the same noisy sum
        #: as two more coordinates (metric/validation), noised with the same share (module docstring)
        self.selection: ModelSelection | None = None
        self._metric_before: np.ndarray | None = None
        if config.selection_active() and SELECTION_MODULE in self.modules.names() and len(split.validation):
            if policy.sample_rate != 1.0:
                raise ConfigError(f"Hospital {table.site!r}: [selection] under distributed DP needs the full-batch "
                                  f"schedule (sample_rate = 1; this one has {policy.sample_rate:g}): the validation "
                                  "patients are in every round's sum, which the subsampled accountant does not cover. "
                                  "Use a preset of sdk/privacy/schedule.py, or [selection] enabled = false.")
            self.selection = ModelSelection(patience=config.selection.patience, min_delta=config.selection.min_delta)

    def __repr__(self) -> str:
        return f"DistributedDPTask(site={self.table.site!r}, {self.split!r})"

    @property
    def num_samples(self) -> float:  # type: ignore[override]
        """The expected Poisson batch q·n (the weight FedSGD divides by)."""
        return self.policy.sample_rate * len(self.split.train)

    def train(self, *, round_: int, epochs: int, plan_options: Mapping[str, float | int | str | bool]) -> TrainOutcome:
        site = self.table.site
        if epochs != 1:
            raise PrivacyError(f"Hospital {site!r}: a distributed-DP round is one DP-SGD step (NS-FL eq. 6); the "
                               f"plan asks for {epochs} local epochs. Set [federation] local_epochs = 1.")
        if "masked.scale" not in plan_options:
            raise PrivacyError(f"Hospital {site!r}: distributed DP needs secure_mode = 'masked' (the noise shares "
                               "add up only inside the masked sum).")
        if f"weight/{site}" in plan_options:
            raise PrivacyError(f"Hospital {site!r}: the strategy fixes weights; distributed DP needs FedSGD's "
                               "weights = expected batch. Use strategy = 'fedsgd'.")
        threshold = int(plan_options["masked.threshold"])  # type: ignore[arg-type]
        if threshold < self.policy.min_honest:
            raise PrivacyError(f"Hospital {site!r}: the round's masked threshold {threshold} is below min_honest "
                               f"{self.policy.min_honest}; it could release a sum with too few noise shares.")
        scale, bound = float(plan_options["masked.scale"]), float(plan_options["masked.clip"])  # type: ignore[arg-type]
        weight = self.num_samples
        if weight > float(plan_options.get("weight.max", np.inf)):  # type: ignore[arg-type]
            raise PrivacyError(f"Hospital {site!r}: expected batch {weight:g} exceeds the plan's weight.max.")
        record = {"round": round_, "mechanism": self.policy.mechanism, "noise_multiplier": self.policy.noise_multiplier,
                  "noise_multiplier_alone": self.policy.noise_multiplier / np.sqrt(self.policy.min_honest),
                  "sample_rate": self.policy.sample_rate, "clip_norm": self.policy.clip_norm, "scale": scale,
                  "dim": self.accounted_dim, "min_honest": self.policy.min_honest,
                  "share_variance": self.policy.share_variance(scale)}
        self.ledger.check_round(record)
        s = self.stars
        extra = self._score_global() if self.selection is not None else None
        if self.evaluate_only and extra is None:
            return TrainOutcome(loss=float("nan"), used_similar_to=False, extras={"evaluate_only": 1.0})
        t = self._train
        rows = modal_rows(s, t) if isinstance(s, ModalStarBatch) else (s.feature_index[t], s.values[t], s.mask[t])
        step = distributed_step(self.model, self.columns, policy=self.policy, scale=scale, inputs=rows,
                                labels=self.labels[t],
                                clipper=self.clipper, extra_rows=extra, train=not self.evaluate_only)
        if np.abs(step.z).max(initial=0) / scale > bound:
            raise PrivacyError(f"Hospital {site!r}: its noisy sum leaves the masked range (masked.clip = {bound:g}); "
                               "nothing is sent this round. Raise [federation] masked_clip.")
        self._set_local(step.z, scale=scale, weight=weight)
        self.last_batch = step.batch
        entry = self.ledger.commit(record)
        return TrainOutcome(loss=0.0, used_similar_to=False, ledger=entry, extras={"epsilon": entry.epsilon})

    def _score_global(self) -> np.ndarray:
        """The validation patients' rows (:func:`validation_rows`) for the model just loaded; the
        model is offered to the selection, its loss known after the round."""
        from ..privacy.distributed import validation_rows
        from ..privacy.selection import binary_losses, survival_losses

        if self.selection is None:
            raise ConfigError(f"Hospital {self.table.site!r}: no validation loss to score (selection is off).")
        self.selection.offer(round_=self._rounds_done, state=self.model.state_dict(), tag=self.global_origin)
        idx = self.split.validation
        if self.survival_target is not None:  # the per-patient hazard NLL (a sum of per-patient terms)
            losses = survival_losses(self._logits()[idx], self._s[idx], self._e[idx])
        else:
            losses = binary_losses(predict(self.model, self.stars)[idx], self.table.labels[idx])
        glob = self.modules.global64 if hasattr(self.modules, "global64") else self.modules.state(ModuleKind.SHARED)
        self._metric_before = np.asarray(glob[SELECTION_MODULE], dtype=np.float64).copy()
        return validation_rows(losses, loss_clip=self.config.privacy.selection_loss_clip,
                               clip_norm=self.policy.clip_norm)

    def _set_local(self, z: np.ndarray, *, scale: float, weight: float) -> None:
        """θ_local = θ − z/(s·w) in float64, checked to give z back exactly through
        HospitalClient's delta w·(θ − θ_local) and the masked encoder's rint(x·s)."""
        glob = self.modules.global64 if hasattr(self.modules, "global64") else self.modules.state(ModuleKind.SHARED)
        pending = {}
        z = z.astype(np.float64)
        parts = {} if self.evaluate_only else self.columns.split(z[:self.columns.dim])
        if self.selection is not None:
            parts[SELECTION_MODULE] = z[len(z) - 2:]
        for name, zm in parts.items():
            local = glob[name] - zm / (scale * weight)
            back = np.rint((weight * (glob[name] - local)) * scale)
            if not np.array_equal(back, zm):
                raise PrivacyError("The noisy sum does not survive the fixed-point encoding exactly (global model "
                                   "values too large for the ring scale); nothing is sent this round.")
            pending[name] = local
        self.modules.pending = pending

    def trained_modules(self, outcome: TrainOutcome) -> list[str]:
        """Every released module, at every hospital (each adds noise to every coordinate);
        ``metric/validation`` too when selection is on; only it in the scoring round."""
        metric = [SELECTION_MODULE] if self.selection is not None else []
        return metric if self.evaluate_only else [*self.columns.modules, *metric]

    def after_round(self) -> None:
        if self.selection is not None and self._metric_before is not None:
            ratio = decode_validation(before=self._metric_before, after=self.modules.get(SELECTION_MODULE))
            # Σ a·ℓ̃ / Σ a = the federated mean clipped loss / B (noisy): back in loss units
            self.selection.observe(None if ratio is None else ratio * self.config.privacy.selection_loss_clip)
            self._metric_before = None
        self.modules.pending = {}
        if not self.evaluate_only:
            self._rounds_done += 1

    @torch.no_grad()
    def _logits(self) -> np.ndarray:
        """The model's outputs for every patient (local use): [n] logits, [n, K] hazard logits."""
        self.model.eval()
        return self.model.forward_batch(self.stars).double().numpy()

    def _predict_raw(self) -> np.ndarray:
        if self.survival_target is not None:  # risk 1 − S(t) at the horizon
            return risk_at(self._logits(), *self.survival_target)
        return predict(self.model, self.stars)

    def quality(self) -> dict[str, float]:
        raise ConfigError("Quality metrics are not released under distributed DP (the DP accountant does not "
                          "cover them).")

    def feature_relevance(self) -> dict[str, float]:
        return {}  # the masks are frozen at their initial value: nothing learned to show


def _survival_rows(table: PatientTable, config: HospitalConfig) -> tuple[tuple[np.ndarray, float], np.ndarray,
                                                                           np.ndarray]:
    """((interval ends, horizon) in days, s [n, K], e [n, K]): the hazard likelihood's targets."""
    from ..ingest.survival import days_per
    from ..training.survival import interval_targets

    if table.survival is None:
        raise ConfigError(f"Hospital {table.site!r}: [target] kind = 'survival' but its table has no time-to-event "
                          "label. Declare [survival] time, event and time_unit in its site schema.")
    scale = days_per(config.target.time_unit)
    breaks = np.asarray(config.target.breaks, float) * scale
    s, e = interval_targets(table.survival.time, table.survival.event, breaks)
    return (breaks, float(config.target.horizon or config.target.breaks[-1]) * scale), s, e


def build_distributed_task(table: PatientTable, *, dictionary: FeatureDictionary, config: HospitalConfig, split: Split,
                           state_dir: Path | None, identity: Identity | None,
                           signals: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None) -> DistributedDPTask:
    """A hospital's distributed-DP task (the NS-FL builder's and
    :func:`.modality_task.build_modality_task`'s; ``signals`` for a modality model)."""
    root = Path(config.privacy.state_dir) / table.site if config.privacy.state_dir else state_dir
    if root is None:
        raise ConfigError(f"Hospital {table.site!r} trains with distributed DP but has no state directory for "
                          "its ledger: set [privacy] state_dir (or pass state_dir).")
    if identity is None:
        raise ConfigError(f"Hospital {table.site!r} trains with DP but was given no signing identity for its "
                          "privacy ledger (there is no unsigned ledger): pass identity=, the hospital's Identity.")
    return DistributedDPTask(table, dictionary=dictionary, config=config, split=split, policy=hospital_policy(config),
                             state_dir=Path(root), signer=identity, signals=signals)


def distributed_policy(config: SimulationConfig) -> DPPolicySection:
    """The server's [dp_policy] for a simulation whose hospitals share ``config.privacy``."""
    p = config.privacy
    return DPPolicySection(max_epsilon=p.epsilon_budget, delta=p.delta, max_clip_norm=p.clip_norm,
                           min_noise_multiplier=0.0, mode="distributed", mechanism=p.mechanism,
                           noise_multiplier=p.noise_multiplier, sample_rate=p.sample_rate, min_honest=p.min_honest,
                           rounds=distributed_rounds(config))  # the whole choice with private selection



def check_simulation(config: SimulationConfig, tables: Sequence[PatientTable], *, dim: int) -> float:
    """The configuration-time check of the federation's policy (:func:`check_configuration`);
    returns the promised ε. What build_server should run (hook: see docs/privacy.md)."""
    fed = config.federation
    from clinograph.secure.aggregation import create_mode

    if not create_mode(fed.secure_mode).distributed_dp or fed.strategy != "fedsgd":
        raise ConfigError(f"Distributed DP needs a secure mode whose sum carries the hospitals' noise shares (masked; "
                          f"this config has {fed.secure_mode!r}) and strategy = 'fedsgd' (it has {fed.strategy!r}).")
    from clinograph.secure.runtime.build import build_strategy

    n = len(tables)
    max_weight = weight_bound(build_strategy(fed), fed)
    opts = masked_options(fed, n=n, max_weight=max_weight)
    policy = distributed_policy(config).distributed()
    if not wrap_free(n_clients=n, bound=float(opts["masked.clip"]), scale=float(opts["masked.scale"])):
        raise ConfigError("masked scale not wrap-free")  # pragma: no cover - masked_options guarantees it
    return check_configuration(policy, n_hospitals=n, masked_threshold=int(opts["masked.threshold"]),
                               scale=float(opts["masked.scale"]), hospital_bound=float(opts["masked.clip"]),
                               max_batch=max_weight, dim=dim)


def hospital_policy(config: HospitalConfig) -> DistributedPolicy:
    """The distributed-DP policy a hospital holds itself to: its own [privacy] values (the server
    checks every round that they equal the federation's [dp_policy])."""
    p = config.privacy
    missing = [k for k in ("noise_multiplier", "sample_rate", "min_honest", "planned_rounds") if getattr(p, k) is None]
    if missing:
        raise ConfigError(f"[privacy] mode = 'distributed' needs {missing} (copy the federation's [dp_policy]).")
    return DistributedPolicy(mechanism=p.mechanism, noise_multiplier=float(p.noise_multiplier),  # type: ignore[arg-type]
                             clip_norm=p.clip_norm, sample_rate=float(p.sample_rate),  # type: ignore[arg-type]
                             min_honest=int(p.min_honest), rounds=int(p.planned_rounds),  # type: ignore[arg-type]
                             max_epsilon=p.epsilon_budget, delta=p.delta)

