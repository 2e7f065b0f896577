"""Use a trained model without the federation: per-patient risks for new patients, and a
TorchScript file a hospital loads on its own.

The exported file is the star forward path (:meth:`NSFLModel.forward_star`, no ``similar_to``:
new patients are not in the training graph) with the hospital's personal modules and Platt
calibration folded in, traced with TorchScript. A sidecar JSON (``<file>.json``) names the
feature dictionary by its content hash and lists its feature ids in node order, so a loader can
refuse a table mapped onto another dictionary. Inputs are what
:func:`clinograph.sdk.graph.star.star_batch` builds from an ingested table.

A survival model (``[target] kind = "survival"``, :mod:`clinograph.sdk.model.heads`) exports as
:class:`StarSurvival` under its own format (``clinograph-nsfl-survival/1``): the module gives the
hazard h_k per interval, S(b_k) at the interval ends and the risk 1 − S(t) at each horizon t
(Gensheimer & Narasimhan 2019, eq. 1; log-linear inside an interval, as
:func:`clinograph.sdk.training.survival.risk_at`), in float64; the sidecar adds the interval
grid, the horizons, their time unit and the names of the risk columns.

What the file does not hold: patient data, the training table, the federation's keys.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import torch
from clinograph.secure.errors import SchemaError
from clinograph.secure.fileio import atomic_write
from torch import nn

from ..graph.star import star_batch
from ..ingest.table import PatientTable
from ..ontology.dictionary import FeatureDictionary
from .nsfl import NSFLModel

FORMAT = "clinograph-nsfl-star/1"
SURVIVAL_FORMAT = "clinograph-nsfl-survival/1"
FORMATS = (FORMAT, SURVIVAL_FORMAT)


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


def export_model(model: NSFLModel, path: str | Path, *, dictionary: FeatureDictionary, calibration=None,
                 meta: dict | None = None, features: object = "all") -> tuple[Path, Path]:
    """Write the TorchScript star model to ``path`` and its sidecar to ``path + '.json'``
    (``features``: ``[model] features``; the module ignores the others, the sidecar lists them
    as ``features_used``).

    Returns:
        (model file, sidecar file).
    """
    a, b = (calibration.a, calibration.b) if calibration is not None else (1.0, 0.0)
    model.eval()
    keep = feature_keep(dictionary, features)
    return _write(StarRisk(model, a=a, b=b, keep=keep).eval(), path, {
        "format": FORMAT, "dictionary_hash": dictionary.digest(), "features": list(dictionary.node_ids()),
        "features_used": _used(dictionary, keep),
        "calibration": {"method": "platt" if calibration is not None else "none", "a": a, "b": b},
        "inputs": INPUTS, **(meta or {})})


def _used(dictionary: FeatureDictionary, keep: torch.Tensor) -> list[str]:
    return [f for f, k in zip(dictionary.node_ids(), keep.tolist(), strict=True) if k]


INPUTS = "feature_index [B, K] int64, values [B, K] float32 (public-range standardised), mask [B, K] bool"


def _write(wrapped: nn.Module, path: str | Path, info: dict) -> tuple[Path, Path]:
    path = Path(path)
    example = (torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool))
    with torch.no_grad():
        traced = torch.jit.trace(wrapped, example, check_trace=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.jit.save(traced, buf)
    sidecar = path.with_name(path.name + ".json")
    # Each file replaced atomically, the model first: a reader (or a hospital killed mid-export)
    # never sees a torn file; the sidecar names the dictionary hash that load_exported checks.
    atomic_write(path, buf.getvalue())
    atomic_write(sidecar, json.dumps(info, indent=2, sort_keys=True))
    return path, sidecar


def export_survival_model(model: nn.Module, path: str | Path, *, dictionary: FeatureDictionary,
                          breaks: list[float] | tuple[float, ...], horizons: list[float] | tuple[float, ...],
                          time_unit: str, meta: dict | None = None, features: object = "all") -> tuple[Path, Path]:
    """Write a survival model as TorchScript of :class:`StarSurvival` to ``path`` and its sidecar
    (format, dictionary hash, features, ``features_used``, ``breaks``, ``horizons``, ``time_unit``,
    risk columns) to ``path + '.json'``. ``breaks`` and ``horizons`` are in ``time_unit``, as in
    ``[target]``; ``features``: ``[model] features`` (the module ignores the others).

    Returns:
        (model file, sidecar file).

    Raises:
        ConfigError: a horizon outside (0, b_K], or breaks that are not increasing.
    """
    from clinograph.secure.errors import ConfigError

    ends, hs = np.asarray(breaks, float), np.asarray(horizons, float)
    if len(ends) == 0 or ends[0] <= 0 or np.any(np.diff(ends) <= 0):
        raise ConfigError(f"Survival export: breaks {list(ends)} must be positive and strictly increasing.")
    bad = [float(h) for h in hs if not 0 < h <= ends[-1]]
    if len(hs) == 0 or bad:
        raise ConfigError(f"Survival export: horizons {bad or '[]'} must be non-empty and lie in (0, {ends[-1]:g}] "
                          f"{time_unit} (the model has no hazard past the last break). Pick horizons within the "
                          "[target] breaks.")
    model.eval()
    keep = feature_keep(dictionary, features)
    return _write(StarSurvival(model, breaks=ends, horizons=hs, keep=keep).eval(), path, {
        "format": SURVIVAL_FORMAT, "dictionary_hash": dictionary.digest(), "features": list(dictionary.node_ids()),
        "features_used": _used(dictionary, keep),
        "time_unit": time_unit, "breaks": [float(x) for x in ends], "horizons": [float(x) for x in hs],
        "risk_columns": risk_columns(hs, time_unit), "inputs": INPUTS,
        "outputs": "hazard [B, K] per interval, survival S(b_k) [B, K], risk 1 - S(t) [B, H] at the horizons",
        **(meta or {})})


def load_exported(path: str | Path) -> tuple[torch.jit.ScriptModule, dict]:
    """The TorchScript model and its sidecar (refused if the sidecar is not this format)."""
    path = Path(path)
    sidecar = path.with_name(path.name + ".json")
    if not sidecar.exists():
        raise SchemaError([f"{sidecar} is missing: an exported model travels with its sidecar JSON "
                           "(dictionary hash, features)."], title="Model sidecar missing")
    try:
        info = json.loads(sidecar.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError):
        info = None
    if not isinstance(info, dict) or info.get("format") not in FORMATS:
        found = info.get("format") if isinstance(info, dict) else "not a JSON object"
        raise SchemaError([f"{sidecar}: format {found!r}, expected one of {', '.join(FORMATS)}. Give the "
                           "sidecar written with the model by NSFLTask.export."], title="Unknown model format")
    try:
        return torch.jit.load(str(path)), info
    except RuntimeError:
        raise SchemaError([f"{path} is not a TorchScript file. Give the .pt written by NSFLTask.export."],
                          title="Unreadable model file") from None


@torch.no_grad()
def predict_exported(module: torch.jit.ScriptModule, info: dict, table: PatientTable) -> np.ndarray:
    """Risks for ``table`` from a loaded binary export (the dictionary hash is checked).

    Raises:
        SchemaError: another dictionary, or a survival export (use :func:`predict_survival_exported`).
    """
    if info.get("format") == SURVIVAL_FORMAT:
        raise SchemaError(["This export is a survival model: it gives a risk per horizon. Use "
                           "predict_survival_exported."], title="Survival model")
    _check_dictionary(table, str(info["dictionary_hash"]))
    return module(*star_inputs(table)).double().numpy()


@torch.no_grad()
def predict_survival_exported(module: torch.jit.ScriptModule, info: dict,
                              table: PatientTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hazard [n, K], survival S(b_k) [n, K], risk 1 − S(t) [n, H] at ``info['horizons']``) for
    ``table`` from a loaded survival export (the dictionary hash is checked).

    Raises:
        SchemaError: another dictionary, or a binary export (use :func:`predict_exported`).
    """
    if info.get("format") != SURVIVAL_FORMAT:
        raise SchemaError([f"This export is {info.get('format')!r}, not a survival model. Use predict_exported."],
                          title="Not a survival model")
    _check_dictionary(table, str(info["dictionary_hash"]))
    hazard, survival, risk = module(*star_inputs(table))
    return hazard.numpy(), survival.numpy(), risk.numpy()
