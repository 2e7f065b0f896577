"""Hospital and simulation configs, from TOML (strict: an unknown key is an error naming it).

Torch-free, so a config can be checked -- and a server configured -- without the training stack.
A hospital decides its own model, training, privacy and what it releases (``hospital.toml``);
the server decides the federation (``[federation]``, :mod:`clinograph.secure.runtime.config`).
``clinograph simulate`` reads both in one file (:class:`SimulationConfig`).

Release policy (issue: "release only what the hospital chose"): by default nothing leaves a
hospital beyond what the protocol needs (the masked or encrypted update, its weight, its DP
ledger entry when DP is on). ``[release] metrics`` and ``[release] feature_relevance`` are
explicit choices, recorded in every signed report and so in the audit trail.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from clinograph.secure.runtime.config import DPPolicySection, FederationSection, StrictSection
from pydantic import (
    BaseModel,
    Field,
    StrictInt,
    StringConstraints,
    field_validator,
    model_validator,
)

from clinograph.core.arguments import checked_arguments
from clinograph.core.tomlio import load_toml_model


def merge_sections(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` laid on top, table by table (a TOML-style override: a nested table
    updates the keys it names and keeps the others). Neither argument is changed."""
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in base.items()}
    for k, v in over.items():
        out[k] = merge_sections(out.get(k, {}), v) if isinstance(v, Mapping) else v
    return out


#: frozen, unknown keys refused, numbers and switches typed (see :class:`StrictSection`)
_Strict = StrictSection


class NSFLConfig(_Strict):
    """[model]: NS-FL hyper-parameters (the paper gives none; these defaults were chosen on the demo)."""

    hidden: int = Field(default=32, ge=2, le=1024, description="d_h")
    init_seed: int = Field(default=0, ge=0, lt=2**63, description="seed of the shared patient vector ε and of the "
                           "initial weights (same at every hospital)")
    negative_slope: float = Field(default=0.2, ge=0, lt=1)
    mask_init_logit: float = Field(default=2.0, ge=-20, le=20, description="m_f starts at sigmoid(2) ≈ 0.88")
    linear_path: bool = Field(default=True, description="wide & deep: a per-feature linear term on the "
                              "standardised values and observed indicators added to the logit (shared modules "
                              "``linear/<f>``); measured in research/real_tables/README.md")
    linear_shape: bool = Field(default=False, description="the wide path also learns a per-feature shape "
                               "function (piecewise linear over the fixed knots SHAPE_KNOTS of the standardised "
                               "value, sdk/model/nsfl.py) beside a_f·x_f + c_f: a federated GAM in the rows "
                               "``linear/<f>``; needs linear_path; measured in research/demo_quality/README.md")
    deep: bool = Field(default=True, description="the GNN (deep) part of wide & deep; false: its contribution "
                       "to the logit is switched off (its weights stay, get zero gradient and never move), "
                       "leaving the wide path and the head's bias -- a federated logistic regression, or a GAM "
                       "with linear_shape, over every dictionary feature; needs linear_path, static model only. "
                       "Unwritten under [privacy] (binary static NS-FL, no private choice): false "
                       "(dp_default_model, docs/privacy.md)")
    value_encoding: Literal["linear", "piecewise", "piecewise_gated"] = Field(
        default="linear", description="how the GNN's valued messages read a value: linear (x · V h_f), piecewise "
        "(also Σ_k B_k(x) · U_k h_f over the knots SHAPE_KNOTS: a per-feature curve, Gorishniy et al. 2022) or "
        "piecewise_gated (also G B(x) ⊙ h_f: the cheap factorised form); sdk/model/layers.py, measured in "
        "research/demo_quality/README.md")
    value_clip: float = Field(default=5.0, gt=0, le=1e6, description="standardised values are clipped to "
                              "±value_clip (reference range = [-1, 1]) before entering the model")
    selection_module: bool = Field(default=True, description="the 2-value shared module ``metric/validation`` "
                                   "that carries Σ loss·n_val and Σ n_val through the secure mode for model "
                                   "selection ([selection]); part of the ModelSpec, so the same at every hospital")
    features: Literal["all", "shared"] | tuple[str, ...] = Field(
        default="all", description="the dictionary features the model reads: all (every feature a hospital "
        "observes), shared (only those every hospital observes, found by a set-up round that sums each "
        "hospital's 0/1 coverage through the secure mode: sdk/federation/coverage.py; that set-up round is not "
        "wired over Flower yet, where a SuperNode refuses it with the reason), or a "
        "list of feature ids (the same at every hospital; e.g. what a simulation's `shared` resolved to, for a "
        "deployment). Observations of other features are ignored in training, prediction and the exported "
        "model; their parameters get zero gradient (Theorem 1)")
    # -- NS-FL over time (additive; sdk/model/temporal.py, docs/timeseries.md) ---------------------
    temporal: Literal["none", "attention"] = Field(default="none", description="none: the static model on the "
                                                   "last observations; attention: the shared GNN on every "
                                                   "snapshot's star, attention over the snapshots (long tables)")
    temporal_window: int = Field(default=12, ge=1, le=512, description="snapshots before the prediction time "
                                 "the temporal model reads (the same at every hospital)")
    temporal_carry_forward: bool = Field(default=True, description="a snapshot's graph keeps each feature's last "
                                         "observation (False: only what was measured at that step)")
    temporal_trend: bool = Field(default=True, description="temporal: the per-feature trend term (latest minus "
                                 "earliest standardised value in the window) on the wide path; needs linear_path")
    modalities: tuple[str, ...] = Field(default=(), description="the federation's extra modalities (e.g. "
                                        "['waveform']): each a typed node after an encoder federated only among "
                                        "the hospitals that have it (sdk/model/modalities.py)")

    @model_validator(mode="after")
    def _deep_needs_the_wide_path(self) -> NSFLConfig:
        if not self.deep and (not self.linear_path or self.temporal != "none" or self.modalities):
            raise ValueError("[model] deep = false leaves the wide path alone: it needs linear_path = true and the "
                             "static model (temporal = \"none\", no modalities). Set deep = true, or linear_path "
                             "= true without temporal/modalities.")
        if isinstance(self.features, tuple):
            twice = sorted({f for f in self.features if self.features.count(f) > 1})
            if not self.features or twice:
                raise ValueError(f"[model] features lists {'no feature' if not self.features else 'twice: ' + ', '.join(twice)}"
                                 "; give each dictionary feature id once, or \"all\" / \"shared\".")
        return self


