"""Use a trained model without the federation: per-patient risks for new patients, and an
export a hospital loads on its own -- as data, never as code.

The exported model is the star forward path (:meth:`NSFLModel.forward_star`, no ``similar_to``:
new patients are not in the training graph) with the hospital's personal modules and Platt
calibration. It is written as two files: the model's weights in safetensors (``path``; tensors
only, nothing that runs) and a signed description (``path + '.json'``,
:mod:`clinograph.sdk.model.description`): the NS-FL settings that rebuild the architecture, the
feature dictionary's content hash and feature ids in node order (a loader refuses a table
mapped onto another dictionary), the features used, the calibration, the kept round and the
SHA-256 of the weights file, signed with the hospital's Ed25519 identity.
:func:`clinograph.sdk.model.load.load_exported` verifies both before it builds the model.
Inputs are what :func:`clinograph.sdk.graph.star.star_batch` builds from an ingested table.

A survival model (``[target] kind = "survival"``, :mod:`clinograph.sdk.model.heads`) exports under
its own format (``clinograph-nsfl-survival/2``) and loads as :class:`StarSurvival`: the hazard h_k
per interval, S(b_k) at the interval ends and the risk 1 − S(t) at each horizon t (Gensheimer &
Narasimhan 2019, eq. 1; log-linear inside an interval, as
:func:`clinograph.sdk.training.survival.risk_at`), in float64; the description adds the interval
grid, the horizons, their time unit and the names of the risk columns.

``torchscript=True`` also writes ``path + '.torchscript.pt'`` for other runtimes. That file is
unsigned code; Clinograph itself never loads it (``clinograph predict`` refuses it).

What the files do not hold: patient data, the training table, the federation's keys.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import torch
from torch import nn

from clinograph.core.errors import ConfigError, SchemaError
from clinograph.core.fileio import atomic_write
from clinograph.core.identity import Identity

from ..graph.star import star_batch
from ..ingest.table import PatientTable
from ..ontology.dictionary import FeatureDictionary
from .description import (
    FORMAT,
    FORMATS,
    INPUTS,
    SURVIVAL_FORMAT,
    ModelDescription,
    sign_description,
)
from .nsfl import NSFLModel

__all__ = ["FORMAT", "FORMATS", "INPUTS", "SURVIVAL_FORMAT", "StarRisk", "StarSurvival", "export_model",
           "export_survival_model", "feature_keep", "risk_columns", "star_inputs", "star_risk"]


def feature_keep(dictionary: FeatureDictionary, features: object = "all") -> torch.Tensor:
    """[n_nodes] bool: the features a model reads (``[model] features``: ``"all"`` or a tuple of
    ids). The exported modules AND their input mask with it, so a loader that passes every
    observation still gets the model the federation trained."""
    ids = dictionary.node_ids()
    if features == "all":
        return torch.ones(len(ids), dtype=torch.bool)
    chosen = set(features)  # type: ignore[arg-type]
    return torch.tensor([f in chosen for f in ids], dtype=torch.bool)


class StarRisk(nn.Module):
    """σ(a · z + b) over the star path's logit z, reading only the ``keep`` features (all if
    None). Shapes: [B, K] x3 -> [B]."""

    def __init__(self, model: NSFLModel, *, a: float = 1.0, b: float = 0.0, keep: torch.Tensor | None = None):
        super().__init__()
        self.model = model
        self.register_buffer("a", torch.tensor(float(a)))
        self.register_buffer("b", torch.tensor(float(b)))
        self.register_buffer("keep", torch.ones(model.mask_logit.num_embeddings, dtype=torch.bool)
                             if keep is None else keep)

    def forward(self, feature_index: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        z = self.model.forward_star(feature_index, values, mask & self.keep[feature_index])
        return torch.sigmoid(self.a * z + self.b)


class StarSurvival(nn.Module):
    """Hazards, survival and horizon risks from the star path's hazard logits z (float64):
    h_k = σ(z_k); S(b_k) = Π_{j≤k}(1 − h_j) (Gensheimer & Narasimhan eq. 1); 1 − S(t) at each
    horizon with a constant hazard inside an interval.

    Args:
        model: a survival model (:class:`~clinograph.sdk.model.heads.SurvivalNSFLModel`).
        breaks: interval ends b_1 < ... < b_K. horizons: the times t of the risks (same unit,
            0 < t ≤ b_K).

    Shapes: [B, Kf] x3 -> (hazard [B, K], survival [B, K], risk [B, H]).
    """

    def __init__(self, model: nn.Module, *, breaks: np.ndarray, horizons: np.ndarray,
                 keep: torch.Tensor | None = None):
        super().__init__()
        self.model = model
        self.register_buffer("keep", torch.ones(model.mask_logit.num_embeddings, dtype=torch.bool)
                             if keep is None else keep)
        ends = np.asarray(breaks, float)
        starts = np.concatenate([[0.0], ends])
        hs = np.asarray(horizons, float)
        k = np.clip(np.searchsorted(ends, hs, side="left"), 0, len(ends) - 1)
        frac = np.clip((hs - starts[k]) / (ends[k] - starts[k]), 0.0, 1.0)
        self.register_buffer("k_lo", torch.as_tensor(k, dtype=torch.long))
        self.register_buffer("k_hi", torch.as_tensor(k + 1, dtype=torch.long))
        self.register_buffer("frac", torch.as_tensor(frac, dtype=torch.float64))

    def forward(self, feature_index: torch.Tensor, values: torch.Tensor,
                mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        z = self.model.forward_star(feature_index, values, mask & self.keep[feature_index]).double()
        log_s = torch.cumsum(-torch.logaddexp(torch.zeros_like(z), z), dim=1)  # log(1 − σ(z)) = −log(1 + e^z)
        log_s0 = torch.cat([torch.zeros_like(z[:, :1]), log_s], dim=1)
        lo, hi = log_s0[:, self.k_lo], log_s0[:, self.k_hi]
        return torch.sigmoid(z), torch.exp(log_s), 1.0 - torch.exp(lo + self.frac * (hi - lo))


def risk_columns(horizons: np.ndarray | list[float], time_unit: str) -> list[str]:
    """CSV column names of the horizon risks: ``risk_12mo``, ``risk_365d``."""
    return [f"risk_{float(h):g}{time_unit}" for h in horizons]


def _check_dictionary(table: PatientTable, digest: str) -> None:
    if table.dictionary.digest() != digest:
        raise SchemaError([f"Table of site {table.site!r} is mapped onto feature dictionary "
                           f"{table.dictionary.digest()[:12]}…, the model onto {digest[:12]}…. Ingest the table "
                           "with the dictionary the model was trained on."], title="Dictionary mismatch")


def star_inputs(table: PatientTable) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(feature_index, values, mask) of every patient's star, as the exported model takes them."""
    stars = star_batch(table, k_similar=0)
    return stars.feature_index, stars.values, stars.mask


