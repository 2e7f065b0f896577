"""What an exported model is, as data: a strict description, signed by the hospital.

An export is two files: the weights in safetensors (a JSON header and raw tensor bytes, nothing
that runs) and ``<weights>.json``, a :class:`SignedDescription` envelope around a
:class:`ModelDescription`: the NS-FL settings that rebuild the star-path model, the feature
dictionary's hash and ids, the calibration, the kept round, the survival grid -- and the
SHA-256 of the weights file. The hospital signs the description's exact bytes with its Ed25519
identity (label :data:`~clinograph.core.labels.SIG_MODEL_DESCRIPTION`); a loader
verifies the signature against a key it trusts, then the digest against the bytes it read,
before it parses a single tensor.

Guarantees: a description that verifies under the trusted key names the only weights file it
accepts (any changed byte changes the digest), and only architectures Clinograph builds itself
can be described (no code, no class names, unknown keys refused). Does not guarantee: that
the hospital's key was not stolen, or that a validly signed model is a good one (the outputs
are range-checked at prediction, :mod:`.load`).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from pathlib import Path
from typing import Literal

from clinograph.secure.messages import ID_PATTERN
from clinograph.secure.runtime.config import StrictSection
from pydantic import Field, ValidationError, model_validator

from clinograph.core.errors import ConfigValidationError, IntegrityError
from clinograph.core.fields import RoundNumber
from clinograph.core.identity import Identity, PublicIdentity
from clinograph.core.labels import SIG_MODEL_DESCRIPTION

from ..config import NSFLConfig

FORMAT = "clinograph-nsfl-star/2"
SURVIVAL_FORMAT = "clinograph-nsfl-survival/2"
FORMATS = (FORMAT, SURVIVAL_FORMAT)
ENVELOPE = "clinograph-signed-model-description/1"
#: bound on a description file (a dictionary of a few thousand features fits many times over)
MAX_DESCRIPTION_BYTES = 4 * 2**20
INPUTS = "feature_index [B, K] int64, values [B, K] float32 (public-range standardised), mask [B, K] bool"


class Calibration(StrictSection):
    """Platt scaling σ(a · z + b) of the binary risk (``none``: a = 1, b = 0)."""

    method: Literal["platt", "none"]
    a: float = Field(allow_inf_nan=False)
    b: float = Field(allow_inf_nan=False)


class SurvivalOutputs(StrictSection):
    """The survival head's grid: interval ends, the horizons of the risk columns, their unit."""

    time_unit: str = Field(min_length=1, max_length=16)
    breaks: tuple[float, ...] = Field(min_length=1, max_length=200)
    horizons: tuple[float, ...] = Field(min_length=1, max_length=200)
    risk_columns: tuple[str, ...]

    @model_validator(mode="after")
    def _grid(self) -> SurvivalOutputs:
        b, h = self.breaks, self.horizons
        if not all(math.isfinite(x) for x in (*b, *h)) or b[0] <= 0 or any(y <= x for x, y in zip(b, b[1:], strict=False)):
            raise ValueError("breaks must be finite, positive and strictly increasing")
        if h[0] <= 0 or h[-1] > b[-1] or any(y <= x for x, y in zip(h, h[1:], strict=False)):
            raise ValueError(f"horizons must be strictly increasing in (0, {b[-1]:g}]")
        if len(self.risk_columns) != len(h):
            raise ValueError("risk_columns must name each horizon once")
        return self


class ReleaseBinding(StrictSection):
    """Where the weights' shared modules come from: the global model the server published (and
    signed) in its audit trail for ``round`` of ``federation_id``. Every module of the model not
    in ``personal_modules`` must equal it (as float32); those are the hospital's own, vouched for
    by its signature alone (:mod:`.release` checks it against a verified audit trail)."""

    federation_id: str = Field(pattern=ID_PATTERN)
    round: RoundNumber
    personal_modules: tuple[str, ...] = Field(max_length=10_000,
                                              description="[personal] modules: exact names or prefixes ending in /")