class TrainConfig(_Strict):
    """[training]: local optimisation settings (documented defaults; the paper gives none)."""

    lr: float = Field(default=0.01, gt=0, le=10, description="Adam learning rate")
    batch_size: int = Field(default=64, ge=1, le=1_000_000)
    weight_decay: float = Field(default=0.0, ge=0)
    mask_lr_factor: float = Field(default=10.0, gt=0, description="m_f learn this much faster, so they move")
    wide_lr_factor: float = Field(default=1.0, gt=0, description="the wide path's rows ``linear/<f>`` learn this "
                                  "much faster than the GNN (wide & deep; local training, with or without local DP)")
    seed: int = Field(default=0, ge=0, lt=2**63)


class SelectionSection(_Strict):
    """[selection]: keep the best global model by federated validation loss, with early stopping.

    Each round a hospital scores the global model it received (with its personal layers) on its
    validation split and adds (Σ loss, n_val) to the shared module ``metric/validation``, so the
    secure mode sums them: only Σ_k loss_k·n_k and Σ_k n_k become known, never one hospital's
    figure. Needs a strategy linear in the sums (fedavg, fedsgd, fedprox, dq_weighted), not fedopt, fedadam or fedyogi.
    """

    enabled: bool | None = Field(default=None, description="None: on unless [privacy] is enabled; under "
                                 "[privacy], true releases each validation sum with Gaussian noise, accounted in "
                                 "the ledger (sdk/privacy/selection.py)")
    patience: int = Field(default=5, ge=0, le=10_000, description="stop after this many evaluated rounds "
                          "without improvement (0: never stop early)")
    min_delta: float = Field(default=1e-4, ge=0, description="an improvement smaller than this does not count")
    candidates: tuple[dict[str, Any], ...] | None = Field(
        default=None, max_length=8, description="model variants tried on identical splits, the lowest kept-round "
        "federated validation loss kept (sdk/federation/candidates.py; k× the training): tables with a `name` and "
        "overrides of model/training/graph/agat/personal. None: the default for binary NS-FL (linear wide path, "
        "shape functions) in `clinograph simulate`; []: no choice")
    restarts: int = Field(default=1, ge=1, le=8, description="train each candidate (or the one model) from this "
                          "many initialisations ([model] init_seed and [training] seed + 1000·i) and keep the lowest "
                          "kept-round federated validation loss of all (multi-start; restarts× the training). NS-FL "
                          "only, needs selection")
    elimination: Literal["successive_halving", "none"] = Field(
        default="successive_halving", description="with several candidates (× restarts): eliminate them early on the "
        "federated validation loss -- all train a first budget of rounds, the best half go on, and so on, so the whole "
        "choice trains at most 2× one model's planned rounds (secure/runtime/elimination.py; audited as "
        "candidates_eliminated). none: every candidate trains the whole run (k× the training)")


class CalibrationSection(_Strict):
    """[calibration]: Platt scaling of the final model's logits on this hospital's own validation
    split (personal: two numbers a hospital, never released)."""

    method: Literal["none", "platt"] = "platt"


class ScalingSection(_Strict):
    """[scaling]: how numeric values are scaled before the model (docs/model_quality.md, "Scaling").

    ``dictionary`` (default): each feature's (transformed) public reference range maps to
    [−1, 1]. ``federated``: a set-up round before training sums every hospital's histogram of
    each numeric feature over public bins through the secure mode (masked) and scales with the
    federation's median and inter-quantile range (sdk/federation/scaling.py); no hospital's
    distribution is revealed, only the sum. The same at every hospital."""

    source: Literal["dictionary", "federated"] = "dictionary"
    quantiles: Literal["iqr", "p05_p95"] = Field(default="iqr", description="federated: half-width = half the "
                                                 "25-75 % (iqr) or 5-95 % range; centre = median")
    bins: int = Field(default=200, ge=10, le=5000, description="federated: public bins per feature")
    span: float = Field(default=5.0, gt=0, le=100, description="federated: bins cover the transformed reference "
                        "centre ± span reference half-widths (cut to the physical limits)")


def _derived(part: BaseModel, key: str, value: Any) -> Any:
    """``part`` with ``key`` set to ``value`` by a rule, not by the operator: the key stays out of
    ``model_fields_set``, so later rules still see it as unwritten."""
    derived = part.model_copy(update={key: value})
    derived.__pydantic_fields_set__.discard(key)
    return derived


class GraphSection(_Strict):
    """[graph]: how each hospital builds its knowledge graph."""

    k_similar: int = Field(default=5, ge=0, le=100, description="similar_to neighbours (0 under [privacy]: its "
                           "default there, and any other value refused)")


#: [privacy] settings that say nothing of whether DP was wanted: a simulation fills them in for every
#: hospital (:meth:`SimulationConfig.hospital_config`), DP or not
_FILLED_FOR_EVERY_HOSPITAL = frozenset({"state_dir", "planned_rounds", "planned_local_epochs"})


