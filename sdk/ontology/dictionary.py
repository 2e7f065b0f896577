"""The global feature dictionary F (NS-FL eq. 5): canonical features with fixed indices.

Built before training and fixed for a run; its content hash travels in every message and a
mismatch is refused. Each numeric feature carries a *public* clinical reference range used for
standardisation (local means and variances would be a release of private statistics, see
docs/privacy.md) and physical limits beyond which a value is impossible.
"""

from __future__ import annotations

import hashlib
import json
import math
from difflib import get_close_matches
from enum import Enum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .codes import normalise_code

FEATURE_ID = r"^[a-z][a-z0-9_]{0,63}$"
_OPTIONAL_LATER = ("omop_concept_id", "molar_mass")


class FeatureKind(str, Enum):
    """How a feature's values are read."""

    NUMERIC = "numeric"
    BINARY = "binary"
    CATEGORICAL = "categorical"


class Feature(BaseModel):
    """One canonical clinical feature."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=FEATURE_ID)
    name: str = Field(min_length=1, max_length=200)
    kind: FeatureKind
    unit: str = "1"
    analyte: str | None = None
    aliases: tuple[str, ...] = ()
    codes: dict[str, str] = Field(default_factory=dict)
    reference_low: float | None = None
    reference_high: float | None = None
    physical_min: float | None = None
    physical_max: float | None = None
    levels: tuple[str, ...] = ()
    group: str | None = None
    #: OMOP CDM standard concept id (``measurement_concept_id`` / ``observation_concept_id``);
    #: LOINC and other vocabularies go in ``codes`` (``codes = { loinc = "2345-7" }``).
    omop_concept_id: int | None = Field(default=None, gt=0)
    #: Molar mass of the analyte in g/mol: allows mass <-> molar concentrations (mg/dL <-> mmol/L).
    molar_mass: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _consistent(self) -> Feature:
        for bound in ("reference_low", "reference_high", "physical_min", "physical_max"):
            v = getattr(self, bound)
            if v is not None and not math.isfinite(v):
                raise ValueError(f"feature {self.id!r}: {bound} is {'NaN' if math.isnan(v) else 'infinite'}; it must "
                                 "be a finite number (leave a physical limit out if there is none)")
        if self.kind == FeatureKind.NUMERIC:
            if self.reference_low is None or self.reference_high is None:
                raise ValueError(f"numeric feature {self.id!r} needs reference_low and reference_high (public ranges)")
            if not self.reference_low < self.reference_high:
                raise ValueError(f"feature {self.id!r}: reference_low must be < reference_high")
        if self.kind == FeatureKind.CATEGORICAL and len(self.levels) < 2:
            raise ValueError(f"categorical feature {self.id!r} needs at least two levels")
        norm = [normalise_code(lvl) for lvl in self.levels]
        same = sorted({lvl for lvl, n in zip(self.levels, norm, strict=True) if norm.count(n) > 1})
        if same or any(not n for n in norm):
            raise ValueError(f"feature {self.id!r}: levels must be non-empty and distinct ignoring case, spaces "
                             f"and number formatting; these coincide: {same}")
        if (self.physical_min is not None and self.physical_max is not None
                and not self.physical_min < self.physical_max):
            raise ValueError(f"feature {self.id!r}: physical_min must be < physical_max")
        return self

    def code_keys(self) -> set[str]:
        """Codes that name this feature in exchange formats, normalised as ``SYSTEM/CODE``.

        ``codes = { loinc = "2345-7" }`` gives ``LOINC/2345-7``; ``omop_concept_id`` gives
        ``OMOP/<id>``. The OMOP, MEDS and FHIR readers map codes through these.
        """
        keys = {f"{system.strip().upper()}/{code.strip()}" for system, code in self.codes.items()}
        if self.omop_concept_id is not None:
            keys.add(f"OMOP/{self.omop_concept_id}")
        return keys

    def standardise(self, value: float) -> float:
        """Public-range standardisation: (v − mid) / half-width, so the reference range maps to [−1, 1]."""
        if self.kind != FeatureKind.NUMERIC:
            return float(value)
        lo, hi = self.reference_low, self.reference_high
        return (float(value) - (lo + hi) / 2.0) / ((hi - lo) / 2.0)  # type: ignore[operator]

    def node_ids(self) -> list[str]:
        """Feature-node ids this feature contributes to the graph (one per level if categorical)."""
        if self.kind == FeatureKind.CATEGORICAL:
            return [f"{self.id}={lvl}" for lvl in self.levels]
        return [self.id]


class FeatureDictionary(BaseModel):
    """Versioned, hashed list of canonical features; the order fixes the node indices."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    version: int = Field(ge=1)
    features: tuple[Feature, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> FeatureDictionary:
        ids = [f.id for f in self.features]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"feature ids must be unique; repeated: {dupes}")
        owners: dict[str, set[str]] = {}
        for f in self.features:
            for term in (f.id, f.name, *f.aliases):
                owners.setdefault(term.strip().lower(), set()).add(f.id)
        shared = {term: sorted(fs) for term, fs in sorted(owners.items()) if len(fs) > 1}
        if shared:
            listed = "; ".join(f"{term!r} -> {', '.join(fs)}" for term, fs in shared.items())
            raise ValueError(f"an id, name or alias must belong to one feature; these belong to several: {listed}. "
                             "Remove the alias from all but one feature")
        code_owners: dict[str, list[str]] = {}
        for f in self.features:
            for key in f.code_keys():
                code_owners.setdefault(key, []).append(f.id)
        shared_codes = {k: fs for k, fs in sorted(code_owners.items()) if len(fs) > 1}
        if shared_codes:
            listed = "; ".join(f"{k} -> {', '.join(fs)}" for k, fs in shared_codes.items())
            raise ValueError(f"a code (codes or omop_concept_id) must belong to one feature; these belong to several: "
                             f"{listed}. Keep each code on one feature")
        return self

    # -- lookups ---------------------------------------------------------------------------
    def __contains__(self, feature_id: object) -> bool:
        return any(f.id == feature_id for f in self.features)

    def get(self, feature_id: str) -> Feature:
        """The feature with id ``feature_id``; KeyError names the nearest ids."""
        for f in self.features:
            if f.id == feature_id:
                return f
        raise KeyError(f"Feature {feature_id!r} is not in dictionary {self.name} v{self.version} "
                       f"(nearest: {self.nearest(feature_id)}).")

    def nearest(self, text: str, n: int = 3) -> list[str]:
        """Dictionary ids whose id, name or aliases are closest to ``text``."""
        keys: dict[str, str] = {}
        for f in self.features:
            for k in (f.id, f.name.lower(), *[a.lower() for a in f.aliases]):
                keys.setdefault(k, f.id)
        hits = get_close_matches(text.lower().strip(), list(keys), n=n * 2, cutoff=0.4)
        out: list[str] = []
        for h in hits:
            if keys[h] not in out:
                out.append(keys[h])
        return out[:n]

    def resolve(self, column: str) -> Feature | None:
        """The feature whose id or alias equals ``column`` (case-insensitive), else None."""
        c = column.strip().lower()
        for f in self.features:
            if c == f.id or c in (a.lower() for a in f.aliases) or c == f.name.lower():
                return f
        return None

    def node_ids(self) -> list[str]:
        """Every feature-node id in fixed order (categorical features expand to levels)."""
        return [nid for f in self.features for nid in f.node_ids()]

    def by_code(self) -> dict[str, Feature]:
        """``SYSTEM/CODE`` (``LOINC/2345-7``, ``OMOP/3004501``) -> feature; see :meth:`Feature.code_keys`."""
        return {key: f for f in self.features for key in f.code_keys()}

    def node_index(self) -> dict[str, int]:
        """Feature-node id -> row of the shared embedding table (NS-FL eq. 5)."""
        return {nid: i for i, nid in enumerate(self.node_ids())}

    def digest(self) -> str:
        """SHA-256 of the canonical JSON (travels in every message)."""
        dump = self.model_dump(mode="json")
        for f in dump["features"]:  # fields added later hash only when set: old digests stay valid
            for key in _OPTIONAL_LATER:
                if f.get(key) is None:
                    f.pop(key, None)
        body = json.dumps(dump, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()

    # -- loading ---------------------------------------------------------------------------
    @classmethod
    def from_toml(cls, path: str | Path) -> FeatureDictionary:
        """Load ``[[features]]`` tables from TOML; errors name the file and the key."""
        from ..tomlio import load_toml_model

        return load_toml_model(cls, path, what="feature dictionary")
