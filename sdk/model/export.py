"""Use a trained model without the federation: per-patient risks for new patients, and a
TorchScript file a hospital loads on its own.

The exported file is the star forward path (:meth:`NSFLModel.forward_star`, no ``similar_to``:
new patients are not in the training graph) with the hospital's personal modules and Platt
calibration folded in, traced with TorchScript. A sidecar JSON (``<file>.json``) names the
feature dictionary by its content hash and lists its feature ids in node order, so a loader can
refuse a table mapped onto another dictionary. Inputs are what
:func:`clinograph.sdk.graph.star.star_batch` builds from an ingested table.

What the file does not hold: patient data, the training table, the federation's keys.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from clinograph.secure.errors import SchemaError
from torch import nn

from ..graph.star import star_batch
from ..ingest.table import PatientTable
from ..ontology.dictionary import FeatureDictionary
from .nsfl import NSFLModel

FORMAT = "clinograph-nsfl-star/1"


class StarRisk(nn.Module):
    """σ(a · z + b) over the star path's logit z. Shapes: [B, K] x3 -> [B]."""

    def __init__(self, model: NSFLModel, *, a: float = 1.0, b: float = 0.0):
        super().__init__()
        self.model = model
        self.register_buffer("a", torch.tensor(float(a)))
        self.register_buffer("b", torch.tensor(float(b)))

    def forward(self, feature_index: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        z = self.model.forward_star(feature_index, values, mask)
        return torch.sigmoid(self.a * z + self.b)


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
                 meta: dict | None = None) -> tuple[Path, Path]:
    """Write the TorchScript star model to ``path`` and its sidecar to ``path + '.json'``.

    Returns:
        (model file, sidecar file).
    """
    path = Path(path)
    a, b = (calibration.a, calibration.b) if calibration is not None else (1.0, 0.0)
    model.eval()
    wrapped = StarRisk(model, a=a, b=b).eval()
    example = (torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool))
    with torch.no_grad():
        traced = torch.jit.trace(wrapped, example, check_trace=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    traced.save(str(path))
    sidecar = path.with_name(path.name + ".json")
    sidecar.write_text(json.dumps({
        "format": FORMAT, "dictionary_hash": dictionary.digest(), "features": list(dictionary.node_ids()),
        "calibration": {"method": "platt" if calibration is not None else "none", "a": a, "b": b},
        "inputs": "feature_index [B, K] int64, values [B, K] float32 (public-range standardised), mask [B, K] bool",
        **(meta or {})}, indent=2, sort_keys=True))
    return path, sidecar


def load_exported(path: str | Path) -> tuple[torch.jit.ScriptModule, dict]:
    """The TorchScript model and its sidecar (refused if the sidecar is not this format)."""
    path = Path(path)
    sidecar = path.with_name(path.name + ".json")
    if not sidecar.exists():
        raise SchemaError([f"{sidecar} is missing: an exported model travels with its sidecar JSON "
                           "(dictionary hash, features)."], title="Model sidecar missing")
    info = json.loads(sidecar.read_text())
    if info.get("format") != FORMAT:
        raise SchemaError([f"{sidecar}: format {info.get('format')!r}, expected {FORMAT!r}."],
                          title="Unknown model format")
    return torch.jit.load(str(path)), info


@torch.no_grad()
def predict_exported(module: torch.jit.ScriptModule, info: dict, table: PatientTable) -> np.ndarray:
    """Risks for ``table`` from a loaded export (the dictionary hash is checked)."""
    _check_dictionary(table, str(info["dictionary_hash"]))
    return module(*star_inputs(table)).double().numpy()