class PrivacySection(_Strict):
    """[privacy]: patient-level DP-SGD at this hospital; off means the run has no DP guarantee.

    The switch is ``mode`` -- ``"none"``, ``"local"`` or ``"distributed"`` -- or ``enabled``: a
    section with ``mode = "local" | "distributed"`` and no ``enabled`` is on, ``mode = "none"`` is
    off, and one that sets DP settings (an ε budget, σ, ...) with neither is refused rather than
    run without DP (:meth:`_the_switch`)."""

    enabled: bool = False
    epsilon_budget: float = Field(default=10.0, gt=0, le=100, description="a budget above 100 promises nothing; the server's [dp_policy] max_epsilon has the same bound")
    delta: float = Field(default=1e-5, gt=0, lt=1)
    clip_norm: float = Field(default=1.0, gt=0)
    noise_multiplier: float | None = Field(default=None, ge=0, description="σ; None: calibrate from target_epsilon")
    batch_size: int = Field(default=64, ge=1, description="expected Poisson batch size B (q = 1/ceil(n/B))")
    target_epsilon: float | None = Field(default=None, gt=0, description="calibration target; default epsilon_budget")
    planned_rounds: int | None = Field(default=None, ge=1, le=100_000, description="rounds σ is calibrated over "
                                       "(needed when noise_multiplier is unset; simulate fills in federation.rounds)")
    planned_local_epochs: int | None = Field(default=None, ge=1, le=1000, description="epochs a round "
                                             "(simulate fills in federation.local_epochs; default 1)")
    accountant: Literal["rdp", "prv"] = "rdp"
    state_dir: Path | None = Field(default=None, description="ledger folder; default <output>/privacy_state/<site>")
    clipping: Literal["flat", "adaptive"] = "flat"
    target_unclipped_quantile: float = Field(default=0.5, gt=0, lt=1, description="adaptive clipping only")
    clipbound_learning_rate: float = Field(default=0.2, gt=0, description="adaptive clipping only")
    max_clipbound: float = Field(default=1.0, gt=0, description="adaptive clipping only; reported as the clip norm")
    min_clipbound: float = Field(default=0.01, gt=0, description="adaptive clipping only")
    unclipped_num_std: float = Field(default=10.0, gt=0, description="adaptive clipping only (σ_b)")
    grad_sample_mode: Literal["star"] = Field(default="star", description="per-patient gradients: star, the one "
                                              "engine of every DP task (sdk/privacy/per_patient.py); Opacus's "
                                              "hooks / ew were removed")
    # -- private model choice (sdk/privacy/selection.py) ------------------------------------------
    selection_loss_clip: float = Field(default=1.0, gt=0, le=100, description="B: each validation patient's loss "
                                       "is clipped to [0, B] before the noisy sum (the release's sensitivity)")
    selection_share: float = Field(default=0.1, gt=0, lt=1, description="the share of the Rényi budget (at the "
                                   "order that binds the target ε) the planned selection releases take; DP-SGD's σ "
                                   "is calibrated so both together meet the target")
    selection_noise_multiplier: float | None = Field(default=None, gt=0, description="σ_s of each validation "
                                                     "release; None: calibrated from selection_share")
    planned_selection_releases: int | None = Field(default=None, ge=0, le=1_000_000, description="validation "
                                                   "releases σ and σ_s are calibrated for; None: derived from the "
                                                   "plan (rounds + 1 a run, times the candidate runs)")
    setup_share: float = Field(default=0.05, gt=0, lt=1, description="the share of the Rényi budget each "
                               "planned set-up release (federated scaling, shared features) takes "
                               "(sdk/privacy/counts.py)")
    setup_noise_multiplier: float | None = Field(default=None, gt=0, description="σ_set of each set-up release; "
                                                 "None: calibrated from setup_share")
    planned_setup_releases: int | None = Field(default=None, ge=0, le=16, description="set-up releases σ is "
                                               "calibrated for; None: derived from [scaling] and [model] features")
    # -- distributed DP (additive; docs/privacy.md "Distributed DP") -------------------------------
    mode: Literal["none", "local", "distributed"] = Field(default="local", description="none: no DP (as enabled = "
                                                  "false); local: this hospital adds the "
                                                  "whole noise (DP-SGD alone); distributed: one DP-SGD step a "
                                                  "round over all hospitals, each adding a Skellam share inside "
                                                  "the masked sum (needs secure_mode = 'masked'); local or "
                                                  "distributed without `enabled` turns DP on")
    mechanism: Literal["skellam"] = Field(default="skellam", description="distributed only")
    sample_rate: float | None = Field(default=None, gt=0, le=1, description="distributed only: the federation's "
                                      "Poisson rate q (the same at every hospital)")
    min_honest: int | None = Field(default=None, ge=2, description="distributed only: h, the honest surviving "
                                   "hospitals the guarantee relies on; this hospital adds μ/h")

    @model_validator(mode="after")
    def _the_switch(self) -> PrivacySection:
        """``mode`` is a switch as ``enabled`` is (issue 30: ``[privacy] mode = none | local | distributed``):
        before, ``mode = "distributed"`` without ``enabled = true`` ran with no DP at all, and said
        nothing. A contradiction, or DP settings with no switch, is refused with the fix."""
        given = self.model_fields_set
        if self.mode == "none" and self.enabled:
            raise ValueError("[privacy] enabled = true but mode = 'none'. Say one thing: mode = 'local' or "
                             "'distributed' for DP, or mode = 'none' (and no enabled) for none.")
        if "mode" in given and "enabled" not in given and self.mode != "none":
            object.__setattr__(self, "enabled", True)  # frozen model: set once, while validating
            self.model_fields_set.add("enabled")
        elif "mode" not in given and "enabled" not in given and given - _FILLED_FOR_EVERY_HOSPITAL:
            raise ValueError(f"[privacy] sets {', '.join(sorted(given - _FILLED_FOR_EVERY_HOSPITAL))} but neither mode nor "
                             "enabled, so the run would have no DP. Add mode = 'local' (each hospital adds its own "
                             "noise) or mode = 'distributed' (shares inside the masked sum) -- or mode = 'none' to "
                             "run without DP on purpose.")
        return self

    @field_validator("grad_sample_mode", mode="before")
    @classmethod
    def _opacus_modes_removed(cls, v: object) -> object:
        if v in ("hooks", "ew"):
            raise ValueError(f"[privacy] grad_sample_mode = {v!r} (Opacus's per-sample gradients) was removed: every "
                             "DP task uses the per-patient engine, exact and faster (benchmarks/dp_step). Remove "
                             "grad_sample_mode from the hospital config (or set it to 'star').")
        return v


