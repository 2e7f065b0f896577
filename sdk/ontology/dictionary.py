"""The global feature dictionary F (NS-FL eq. 5): canonical features with fixed indices.

Built before training and fixed for a run; its content hash travels in every message and a
mismatch is refused. Each numeric feature carries a *public* clinical reference range used for
standardisation (local means and variances would be a release of private statistics, see
docs/privacy.md) and physical limits beyond which a value is impossible.

Scaling of a numeric value (docs/model_quality.md, "Scaling: reference ranges, transforms and
federated quantiles"): ``z = (T(v) − c) / h`` with ``T`` the feature's declared ``transform``
(``log``, ``log1p``, ``logit`` or none, for skewed labs) and, by default, ``c`` and ``h`` the
midpoint and half-width of the *transformed* reference range, so the reference range maps to
[−1, 1] whatever the transform. ``scale_center`` / ``scale_half_width`` replace them when set
(in transformed units): the federation's robust statistics from securely summed histograms
(:mod:`clinograph.sdk.federation.scaling`) are applied this way.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from difflib import get_close_matches
from enum import Enum
from pathlib import Path

import numpy as np
from pydantic import ConfigDict, Field, model_validator

from clinograph.core.arguments import checked_arguments
from clinograph.core.configmodel import ConfigModel

from .codes import normalise_code

FEATURE_ID = r"^[a-z][a-z0-9_]{0,63}$"
#: a categorical level names its model rows (``feature_embedding/<id>=<level>``, a module name:
#: clinograph.core.spec.MODULE_NAME_PATTERN), so it is letters, digits and ``_ . + -``
LEVEL = re.compile(r"^[A-Za-z0-9_.+\-]{1,64}$")
_LEVEL_WORDS = (("<=", "le"), (">=", "ge"), ("<", "lt"), (">", "gt"), ("%", "pct"))

#: fields added later hash only when they differ from their default, so old digests stay valid
_OPTIONAL_LATER = {"omop_concept_id": None, "molar_mass": None, "valence": None, "transform": "none",
                   "scale_center": None, "scale_half_width": None}


def _level_name(level: str) -> str:
    """A suggestion for a level :data:`LEVEL` refuses: ``<5`` -> ``lt5``, ``Asy/Patchy`` -> ``Asy_Patchy``."""
    for sign, word in _LEVEL_WORDS:
        level = level.replace(sign, word)
    return re.sub(r"[^A-Za-z0-9_.+\-]+", "_", level).strip("_")[:64] or "level"


class FeatureKind(str, Enum):
    """How a feature's values are read."""

    NUMERIC = "numeric"
    BINARY = "binary"
    CATEGORICAL = "categorical"


class Transform(str, Enum):
    """A monotone transform applied to a numeric value (canonical unit) before scaling.

    ``log``: ln v, needs v > 0; ``log1p``: ln(1 + v), needs v > −1 (labs with zeros);
    ``logit``: ln(v / (1 − v)), needs 0 < v < 1 (fractions such as SpO2 as 0–1).
    """

    NONE = "none"
    LOG = "log"
    LOG1P = "log1p"
    LOGIT = "logit"


#: what each transform needs of a value, for messages
TRANSFORM_DOMAIN = {Transform.NONE: "any finite value", Transform.LOG: "> 0", Transform.LOG1P: "> -1",
                    Transform.LOGIT: "strictly between 0 and 1"}


def transform_domain(transform: Transform, values: np.ndarray) -> np.ndarray:
    """True where ``values`` lie in the domain of ``transform`` (finite values only)."""
    v = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        if transform == Transform.LOG:
            return np.isfinite(v) & (v > 0)
        if transform == Transform.LOG1P:
            return np.isfinite(v) & (v > -1)
        if transform == Transform.LOGIT:
            return np.isfinite(v) & (v > 0) & (v < 1)
    return np.isfinite(v)