class ModelDescription(StrictSection):
    """Everything needed to rebuild an exported star-path model, and the weights it accepts."""

    format: Literal["clinograph-nsfl-star/2", "clinograph-nsfl-survival/2"]
    weights_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the safetensors file, hex")
    weights_bytes: int = Field(ge=8)
    model: NSFLConfig
    dictionary_hash: str = Field(min_length=1, max_length=128)
    features: tuple[str, ...] = Field(min_length=1, description="dictionary node ids, in node order")
    features_used: tuple[str, ...] = Field(description="the features the model reads ([model] features)")
    calibration: Calibration
    survival: SurvivalOutputs | None = None
    horizon: float | None = Field(default=None, gt=0, allow_inf_nan=False,
                                  description="survival: the configured [target] horizon")
    site: str = Field(min_length=1, max_length=256)
    selected_round: int | None = Field(default=None, ge=0)
    release: ReleaseBinding | None = Field(default=None, description="None: not exported from a federation round")
    inputs: str = INPUTS

    @model_validator(mode="after")
    def _consistent(self) -> ModelDescription:
        if self.model.temporal != "none" or self.model.modalities:
            raise ValueError("only the static star-path model is exported (model.temporal = 'none', no modalities)")
        if (self.format == SURVIVAL_FORMAT) != (self.survival is not None):
            raise ValueError(f"a {SURVIVAL_FORMAT} description, and only it, carries 'survival'")
        chosen = self.model.features
        selected = tuple(f for f in self.features if chosen == "all" or f in set(chosen))
        if tuple(self.features_used) != selected:
            raise ValueError("features_used must be the dictionary features that model.features selects "
                             "(all of them for \"all\"), in dictionary order")
        return self


class SignedDescription(StrictSection):
    """The file beside the weights: the description's exact signed text and its signature."""

    format: Literal["clinograph-signed-model-description/1"]
    description: str = Field(description="the JSON text of the ModelDescription, exactly as signed")
    signer: str = Field(min_length=1, max_length=256)
    public_key: str = Field(description="the signer's Ed25519 public key, base64 (informative: trust comes "
                            "from the key the loader is given, never from this field)")
    signature: str


def sign_description(description: ModelDescription, *, signer: Identity) -> bytes:
    """The envelope's bytes: ``description`` as canonical JSON, signed by ``signer``."""
    text = json.dumps(description.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    sig = signer.sign(text.encode(), context=SIG_MODEL_DESCRIPTION)
    env = SignedDescription(format=ENVELOPE, description=text, signer=signer.name, public_key=signer.public.b64(),
                            signature=base64.b64encode(sig).decode())
    return json.dumps(env.model_dump(mode="json"), indent=1).encode()


def open_description(data: bytes, *, source: Path, trusted: PublicIdentity | None) -> ModelDescription:
    """The description in envelope ``data`` (read from ``source``), its signature verified under
    ``trusted``; ``trusted=None`` skips the signature (only for ``insecure_untrusted_model``).

    Raises:
        IntegrityError: not an envelope, a signature that does not verify under ``trusted``, or a
            description that is not a complete, valid :class:`ModelDescription`.
    """
    again = "Re-export the model with NSFLTask.export (safetensors weights + signed description)."
    try:
        env = SignedDescription.model_validate_json(data)
    except (ValidationError, ConfigValidationError) as exc:  # the latter: a ConfigModel's
        raise IntegrityError(f"Model description {source} is not a signed model description "
                             f"({ENVELOPE}): {_problems(exc)}. {again}") from None
    if trusted is not None:
        try:
            signature = base64.b64decode(env.signature, validate=True)
        except (binascii.Error, ValueError):
            signature = b""
        try:
            trusted.verify(signature, env.description.encode(), context=SIG_MODEL_DESCRIPTION)
        except IntegrityError:
            raise IntegrityError(
                f"Model description {source}: its signature does not verify under the trusted key of "
                f"{trusted.name!r} (fingerprint {trusted.fingerprint[:16]}); it names signer {env.signer!r}. The "
                "description or its signature was changed, or another key signed it. Fix: use the model the "
                "hospital exported, and pass that hospital's public key as --trusted-key.") from None
    try:
        return ModelDescription.model_validate_json(env.description)
    except (ValidationError, ConfigValidationError) as exc:  # the latter: a ConfigModel's
        raise IntegrityError(f"Model description {source} is signed but not a valid {', '.join(FORMATS)} "
                             f"description: {_problems(exc)}. {again}") from None


def _problems(exc: ValidationError | ConfigValidationError) -> str:
    """Every location and message of a validation error (never the input values), then their
    count, so a description missing several keys is mended in one pass."""
    errors = exc.errors()
    shown = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or '(top)'}: {e['msg'].removeprefix('Value error, ')}"
                      for e in errors[:_MAX_SHOWN])
    more = f"; and {len(errors) - _MAX_SHOWN} more" if len(errors) > _MAX_SHOWN else ""
    return f"{shown}{more} ({len(errors)} problem(s))"


_MAX_SHOWN = 100  # a description has a few dozen keys: every one can be named