class PersonalSection(_Strict):
    """[personal]: PFGL-Net's personal layers and local fine-tuning (docs/strategies.md)."""

    modules: tuple[str, ...] = Field(default=(), description="module names or prefixes ending in '/' kept personal "
                                     "(e.g. 'head/task'); the feature masks always are")
    fine_tune_epochs: int = Field(default=0, ge=0, le=100, description="after each round, train the personal "
                                  "modules alone (0: off)")


class ReleaseSection(_Strict):
    """[release]: what this hospital lets leave beyond the protocol's needs. Default: nothing."""

    metrics: Literal["none", "quality", "validation"] = Field(default="none", description="quality: the DQ "
                                                              "strategy's perf and missing rate; validation: "
                                                              "AUROC/AUPRC on the validation split")
    quality_metric: Literal["f1", "micro_f1", "auroc"] = "f1"
    feature_relevance: bool = Field(default=False, description="the learned feature masks m_f (NS-FL Fig. 4)")
    tckks_threshold: int | None = Field(default=None, ge=2, le=32, description="secure_mode = 'ckks_threshold': "
                                        "the smallest t this hospital accepts for t-of-N decryption (the server "
                                        "proposes t; the server with t - 1 colluding holders can open the sum of any "
                                        "t hospitals); unset: N-of-N only")
    masked_threshold: int | None = Field(default=None, ge=2, le=10_000, description="secure_mode = 'masked': the "
                                         "smallest threshold t this hospital accepts (the server proposes t; with a "
                                         "lower t fewer colluding neighbours reveal an update); unset: the default t "
                                         "for the round's participant count (SECURITY.md, masked_defaults)")
    secure_modes: tuple[str, ...] = Field(default=("masked",), min_length=1, description="the secure modes this "
                                          "hospital joins rounds under: each releases something else (masked: the "
                                          "server learns the sum, the server with t - 1 colluding neighbours an "
                                          "update; ckks: never the sum, but every hospital holds the one secret "
                                          "key, so the server with ONE colluding hospital decrypts every update; "
                                          "ckks_threshold: the decrypted sum, t - 1 colluding key holders), so a "
                                          "plan under any other is refused and a server cannot switch a hospital's "
                                          "mode; default: masked only; a simulation sets its own mode "
                                          "(insecure_plaintext is insecure_accept_plaintext's)")
    max_weight_share: float = Field(default=0.9, gt=0, le=1, description="a plan that fixes the aggregation "
                                    "weights (weight/<hospital>, dq_weighted) is refused when this hospital's weight "
                                    "would be more than this share of the weights of the smallest round the server may "
                                    "aggregate (min_clients survivors, the others the lightest): a sum whose other "
                                    "weights are negligible is this hospital's update; default: at least 10 % of the "
                                    "sum from others; 1: no limit")
    insecure_accept_plaintext: bool = Field(default=False, description="join rounds the server plans under "
                                            "secure_mode 'insecure_plaintext', where the server sees this "
                                            "hospital's update in the clear (off: such a plan is refused, so a "
                                            "server cannot switch a hospital to plaintext); a simulation sets it "
                                            "when its own secure_mode is insecure_plaintext")


    @field_validator("secure_modes")
    @classmethod
    def _known_secure_modes(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        from clinograph.secure.aggregation import create_mode, unknown_mode

        for name in v:
            why = unknown_mode(name)
            if why is not None:
                raise ValueError(why)
            if create_mode(name).insecure:
                raise ValueError(f"{name!r} is not a secure mode: a hospital joins rounds under it only with "
                                 "insecure_accept_plaintext = true (development only).")
        return tuple(dict.fromkeys(v))


class SplitSection(_Strict):
    """[split]: how a hospital's patients are split. Depends on the hospital's own name and
    ``seed`` only, never on its position in a config (docs/quickstart.md)."""

    test_fraction: float = Field(default=0.3, gt=0, lt=1)
    validation_fraction: float = Field(default=0.2, ge=0, lt=1, description="of the training patients; "
                                       "used for model selection, calibration and [release] metrics "
                                       "(0: none, selection and calibration off)")
    seed: int = Field(default=0, ge=0, lt=2**63)


class AGATSection(_Strict):
    """[agat]: AGAT's network (Molaei et al. 2024, appendix B), used when ``task = "agat"``.
    Local optimisation takes ``[training]`` (lr, batch size, seed) like every task."""

    hidden: int = Field(default=128, ge=2, le=1024, description="GATConv width (appendix B: 128)")
    heads: int = Field(default=1, ge=1, le=16, description="attention heads (appendix B: 1)")
    dropout: float = Field(default=0.25, ge=0, lt=1, description="after the first GAT layer (appendix B: 0.25)")
    k_neighbours: int = Field(default=5, ge=1, le=100, description="k of the kNN patient graph (the paper "
                              "gives none)")
    temporal_hidden: int = Field(default=32, ge=2, le=1024, description="width of the eq. (7) MLP")
    value_clip: float = Field(default=5.0, gt=0, le=1e6, description="standardised values are clipped to "
                              "±value_clip before augmentation")


class FedNSLSection(_Strict):
    """[fednsl]: FedNSL's rule learning (Xing, Lu, Yu, ICML 2024), used when ``task = "fednsl"``.
    The rule space (every body of 1..``max_len`` predicates of the dictionary, each rule's head the
    hospital's label named ``head``) is public: every hospital and ``clinograph model init`` derive
    the same one from the dictionary and these settings, and the server pins its SHA-256."""

    head: str = Field(default="label", pattern=r"^[A-Za-z][A-Za-z0-9_]{0,63}$",
                      description="the predicate name of the label (the rules' head)")
    max_len: int = Field(default=2, ge=1, le=3, description="predicates per rule body (the space grows as "
                         "|predicates|^max_len)")
    k_similar: int = Field(default=5, ge=0, le=100, description="similar_to neighbours of eq. 8's path values")
    draws: int = Field(default=256, ge=1, le=100_000, description="J: candidate rules drawn from the prior a round")
    fast_after: int | None = Field(default=None, ge=0, description="Algorithm 2's I (Fast-FedNSL) ; None runs "
                                   "Algorithm 1 throughout")
    kl_weight: float = Field(default=1.0, ge=0, le=1e6, description="λ of eq. 2 (0: the no-KL ablation)")
    kl_direction: Literal["posterior_prior", "prior_posterior"] = "posterior_prior"
    steps: int = Field(default=150, ge=1, le=100_000, description="E-step optimiser steps")
    lr: float = Field(default=0.1, gt=0, le=10, description="E-step learning rate")
    missing_predicates: bool = Field(default=True, description="a `<feature>_missing` predicate per feature")
    normal_predicates: bool = Field(default=True, description="a `<feature>_normal` predicate per numeric feature")


class ConceptsSection(_Strict):
    """[concepts]: an F-CMs concept model voted and trained by the federation, used when
    ``task = "concepts"`` (docs/concepts.md). Every setting but ``edges`` is public and the same at
    every hospital and at ``clinograph model init``; ``edges`` is this hospital's own DAG proposal
    among the nodes it supervises (its concept columns, named in its site schema's ``concepts``,
    and the task, its label)."""

    concepts: tuple[str, ...] = Field(default=(), max_length=200, description="the federation's concept list, "
                                      "task included, in the order votes are encoded")
    task: str = Field(default="", max_length=200, description="the task node: the hospital's label (2 states)")
    states: dict[str, tuple[str, ...]] = Field(default_factory=dict, description="each concept's states as its "
                                               "column holds them (the task's are 0/1)")
    edges: tuple[tuple[str, str], ...] = Field(default=(), max_length=10_000, description="this hospital's DAG "
                                               "proposal: (parent, child) among the nodes it supervises")
    kind: Literal["cbm", "cem", "cgm", "c2bm"] = "cgm"
    z_dim: int = Field(default=32, ge=2, le=4096, description="the encoder's output width")
    encoder_hidden: tuple[int, ...] = Field(default=(64,), max_length=8, description="the MLP encoder's hidden widths")
    hidden: int = Field(default=32, ge=2, le=4096, description="width of every node module")
    emb: int = Field(default=8, ge=1, le=1024, description="concept-embedding size r (cem, c2bm)")
    vote_rounds: int = Field(default=1, ge=1, le=100, description="DAG voting rounds before the model is built")
    lr: float = Field(default=3e-3, gt=0, le=10)
    batch_size: int = Field(default=128, ge=1, le=1_000_000)
    gamma: float = Field(default=0.8, ge=0, le=1, description="F-CMs eq. 2: γ weighs the concept losses, 1 − γ the task's")
    p_intervention: float = Field(default=0.25, ge=0, le=1, description="probability of a concept intervention "
                                  "during training")


class TargetSection(_Strict):
    """[target]: what the model predicts. ``binary`` (default): a 0/1 label, BCE. ``survival``: a
    time-to-event label (site schema ``[survival]``: time + event), a discrete-time hazard over
    the intervals ending at ``breaks`` (Gensheimer & Narasimhan 2019), trained with its
    likelihood; censored patients contribute their survival terms (sdk/training/survival.py).
    ``breaks`` and ``horizon`` are public settings (the same at every hospital), in ``time_unit``."""

    kind: Literal["binary", "survival"] = "binary"
    time_unit: str = Field(default="d", description="unit of breaks and horizon (UCUM: d, wk, mo, a)")
    breaks: tuple[float, ...] = Field(default=(), description="survival: the K interval ends "
                                      "0 < b_1 < ... < b_K; follow-up past b_K is censored at b_K")
    horizon: float | None = Field(default=None, gt=0, description="survival: the time t of the reported risk "
                                  "P(T ≤ t) and of the horizon AUROC; default the last break")

    @model_validator(mode="after")
    def _survival_settings(self) -> TargetSection:
        if self.kind != "survival":
            return self
        b = self.breaks
        if not b:
            raise ValueError("[target] kind = 'survival' needs breaks: the ends of the K hazard intervals in "
                             "time_unit, e.g. breaks = [90, 180, 365, 730] (public, the same at every hospital)")
        if b[0] <= 0 or any(y <= x for x, y in zip(b, b[1:], strict=False)):
            raise ValueError(f"[target] breaks {list(b)} must be positive and strictly increasing")
        if len(b) > 200:
            raise ValueError(f"[target] breaks has {len(b)} intervals; use at most 200")
        if self.horizon is not None and self.horizon > b[-1]:
            raise ValueError(f"[target] horizon {self.horizon} lies past the last break {b[-1]}: the model has no "
                             "hazard there. Lower the horizon or add a break")
        return self

    @property
    def outputs(self) -> int:
        """Width of the model's output layer: 1 (binary) or K hazard intervals (survival)."""
        return len(self.breaks) if self.kind == "survival" else 1


class HospitalConfig(_Strict):
    """``hospital.toml``: one hospital's own choices."""

    #: top-level keys of another file, and what to do instead (added to the "unknown key" error)
    OTHER_FILES_KEYS: ClassVar[dict[str, str]] = {
        "dp_policy": "[dp_policy] is server.toml's section (the federation's DP policy, which the server checks); "
                     "this hospital's own DP settings are [privacy] (docs/privacy.md)",
        "federation": "[federation] is server.toml's section (or a simulation config's); a hospital.toml holds "
                      "only the hospital's own choices"}

    task: str = Field(default="nsfl", max_length=64, description="a registered task (clinograph.register_task; "
                      "built in: nsfl, agat, fednsl, concepts)")
    model: NSFLConfig = Field(default_factory=NSFLConfig)
    agat: AGATSection = Field(default_factory=AGATSection)
    fednsl: FedNSLSection = Field(default_factory=FedNSLSection)
    concepts: ConceptsSection = Field(default_factory=ConceptsSection)
    training: TrainConfig = Field(default_factory=TrainConfig)
    graph: GraphSection = Field(default_factory=GraphSection)
    scaling: ScalingSection = Field(default_factory=ScalingSection)
    privacy: PrivacySection = Field(default_factory=PrivacySection)
    personal: PersonalSection = Field(default_factory=PersonalSection)
    release: ReleaseSection = Field(default_factory=ReleaseSection)
    split: SplitSection = Field(default_factory=SplitSection)
    selection: SelectionSection = Field(default_factory=SelectionSection)
    calibration: CalibrationSection = Field(default_factory=CalibrationSection)
    target: TargetSection = Field(default_factory=TargetSection)
    dictionary: Path | None = Field(default=None, description="feature dictionary TOML (required)")

    @model_validator(mode="after")
    def _no_quality_metrics_under_distributed_dp(self) -> HospitalConfig:
        """The NS-FL task refuses to release quality metrics under distributed DP (outside its
        accountant); said here, at configuration, and not by every hospital at round 0's plan."""
        if self.privacy.enabled and self.privacy.mode == "distributed" and self.release.metrics == "quality":
            raise ValueError("[release] metrics = 'quality' with [privacy] mode = 'distributed': the metrics would "
                             "leave outside the distributed-DP accountant, so they are not released (and dq_weighted, "
                             "which reads them, cannot run: distributed DP needs fedsgd). Remove [release] metrics, "
                             "or use [privacy] mode = 'local' (the metrics are then a release outside its ledger, "
                             "docs/strategies.md).")
        return self

    @model_validator(mode="after")
    def _private_selection_supported(self) -> HospitalConfig:
        """Private model choice under distributed DP puts the validation patients' clipped losses
        into every round's noisy sum (sdk/privacy/distributed_trainer.py): they are in every round, so the
        schedule must be full-batch (sample_rate = 1) for the accountant to cover them."""
        p = self.privacy
        if p.enabled and p.mode == "distributed" and self.selection.enabled and p.sample_rate not in (None, 1.0):
            raise ValueError(f"[selection] enabled = true with [privacy] mode = 'distributed' and sample_rate = "
                             f"{p.sample_rate:g}: the validation patients are in every round's sum, which the "
                             "subsampled accountant does not cover. Use sample_rate = 1 (the presets of "
                             "sdk/privacy/schedule.py), or [selection] enabled = false")
        return self

    @model_validator(mode="after")
    def _graph_under_dp(self) -> HospitalConfig:
        """Under ``[privacy]`` a patient is one independent training example (its own star): no
        ``similar_to`` edges. An unwritten ``[graph] k_similar`` becomes 0 there; a written one above
        0 is refused here, once, instead of by every hospital when its training starts."""
        g = self.graph
        if not self.privacy.enabled or g.k_similar == 0:
            return self
        if "k_similar" in g.model_fields_set:
            raise ValueError(f"[graph] k_similar = {g.k_similar} with [privacy] enabled: under patient-level DP "
                             "every patient must be one independent training example, and similar_to edges let one "
                             "patient change other patients' gradients. Set [graph] k_similar = 0 (or remove it: "
                             "0 is the default under [privacy])")
        object.__setattr__(self, "graph", _derived(g, "k_similar", 0))
        return self

    @model_validator(mode="after")
    def _model_under_dp(self) -> HospitalConfig:
        """Under ``[privacy]`` the model's default is the wide path alone (:func:`dp_default_model`)."""
        if dp_default_model(self) and self.model.deep:
            object.__setattr__(self, "model", _derived(self.model, "deep", False))
        return self

    @model_validator(mode="after")
    def _survival_supported(self) -> HospitalConfig:
        """A survival target is trained by the static NS-FL task, without DP, with local or with
        distributed patient-level DP (sdk/training/survival.py, sdk/privacy/survival.py,
        sdk/privacy/distributed_trainer.py: the hazard likelihood is a sum of per-patient terms)."""
        if self.target.kind != "survival":
            return self
        refused = [what for what, bad in (
            (f"task = {self.task!r} (only 'nsfl' has a survival head)", self.task != "nsfl"),
            (f"[model] temporal = {self.model.temporal!r}", self.model.temporal != "none"),
            (f"[model] modalities = {list(self.model.modalities)}", bool(self.model.modalities))) if bad]
        if refused:
            raise ValueError("[target] kind = 'survival' is not supported with " + "; ".join(refused) +
                             ". Use kind = 'binary' with a horizon label, or drop the other setting")
        return self

    @field_validator("task")
    @classmethod
    def _registered(cls, value: str) -> str:
        from .tasks import registered_tasks

        known = registered_tasks()
        if value not in known:
            raise ValueError(f"unknown task {value!r}; registered: {', '.join(known)} (register your own with "
                             "clinograph.register_task before loading the config)")
        return value

    def selection_active(self) -> bool:
        """Whether this hospital reports its validation loss for model selection."""
        from .tasks import create_task

        on = self.selection.enabled if self.selection.enabled is not None else not self.privacy.enabled
        return bool(on and self.model.selection_module and self.split.validation_fraction > 0
                    and create_task(self.task).validation)

    @classmethod
    @checked_arguments
    def from_toml(cls, path: str | Path) -> HospitalConfig:
        """Load a config; relative paths are taken from the config's folder."""
        return load_toml_model(cls, path, what="hospital config", prepare=_relative("dictionary"))


#: the one line every path that resolves a hospital config says when :func:`dp_default_model` applies
#: (`clinograph simulate`, `clinograph model init`, the hospital's SuperNode, the ServerApp's log and audit)
DP_DEFAULT_MODEL_LINE = ("model: the wide path alone ([model] deep = false), the SDK's default under [privacy] "
                         "(docs/privacy.md); write [model] deep = true for the GNN")


def dp_default_model(config: HospitalConfig) -> bool:
    """Whether ``config`` trains the SDK's DP default model: the wide path alone (``[model] deep =
    false``, a federated logistic regression over every dictionary feature) instead of the GNN.
    True also once the rule has applied (the derived ``deep = false`` is not the operator's).

    The rule is data-independent: binary static NS-FL under ``[privacy]`` (local or distributed
    DP), without private model choice (``[selection] enabled = true`` chooses among the default
    candidates, which include the wide path), whose operator did not write ``[model] deep`` (an
    explicit ``deep = true`` keeps the GNN). Why: under DP noise at a few hundred patients the GNN
    did not train and the wide path did; chosen on VALIDATION AUROC among a grid fixed in advance
    (research/private_selection/README.md, "The production DP setting, chosen on validation";
    docs/privacy.md). A survival target, the temporal model and modalities keep the GNN (not measured).
    """
    m, p = config.model, config.privacy
    return bool(p.enabled and config.task == "nsfl" and config.target.kind == "binary"
                and "deep" not in m.model_fields_set and m.linear_path and m.temporal == "none"
                and not m.modalities and config.selection.enabled is not True)


#: a database URL (``postgresql+psycopg://reader@db/cdm``, ``duckdb:///cdm.duckdb``): not a path (a Path would
#: fold its ``//`` and the config would join it to its folder)
DatabaseUrl = Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9+.\-]*://[^\x00\s]+$")]