def apply_transform(transform: Transform, values: np.ndarray) -> np.ndarray:
    """``T(values)``; NaN outside the domain (callers check :func:`transform_domain` first and
    report every bad cell, so a NaN never reaches the model)."""
    v = np.asarray(values, dtype=np.float64)
    ok = transform_domain(transform, v)
    out = np.full(v.shape, np.nan)
    if transform == Transform.LOG:
        out[ok] = np.log(v[ok])
    elif transform == Transform.LOG1P:
        out[ok] = np.log1p(v[ok])
    elif transform == Transform.LOGIT:
        out[ok] = np.log(v[ok]) - np.log1p(-v[ok])
    else:
        out[ok] = v[ok]
    return out


class Feature(ConfigModel):
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
    #: The ion's charge number (1 for Na+, K+, Cl-, HCO3-; 2 for Ca2+, Mg2+): allows equivalents <->
    #: molar concentrations (mEq/L <-> mmol/L: 1 mmol = valence mEq). Known ions have it by analyte.
    valence: int | None = Field(default=None, ge=1, le=8)
    #: applied to the canonical-unit value before scaling (numeric features only); the reference
    #: range stays in canonical units and is transformed with the value
    transform: Transform = Transform.NONE
    #: robust scaling statistics in *transformed* units, replacing the reference range's midpoint
    #: and half-width when set (both or neither); written by federated quantile scaling
    scale_center: float | None = Field(default=None, allow_inf_nan=False)
    scale_half_width: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _consistent(self) -> Feature:
        problems = self._problems()  # every problem of the feature at once, in one message
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _problems(self) -> list[str]:
        out = []
        finite = True
        for bound in ("reference_low", "reference_high", "physical_min", "physical_max"):
            v = getattr(self, bound)
            if v is not None and not math.isfinite(v):
                finite = False
                out.append(f"feature {self.id!r}: {bound} is {'NaN' if math.isnan(v) else 'infinite'}; it must "
                           "be a finite number (leave a physical limit out if there is none)")
        ranged = False  # a reference range to check against the transform and the physical limits
        if self.kind == FeatureKind.NUMERIC:
            if self.reference_low is None or self.reference_high is None:
                out.append(f"numeric feature {self.id!r} needs reference_low and reference_high (public ranges)")
            elif finite and not self.reference_low < self.reference_high:
                out.append(f"feature {self.id!r}: reference_low must be < reference_high")
            elif finite:
                ranged = True
                bounds = np.array([self.reference_low, self.reference_high])
                if not transform_domain(self.transform, bounds).all():
                    out.append(f"feature {self.id!r}: transform = {self.transform.value!r} needs values "
                               f"{TRANSFORM_DOMAIN[self.transform]}, but the reference range is not; use a range "
                               "inside that domain (in the canonical unit) or another transform")
        elif self.transform != Transform.NONE or self.scale_center is not None or self.scale_half_width is not None:
            out.append(f"feature {self.id!r} is {self.kind.value}: transform and scale_center/"
                       "scale_half_width apply to numeric features only; remove them")
        if (self.scale_center is None) != (self.scale_half_width is None):
            out.append(f"feature {self.id!r}: set both scale_center and scale_half_width, or neither")
        if self.kind == FeatureKind.CATEGORICAL and len(self.levels) < 2:
            out.append(f"categorical feature {self.id!r} needs at least two levels")
        if bad := [lvl for lvl in self.levels if lvl and not LEVEL.match(lvl)]:
            out.append(f"feature {self.id!r}: levels {bad} hold characters other than letters, digits and _ . + - "
                       "(or are longer than 64): a level names the model's rows for it. Rename them in the "
                       f"dictionary, e.g. {[_level_name(lvl) for lvl in bad]}, and map each hospital's own codes "
                       "onto them with a coding in its site schema (coding = { \"<code>\" = \"<level>\" })")
        norm = [normalise_code(lvl) for lvl in self.levels]
        same = sorted({lvl for lvl, n in zip(self.levels, norm, strict=True) if norm.count(n) > 1})
        if same or any(not n for n in norm):
            out.append(f"feature {self.id!r}: levels must be non-empty and distinct ignoring case, spaces "
                       f"and number formatting; these coincide: {same}")
        limits = True
        if finite and (self.physical_min is not None and self.physical_max is not None
                       and not self.physical_min < self.physical_max):
            limits = False
            out.append(f"feature {self.id!r}: physical_min must be < physical_max")
        if self.kind == FeatureKind.NUMERIC:
            out.extend(self._numeric_unit_and_range(ranged and limits))
        return out

    def _numeric_unit_and_range(self, ranged: bool) -> list[str]:
        """The canonical unit is one pint reads (else every schema unit fails to convert, late, at
        each hospital), and the public reference range lies inside the physical limits (``ranged``:
        the range and the limits are valid on their own)."""
        from .units import EXAMPLE_UNITS, is_known_unit

        out = []
        if not is_known_unit(self.unit):
            out.append(f"feature {self.id!r}: unit {self.unit!r} is not a unit pint reads; write it in UCUM "
                       f"(e.g. {', '.join(EXAMPLE_UNITS)})")
        lo, hi = self.physical_min, self.physical_max
        if ranged and ((lo is not None and self.reference_low < lo) or (hi is not None and self.reference_high > hi)):
            out.append(f"feature {self.id!r}: the reference range {self.reference_low:g} to "
                       f"{self.reference_high:g} is not inside the physical limits "
                       f"{'-inf' if lo is None else f'{lo:g}'} to {'inf' if hi is None else f'{hi:g}'}; "
                       "fix one of them")
        return out

    def code_keys(self) -> set[str]:
        """Codes that name this feature in exchange formats, normalised as ``SYSTEM/CODE``.

        ``codes = { loinc = "2345-7" }`` gives ``LOINC/2345-7``; ``omop_concept_id`` gives
        ``OMOP/<id>``. The OMOP, MEDS and FHIR readers map codes through these.
        """
        keys = {f"{system.strip().upper()}/{code.strip()}" for system, code in self.codes.items()}
        if self.omop_concept_id is not None:
            keys.add(f"OMOP/{self.omop_concept_id}")
        return keys

    def scaling(self) -> tuple[float, float]:
        """(centre c, half-width h) in transformed units: ``scale_center``/``scale_half_width``
        when set, else the transformed reference range's midpoint and half-width."""
        if self.scale_center is not None and self.scale_half_width is not None:
            return float(self.scale_center), float(self.scale_half_width)
        lo, hi = apply_transform(self.transform, np.array([self.reference_low, self.reference_high]))
        return float((lo + hi) / 2.0), float((hi - lo) / 2.0)

    def standardise_array(self, values: np.ndarray) -> np.ndarray:
        """``(T(v) − c) / h`` elementwise (NaN outside the transform's domain); non-numeric
        features pass through."""
        v = np.asarray(values, dtype=np.float64)
        if self.kind != FeatureKind.NUMERIC:
            return v.copy()
        c, h = self.scaling()
        with np.errstate(over="ignore", invalid="ignore"):
            return (apply_transform(self.transform, v) - c) / h

    def standardise(self, value: float) -> float:
        """Scaling of one value: ``(T(v) − c) / h``; with the default scaling the (transformed)
        reference range maps to [−1, 1]."""
        return float(self.standardise_array(np.array([value]))[0])

    def node_ids(self) -> list[str]:
        """Feature-node ids this feature contributes to the graph (one per level if categorical)."""
        if self.kind == FeatureKind.CATEGORICAL:
            return [f"{self.id}={lvl}" for lvl in self.levels]
        return [self.id]


class FeatureDictionary(ConfigModel):
    """Versioned, hashed list of canonical features; the order fixes the node indices."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    version: int = Field(ge=1)
    features: tuple[Feature, ...]  # at least one: checked in _unique (min_length would add a second
    # "at least 1 item" problem whenever the only feature is invalid)

    @model_validator(mode="after")
    def _unique(self) -> FeatureDictionary:
        if not self.features:
            raise ValueError("the dictionary has no features; add at least one [[features]] table")
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
            for key, default in _OPTIONAL_LATER.items():
                if f.get(key) == default:
                    f.pop(key, None)
        body = json.dumps(dump, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()

    # -- loading ---------------------------------------------------------------------------
    @classmethod
    @checked_arguments
    def from_toml(cls, path: str | Path) -> FeatureDictionary:
        """Load ``[[features]]`` tables from TOML; errors name the file and the key."""
        from ..tomlio import load_toml_model

        return load_toml_model(cls, path, what="feature dictionary")