@torch.no_grad()
def star_risk(model: NSFLModel, table: PatientTable, *, dictionary: FeatureDictionary, calibration=None) -> np.ndarray:
    """Risk per patient of ``table`` (``table.patient_ids`` order) from the star path, calibrated
    with ``calibration`` (a :class:`~clinograph.sdk.training.calibration.Platt`) when given."""
    _check_dictionary(table, dictionary.digest())
    a, b = (calibration.a, calibration.b) if calibration is not None else (1.0, 0.0)
    model.eval()
    return StarRisk(model, a=a, b=b)(*star_inputs(table)).double().numpy()


def export_model(model: NSFLModel, path: str | Path, *, dictionary: FeatureDictionary, signer: Identity,
                 calibration=None, meta: dict | None = None, features: object = "all",
                 torchscript: bool = False) -> tuple[Path, Path]:
    """Write the star model's weights (safetensors) to ``path`` and its signed description to
    ``path + '.json'`` (``features``: ``[model] features``; the loaded module ignores the others,
    the description lists them as ``features_used``; ``meta``: ``site``, ``selected_round``).

    Returns:
        (weights file, description file).
    """
    a, b = (calibration.a, calibration.b) if calibration is not None else (1.0, 0.0)
    model.eval()
    keep = feature_keep(dictionary, features)
    wrapped = StarRisk(model, a=a, b=b, keep=keep).eval() if torchscript else None
    return _write(model, path, signer=signer, torchscript=wrapped, fields={
        "format": FORMAT, "dictionary_hash": dictionary.digest(), "features": list(dictionary.node_ids()),
        "features_used": _used(dictionary, keep),
        "calibration": {"method": "platt" if calibration is not None else "none", "a": float(a), "b": float(b)},
        **(meta or {})})


