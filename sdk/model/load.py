"""Load an exported model as data and score new patients with range-checked outputs.

:func:`load_exported` reads the weights file once, verifies the signed description
(:mod:`.description`) under a key the caller trusts, checks the SHA-256 of the bytes it read
against the description, and only then parses them as safetensors into a model Clinograph
builds itself from the description's settings. Nothing in either file is executed: a TorchScript
or pickle file is refused by its first bytes, before anything else is read from it.

Every risk it returns has been checked: probabilities finite and in [0, 1], survival curves
non-increasing in time, horizon risks non-decreasing. A violation is an
:class:`~clinograph.core.errors.IntegrityError`, never output.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from clinograph.secure.policy import Environment, require_allowed
from torch import nn

from clinograph.core.errors import ConfigError, IntegrityError, SchemaError
from clinograph.core.fileio import read_regular
from clinograph.core.identity import PublicIdentity

from ..ingest.table import PatientTable
from ..seeding import torch_seeded
from .description import MAX_DESCRIPTION_BYTES, SURVIVAL_FORMAT, ModelDescription, open_description
from .export import StarRisk, StarSurvival, _check_dictionary, star_inputs
from .heads import SurvivalNSFLModel
from .nsfl import NSFLModel

#: bound on a weights file (NS-FL over 10 000 features at hidden 1024 is ~100 MB)
MAX_WEIGHTS_BYTES = 2 * 2**30
_CODE_MAGIC = {b"PK\x03\x04": "a zip archive (TorchScript or torch.save)", b"\x80": "a Python pickle"}
_SLACK = 1e-9  # float64 round-off allowed in the monotonicity checks


@dataclass(frozen=True)
class ExportedModel:
    """A loaded export: the module (:class:`StarRisk` or :class:`StarSurvival`) and its verified description."""

    module: nn.Module
    description: ModelDescription
    path: Path
    #: the federation round whose released global model the shared modules were checked against
    #: (None: not checked against an audit trail)
    released_round: int | None = None


def load_exported(path: str | Path, *, trusted: PublicIdentity | None, insecure_untrusted_model: bool = False,
                  environment: Environment = "development", audit_dir: Path | None = None,
                  server: PublicIdentity | None = None) -> ExportedModel:
    """The model exported to ``path`` (weights) and ``path + '.json'`` (signed description).

    Secure by default, both anchors are required: the hospital's signature on the description
    (``trusted``) and the federation's verified audit trail (``audit_dir`` and ``server``), in
    which the server released the shared modules and signed the model settings
    (:func:`.release.check_release`). ``insecure_untrusted_model`` loads without whichever of the
    two is not given (warns every time; refused in production); what is given is still checked.
    A federation whose server never holds the global model (``ckks``, distributed DP) publishes
    none, so its exports load only under that option.

    Args:
        trusted: the exporting hospital's public key; the description must be signed by it.
        insecure_untrusted_model: allow a missing ``trusted`` key or audit trail. The description
            is still parsed strictly and the weights' digest still checked.
        audit_dir, server: the federation's audit directory and the server's public key (both or
            neither): the shared modules must be the global model the server published and
            released for the round the description names, under the settings the round's signed
            plan carried, checked on the parsed tensors before the model computes anything.

    Raises:
        ConfigError: no trusted key or no audit trail without the insecure option, or a file
            that is missing.
        IntegrityError: a code file (TorchScript, pickle), a description that is unsigned, signed by
            another key, incomplete or not for these weights, weights that do not fit it, or a
            release check that fails.
    """
    path = Path(path)
    sidecar = path.with_name(path.name + ".json")
    if (audit_dir is None) != (server is None):
        raise ConfigError(f"Model {path}: checking its release needs both the federation's audit directory and the "
                          "server's public key (audit_dir= and server=; CLI: --audit and --server-key). Fix: give both, or neither.")
    missing = [what for what, absent in (("the signature of its description", trusted is None),
                                         ("the release in an audit trail", audit_dir is None)) if absent]
    if trusted is None and not insecure_untrusted_model:
        raise ConfigError(f"Model {path}: no trusted key to check its description's signature. Fix: pass the "
                          "exporting hospital's public key (its public_key in federation.toml) as trusted= (CLI: --trusted-key), "
                          "or insecure_untrusted_model=True (--insecure-untrusted-model) to load a model nobody "
                          "vouches for.")
    if audit_dir is None and not insecure_untrusted_model:
        raise ConfigError(f"Model {path}: no audit trail to check it against: only the federation's verified audit "
                          "trail shows that its shared weights and model settings are what the server released. Fix: "
                          "pass the federation's audit directory as audit_dir= and the server's public key as server= "
                          "(CLI: --audit and --server-key); a federation whose server never holds the global model "
                          "(ckks, distributed DP) publishes none: load its exports with insecure_untrusted_model=True "
                          "(--insecure-untrusted-model; the hospital's signature is still checked with trusted=, "
                          "--trusted-key).")
    if insecure_untrusted_model:
        require_allowed("insecure_untrusted_model", environment=environment, audited=False,
                        why=f"model {path.name} is loaded without checking {' or '.join(missing) or 'nothing'}")
    data = _read(path, limit=MAX_WEIGHTS_BYTES, what="weights file")
    kind = code_kind(data)
    if kind is not None:
        raise IntegrityError(f"Model {path} is {kind}: a file that runs code when loaded. Clinograph loads "
                             "models only as safetensors weights with a signed description, and never runs a "
                             "model file. Fix: re-export it with NSFLTask.export (writes model.safetensors + "
                             "model.safetensors.json).")
    if not _is_safetensors(data) and not sidecar.exists():  # a description or a CSV given as the weights
        looks = "JSON (a model description or a server's initial model)" if data.lstrip()[:1] in (b"{", b"[") else \
            "not a safetensors file"
        raise ConfigError(f"Model {path} is {looks}, not the weights of an export. Fix: pass the .safetensors "
                          "file NSFLTask.export wrote (model.safetensors; its description model.safetensors.json "
                          "must sit next to it).")
    description = open_description(_read(sidecar, limit=MAX_DESCRIPTION_BYTES, what="description"), source=sidecar,
                                   trusted=trusted)
    digest = hashlib.sha256(data).hexdigest()
    if digest != description.weights_sha256:
        raise IntegrityError(f"Model {path}: SHA-256 {digest[:16]}… of the weights, but its description {sidecar.name} "
                             f"names {description.weights_sha256[:16]}…. The weights were changed, or the description "
                             "belongs to another export. Fix: use the two files of one export, as the hospital wrote "
                             "them.")
    if len(data) != description.weights_bytes:
        raise IntegrityError(f"Model {path}: {len(data)} bytes of weights, but its description {sidecar.name} names "
                             f"{description.weights_bytes}. The description was edited. Fix: use the two files of one "
                             "export, as the hospital wrote them.")
    module = _build(description, data, path)
    released = None
    if audit_dir is not None and server is not None:
        from .release import check_release

        released = check_release(description, module, audit_dir=Path(audit_dir), server=server, source=path)
    return ExportedModel(module=module, description=description, path=path, released_round=released)


def _is_safetensors(data: bytes) -> bool:
    """The safetensors layout: an 8-byte little-endian header length, then that many bytes of JSON header."""
    n = int.from_bytes(data[:8], "little") if len(data) >= 8 else -1
    return 0 < n <= len(data) - 8 and data[8:9] == b"{"


def code_kind(data: bytes) -> str | None:
    """What ``data`` is if it is a format that runs code when loaded (TorchScript or ``torch.save``
    zip, pickle), else None. A safetensors file (8-byte little-endian header length, then a JSON
    header) is never one, whatever its first byte."""
    if _is_safetensors(data):
        return None
    return next((kind for magic, kind in _CODE_MAGIC.items() if data.startswith(magic)), None)


def _read(path: Path, *, limit: int, what: str) -> bytes:
    try:
        return read_regular(path, limit=limit)
    except FileNotFoundError:
        raise ConfigError(f"Model {what} {path} is missing: an export is the weights file and its description "
                          "<weights>.json side by side. Fix: copy both files of the export.") from None
    except OSError as exc:
        raise ConfigError(f"Model {what} {path} cannot be read ({exc}). Give the file NSFLTask.export wrote.") from None


def _build(d: ModelDescription, data: bytes, path: Path) -> nn.Module:
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        tensors = load(data)
    except (SafetensorError, ValueError, RuntimeError):
        raise IntegrityError(f"Model {path} is not a safetensors file. Re-export it with NSFLTask.export.") from None
    n = len(d.features)

    def architecture() -> nn.Module:
        return (SurvivalNSFLModel(n, d.model, intervals=len(d.survival.breaks)) if d.survival is not None
                else NSFLModel(n, d.model))

    with torch.device("meta"):  # shapes only: a description naming huge dimensions allocates nothing
        expected = architecture().state_dict()
    wrong = sorted(set(expected) ^ set(tensors)) + sorted(
        k for k in set(expected) & set(tensors)
        if tensors[k].shape != expected[k].shape or tensors[k].dtype != expected[k].dtype)
    if wrong:
        raise IntegrityError(f"Model {path}: the weights do not fit the architecture its description gives "
                             f"({len(wrong)} tensor(s) missing, extra or of the wrong shape or type, e.g. {wrong[0]!r}). "
                             "Re-export the model with NSFLTask.export.")
    with torch_seeded(0):  # its initial draws are overwritten below; the caller's generator is put back
        model = architecture()  # as large as the weights read, no larger
    model.load_state_dict(tensors, strict=True)
    model.eval()
    keep = torch.tensor([f in set(d.features_used) for f in d.features], dtype=torch.bool)
    if d.survival is not None:
        return StarSurvival(model, breaks=np.asarray(d.survival.breaks), horizons=np.asarray(d.survival.horizons),
                            keep=keep).eval()
    return StarRisk(model, a=d.calibration.a, b=d.calibration.b, keep=keep).eval()


@torch.no_grad()
def predict_exported(exported: ExportedModel, table: PatientTable) -> np.ndarray:
    """Risks for ``table`` from a loaded binary export (the dictionary hash is checked).
    Shapes: -> [table.n_patients].

    Raises:
        SchemaError: another dictionary, or a survival export (use :func:`predict_survival_exported`).
        IntegrityError: a risk not finite or outside [0, 1].
    """
    if exported.description.format == SURVIVAL_FORMAT:
        raise SchemaError(["This export is a survival model: it gives a risk per horizon. Use "
                           "predict_survival_exported."], title="Survival model")
    _check_dictionary(table, exported.description.dictionary_hash)
    risk = exported.module(*star_inputs(table)).double().numpy()
    check_probabilities(risk, source=exported.path, what="risks")
    return risk


@torch.no_grad()
def predict_survival_exported(exported: ExportedModel, table: PatientTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hazard [n, K], survival S(b_k) [n, K], risk 1 − S(t) [n, H] at the description's horizons)
    for ``table`` from a loaded survival export (the dictionary hash is checked).

    Raises:
        SchemaError: another dictionary, or a binary export (use :func:`predict_exported`).
        IntegrityError: outputs not finite, outside [0, 1], or not monotone in time.
    """
    if exported.description.format != SURVIVAL_FORMAT:
        raise SchemaError([f"This export is {exported.description.format!r}, not a survival model. Use "
                           "predict_exported."], title="Not a survival model")
    _check_dictionary(table, exported.description.dictionary_hash)
    hazard, survival, risk = (t.numpy() for t in exported.module(*star_inputs(table)))
    check_survival(hazard, survival, risk, source=exported.path)
    return hazard, survival, risk