class HospitalEntry(_Strict):
    """[[hospitals]]: one site's table and schema, for a federation run in one process (deployed
    hospitals are SuperNodes with their own data folders). ``schema`` may be an EHR source file
    (``[omop]``, ``[meds]``, ``[fhir]``); ``table`` is then the source's location (a CDM folder or
    .duckdb file, a MEDS root, a FHIR export), read as ``clinograph check`` reads it."""

    site: str
    #: a file or folder, or (an EHR source file's OMOP CDM) a database URL, kept as written
    table: DatabaseUrl | Path
    schema_file: Path = Field(alias="schema")


class SimulationSection(_Strict):
    """[simulation]: how ``clinograph simulate`` uses this machine; results are the same either way."""

    workers: Literal["auto"] | StrictInt = Field(default="auto", description=(
        "worker processes the simulated hospitals' work runs in, in parallel: 1 = all in this process, one "
        "after another; N >= 2 = at most N forked workers (never more than hospitals); 'auto' = one per usable "
        "core not busy with other work, at most one per hospital (1 on a busy or one-core machine, and off Linux; "
        "docs/quickstart.md)"))
    reply_timeout: float | None = Field(default=None, gt=0, description=(
        "seconds a worker process may take to answer one message (all its hospitals' answers) before it is "
        "stopped and its hospitals count as silent (the run then stops with a WorkerError naming them); unset: "
        "no limit, as a serial run waits on a hospital"))

    @field_validator("workers")
    @classmethod
    def _positive(cls, value: str | int) -> str | int:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"workers = {value}: write 'auto' or a count >= 1 (1 = no worker processes)")
        return value

    def worker_count(self, hospitals: int, *, load: float | None = None) -> int:
        """How many workers a run with ``hospitals`` hospitals uses (1: none, all in this process).

        'auto': the usable cores not already busy with other work -- ``load`` (default:
        :func:`clinograph.secure.runtime.workers.busy_cores`), less one for this process itself, rounded down -- at most
        one per hospital, at least 1. On a machine already running more than its cores (a test suite
        on parallel workers, other jobs) another process only adds forks and switches, so it is 1.
        Off Linux it is 1: on macOS Python's docs call fork unsafe (system libraries start threads)."""
        if self.workers != "auto":
            return max(1, min(int(self.workers), hospitals))
        import math
        import os
        import sys

        if not sys.platform.startswith("linux"):
            return 1

        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        quota = cpu_quota()
        if quota is not None:  # a container's CPU limit: cores it may use, whatever the machine has
            usable = min(usable, max(1, math.floor(quota)))
        if load is None:
            from clinograph.secure.runtime.workers import busy_cores

            load = busy_cores()
        idle = usable - math.floor(max(0.0, load - 1.0))
        return max(1, min(idle, hospitals))


def cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """Cores this process's cgroup may use (its CFS quota ÷ period: cgroup v2 ``cpu.max``, or v1's
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), or None when there is no limit or no cgroup file."""
    try:
        if (root / "cpu.max").is_file():
            quota, period = (root / "cpu.max").read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        v1 = root / "cpu"
        if (v1 / "cpu.cfs_quota_us").is_file():
            quota_us = int((v1 / "cpu.cfs_quota_us").read_text())
            return None if quota_us < 0 else quota_us / int((v1 / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None


class SimulationConfig(HospitalConfig):
    """A whole simulated federation: the server's [federation], the tables, and every hospital's
    settings (the fields of :class:`HospitalConfig`, shared by all simulated hospitals)."""

    OTHER_FILES_KEYS: ClassVar[dict[str, str]] = {
        "dp_policy": "[dp_policy] is server.toml's section; a simulation has one config for every party and its "
                     "server checks the hospitals' own [privacy] settings: leave [dp_policy] out (docs/privacy.md)"}

    federation: FederationSection = Field(default_factory=FederationSection)
    simulation: SimulationSection = Field(default_factory=SimulationSection)
    hospitals: tuple[HospitalEntry, ...] = ()
    output: Path = Field(default=Path("runs/simulation"), description="the run's folder; in a TOML file a "
                         "relative path is taken from the config file's folder, like `dictionary` and the "
                         "hospitals' paths")

    @model_validator(mode="after")
    def _one_step_a_round(self) -> SimulationConfig:
        """Distributed DP trains one DP-SGD step a round (NS-FL eq. 6), which every hospital checks of
        the plan: an unwritten ``[federation] local_epochs`` (default 2) becomes 1 under ``[privacy] mode
        = "distributed"``; a written one above 1 is refused here, before anything is written (before,
        every hospital refused round 0's plan and the run aborted with an audit directory left behind)."""
        fed = self.federation
        if not (self.privacy.enabled and self.privacy.mode == "distributed") or fed.local_epochs == 1:
            return self
        if "local_epochs" in fed.model_fields_set:
            raise ValueError(f"[federation] local_epochs = {fed.local_epochs} with [privacy] mode = 'distributed': a "
                             "distributed-DP round is one DP-SGD step (NS-FL eq. 6), which every hospital checks of "
                             "the plan. Set local_epochs = 1 (or remove it: 1 is the default under distributed DP).")
        object.__setattr__(self, "federation", _derived(fed, "local_epochs", 1))
        return self

    @model_validator(mode="after")
    def _one_seed(self) -> SimulationConfig:
        """The one-seed rule: ``[federation] seed`` is the seed of every seeded part -- ``[split] seed``,
        ``[model] init_seed`` and ``[training] seed`` -- unless that setting is given explicitly
        (pydantic's ``model_fields_set``: a key written in the TOML, or passed to the section).
        Changing the federation seed alone therefore moves the split, the initial weights and the
        local training order together; an explicit setting pins its part. The rule runs when a
        config is validated (TOML, ``model_validate``, the constructor); ``model_copy(update=...)``
        does not re-run it, so change the federation seed by validating a new config."""
        seed = self.federation.seed
        for section, key in (("split", "seed"), ("model", "init_seed"), ("training", "seed")):
            part = getattr(self, section)
            if key not in part.model_fields_set and getattr(part, key) != seed:
                object.__setattr__(self, section, _derived(part, key, seed))  # a later rule may move it again
        return self

    def hospital_config(self) -> HospitalConfig:
        """The settings every simulated hospital uses (DP calibrated over this run's rounds)."""
        privacy = self.privacy.model_copy(update={
            "planned_rounds": self.privacy.planned_rounds or self.federation.rounds,
            "planned_local_epochs": self.privacy.planned_local_epochs or self.federation.local_epochs,
            "state_dir": self.privacy.state_dir or self.output / "privacy_state"})
        own = {name: getattr(self, name) for name in HospitalConfig.model_fields}
        release = self.release  # the simulation's owner chose the mode for every party
        if self.federation.secure_mode == "insecure_plaintext":
            release = release.model_copy(update={"insecure_accept_plaintext": True})
        elif self.federation.secure_mode not in release.secure_modes:
            release = release.model_copy(update={"secure_modes": (*release.secure_modes, self.federation.secure_mode)})
        if self.federation.masked_threshold is not None and release.masked_threshold is None:
            release = release.model_copy(update={"masked_threshold": self.federation.masked_threshold})
        return HospitalConfig(**{**own, "privacy": privacy, "selection": self._selection(), "release": release})

    def _selection(self) -> SelectionSection:
        """An adaptive server optimiser (FedOpt, FedAdam, FedYogi) is not linear in the summed
        module: selection cannot decode the validation loss from it, so it is off by default."""
        from clinograph.secure.strategies import linear_in_sums

        if not linear_in_sums(self.federation.strategy) and self.selection.enabled is None:
            return self.selection.model_copy(update={"enabled": False})
        return self.selection

    def dp_policy(self) -> DPPolicySection | None:
        """The policy the server checks: the hospitals' own DP settings, when DP is on."""
        if not self.privacy.enabled:
            return None
        # the hospitals' PRV ε cannot be checked by the server: choosing it names the gap (warned, audited)
        return DPPolicySection(max_epsilon=self.privacy.epsilon_budget, delta=self.privacy.delta,
                               max_clip_norm=self.privacy.clip_norm,
                               insecure_unchecked_prv=self.privacy.accountant == "prv")

    def require_dictionary(self) -> Path:
        """The feature dictionary's path; ConfigError when the config names none (no default: a
        silent default would map the tables onto the demo's ontology). Checked before anything is
        ingested or imported for the run, so the error comes at once."""
        if self.dictionary is None:
            from clinograph.core.errors import ConfigError

            raise ConfigError("The config names no feature dictionary: set `dictionary = \"path/to/dictionary.toml\"` "
                              "(the same file every hospital uses; examples/data/dictionary.toml is the demo's). "
                              "There is no default: a silent default would map your tables onto the demo's ontology.")
        return Path(self.dictionary)

    @classmethod
    @checked_arguments
    def from_toml(cls, path: str | Path) -> SimulationConfig:  # type: ignore[override]
        """Load a config; relative paths are taken from the config's folder."""
        return load_toml_model(cls, path, what="config", prepare=_relative("dictionary", "output", hospitals=True))


def _relative(*keys: str, hospitals: bool = False):
    def prepare(data: dict, p: Path) -> None:
        base = p.parent
        for key in keys:
            if isinstance(data.get(key), str) and not Path(data[key]).is_absolute():
                data[key] = str(base / data[key])
        if hospitals:
            entries = data.get("hospitals")  # anything but an array of tables is the model's to refuse, by key
            for h in entries if isinstance(entries, list) else ():
                for key in ("table", "schema"):
                    if isinstance(h, dict) and isinstance(h.get(key), str) and not Path(h[key]).is_absolute() \
                            and "://" not in h[key]:  # a database URL (an OMOP CDM's) is no path
                        h[key] = str(base / h[key])

    return prepare