def _used(dictionary: FeatureDictionary, keep: torch.Tensor) -> list[str]:
    return [f for f, k in zip(dictionary.node_ids(), keep.tolist(), strict=True) if k]


def _write(model: nn.Module, path: str | Path, *, signer: Identity, fields: dict,
           torchscript: nn.Module | None) -> tuple[Path, Path]:
    from safetensors.torch import save

    path = Path(path)
    if path.suffix in (".pt", ".pth", ".pkl", ".json"):
        raise ConfigError(f"Model export to {path}: a {path.suffix} name suggests code or a description. Name the "
                          f"weights file {path.with_suffix('.safetensors').name} (safetensors).")
    weights = save({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()})
    fields = {"site": signer.name, **fields}
    description = ModelDescription.model_validate({
        **fields, "model": model.config.model_dump(mode="json"), "weights_sha256": hashlib.sha256(weights).hexdigest(),
        "weights_bytes": len(weights)})
    path.parent.mkdir(parents=True, exist_ok=True)
    sidecar = path.with_name(path.name + ".json")
    # Each file replaced atomically, the weights first: a reader (or a hospital killed mid-export)
    # never sees a torn file; a description and weights from different exports never verify.
    atomic_write(path, weights)
    atomic_write(sidecar, sign_description(description, signer=signer))
    if torchscript is not None:  # for other runtimes only: Clinograph never loads it
        example = (torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool))
        with torch.no_grad():
            traced = torch.jit.trace(torchscript, example, check_trace=False)
        buf = io.BytesIO()
        torch.jit.save(traced, buf)
        atomic_write(path.with_name(path.name + ".torchscript.pt"), buf.getvalue())
    return path, sidecar


def export_survival_model(model: nn.Module, path: str | Path, *, dictionary: FeatureDictionary, signer: Identity,
                          breaks: list[float] | tuple[float, ...], horizons: list[float] | tuple[float, ...],
                          time_unit: str, meta: dict | None = None, features: object = "all",
                          torchscript: bool = False) -> tuple[Path, Path]:
    """Write a survival model's weights (safetensors) to ``path`` and its signed description
    (format, dictionary hash, features, ``features_used``, ``breaks``, ``horizons``, ``time_unit``,
    risk columns) to ``path + '.json'``. ``breaks`` and ``horizons`` are in ``time_unit``, as in
    ``[target]``; ``features``: ``[model] features`` (the loaded module ignores the others).

    Returns:
        (weights file, description file).

    Raises:
        ConfigError: a horizon outside (0, b_K], horizons not increasing, or breaks that are not
            increasing or do not match the model's intervals.
    """
    ends, hs = np.asarray(breaks, float), np.asarray(horizons, float)
    if len(ends) == 0 or ends[0] <= 0 or np.any(np.diff(ends) <= 0):
        raise ConfigError(f"Survival export: breaks {list(ends)} must be positive and strictly increasing.")
    bad = [float(h) for h in hs if not 0 < h <= ends[-1]]
    if len(hs) == 0 or bad:
        raise ConfigError(f"Survival export: horizons {bad or '[]'} must be non-empty and lie in (0, {ends[-1]:g}] "
                          f"{time_unit} (the model has no hazard past the last break). Pick horizons within the "
                          "[target] breaks.")
    if np.any(np.diff(hs) <= 0):
        raise ConfigError(f"Survival export: horizons {list(hs)} must be strictly increasing. Sort them and drop "
                          "repeats.")
    intervals = int(model.hazard_baseline.bias.numel())
    if intervals != len(ends):
        raise ConfigError(f"Survival export: {len(ends)} breaks for a model of {intervals} intervals. Give the "
                          "[target] breaks the model was trained with.")
    model.eval()
    keep = feature_keep(dictionary, features)
    wrapped = StarSurvival(model, breaks=ends, horizons=hs, keep=keep).eval() if torchscript else None
    return _write(model, path, signer=signer, torchscript=wrapped, fields={
        "format": SURVIVAL_FORMAT, "dictionary_hash": dictionary.digest(), "features": list(dictionary.node_ids()),
        "features_used": _used(dictionary, keep), "calibration": {"method": "none", "a": 1.0, "b": 0.0},
        "survival": {"time_unit": time_unit, "breaks": [float(x) for x in ends], "horizons": [float(x) for x in hs],
                     "risk_columns": risk_columns(hs, time_unit)},
        **(meta or {})})