def check_probabilities(values: np.ndarray, *, source: Path | str, what: str) -> None:
    """Raise :class:`IntegrityError` unless every value is finite and in [0, 1] (the message
    gives counts only, never a patient's value)."""
    v = np.asarray(values, dtype=np.float64)
    bad = ~np.isfinite(v) | (v < 0.0) | (v > 1.0)
    if bad.any():
        rows = int(bad.reshape(len(v), -1).any(axis=1).sum()) if v.ndim else 1
        raise IntegrityError(f"Model {source} gave {what} that are not probabilities (not finite or outside [0, 1]) "
                             f"for {rows} of {len(v) if v.ndim else 1} patient(s); nothing was written. The weights "
                             "are corrupt or not a model Clinograph trained. Fix: re-export the model from the "
                             "hospital's training state.")


def check_survival(hazard: np.ndarray, survival: np.ndarray, risk: np.ndarray, *, source: Path | str) -> None:
    """Hazards, S(b_k) and horizon risks are probabilities; S is non-increasing along the intervals
    and the risk non-decreasing along the horizons (else :class:`IntegrityError`)."""
    for values, what in ((hazard, "hazards"), (survival, "survival probabilities"), (risk, "horizon risks")):
        check_probabilities(values, source=source, what=what)
    for values, what, sign in ((survival, "survival curves that rise in time", 1.0),
                               (risk, "risks that fall at a later horizon", -1.0)):
        rows = int((sign * np.diff(values, axis=1) > _SLACK).any(axis=1).sum())
        if rows:
            raise IntegrityError(f"Model {source} gave {what} for {rows} of {len(values)} patient(s); nothing was "
                                 "written. A survival curve cannot rise. Fix: re-export the model from the "
                                 "hospital's training state.")
