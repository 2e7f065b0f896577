"""SiteSchema: one hospital's mapping of its own column names and units onto the dictionary.

Loaded from TOML, e.g.::

    site = "st_marys"
    format = "wide"            # one row a patient; or "long": (patient, time, feature, value[, unit])
    patient_id = "mrn"
    label = "outcome"
    ignore = ["ward"]          # dropped on purpose; counted in the ingest report
    decimal = ","              # optional: the CSV dialect (also delimiter = ";"), else detected

    [columns]
    "HR" = { feature = "heart_rate", unit = "bpm" }
    "PaCO2 (kPa)" = { feature = "paco2", unit = "kPa" }
    "sex" = { feature = "sex_male", coding = { "F" = 0, "M" = 1 } }        # binary: code -> 0/1 (1: male)
    "ward_type" = { feature = "ward", coding = { "1" = "icu", "2" = "general" } }  # categorical: code -> level

Unknown columns are an error that names them and suggests the nearest dictionary entries.
Binary columns accept 0/1, true/false and yes/no without a coding; any other code (``F``/``M``,
``Y``/``N``) must be declared, 1 being the code that means the feature is true. (A label column
also reads Y/N: the outcome happened.) Categorical columns accept the dictionary's levels; other codes
need a level map. Codes compare ignoring case, surrounding spaces and number formatting
(``"3"`` == ``"3.0"``). A schema must name its label column, or declare ``unlabeled = true``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from clinograph.core.arguments import checked_arguments
from clinograph.core.configmodel import ConfigModel
from clinograph.core.errors import SchemaError

from .codes import normalise_code
from .dictionary import Feature, FeatureDictionary, FeatureKind
from .units import conversion


class ColumnMap(ConfigModel):
    """Where one local column goes: a dictionary feature, in a local unit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    feature: str
    unit: str | None = None
    coding: dict[str, int | str] | None = Field(
        default=None, description="binary: local code -> 0/1; categorical: local code -> dictionary level")

    def normalised_coding(self, feature: Feature) -> dict[str, float]:
        """The coding as normalised code -> parsed value (0/1, or the level's index)."""
        out: dict[str, float] = {}
        levels = {normalise_code(lvl): i for i, lvl in enumerate(feature.levels)}
        for code, target in (self.coding or {}).items():
            if feature.kind == FeatureKind.BINARY and not isinstance(target, str) and target in (0, 1):
                out[normalise_code(code)] = float(int(target))
            elif feature.kind == FeatureKind.CATEGORICAL and normalise_code(target) in levels:
                out[normalise_code(code)] = float(levels[normalise_code(target)])
        return out  # entries check_against refuses are left out


class LongColumns(ConfigModel):
    """Column names of a long (OMOP-measurement-like) table."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    patient: str = "patient_id"
    time: str | None = "time"
    feature: str = "feature"
    value: str = "value"
    unit: str | None = None


class MissingLabelPolicy(ConfigModel):
    """What to do with patients whose label is missing: refuse (default) or drop and count.

    ``missing_values``: the export's own spellings of "no value" (``["-", "?", "n.d.", "-999"]``); a
    cell that is exactly one of them (surrounding spaces aside; a number by value, so ``"-999"`` is
    also -999.0 and ``-999,00``) is read as missing, in every column, and counted in the ingest report. Empty, ``NA``, ``n/a``, ``NULL`` and pandas' other spellings are always missing.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    missing_label: Literal["error", "drop"] = "error"
    missing_values: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _tokens(self) -> MissingLabelPolicy:
        if any(not t.strip() for t in self.missing_values):
            raise ValueError("missing_values holds an empty or blank string; empty cells are missing already")
        return self


class SurvivalColumns(ConfigModel):
    """A time-to-event label (``[survival]`` of a site schema): follow-up time and event columns.

    ``time`` is the follow-up (to the event, or to the last contact when censored) in
    ``time_unit`` (UCUM via pint: ``d``, ``wk``, ``mo``, ``a``/``year``; converted to days on
    ingestion). ``event`` holds 1 (event observed) or 0 (censored); ``event_codes`` maps other
    local codes (e.g. ``{"dead" = 1, "alive" = 0}``). The event column is the table's label.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    time: str
    event: str
    time_unit: str = "d"
    event_codes: dict[str, int] | None = None


class SiteSchema(ConfigModel):
    """A hospital's column mapping. Strict: an unknown key is an error that names it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    site: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
    format: Literal["wide", "long"] = "wide"
    patient_id: str = "patient_id"
    label: str | None = "label"
    columns: dict[str, ColumnMap] = Field(default_factory=dict)
    ignore: tuple[str, ...] = ()
    long: LongColumns = Field(default_factory=LongColumns)
    policy: MissingLabelPolicy = Field(default_factory=MissingLabelPolicy)
    unlabeled: bool = False
    #: F-CMs concept-label columns (wide tables): kept out of the features, like the label; a
    #: concept task reads them with clinograph.sdk.concepts.labels.concept_labels. None: no concepts.
    concepts: tuple[str, ...] | None = None
    #: time-to-event label (time + event columns, time unit); the event column is the label
    survival: SurvivalColumns | None = None
    #: the binary label's local codes -> 1/0 (``{"dead" = 1, "alive" = 0}``), read instead of the
    #: default 0/1, true/false, yes/no, Y/N (Y: the outcome happened); None: the default
    label_codes: dict[str, Literal[0, 1]] | None = None
    #: the CSV export's field delimiter and decimal separator, for every reader of this hospital's
    #: table (check, simulate, a SuperNode, predict); None: detected (sdk/ingest/dialect.py)
    delimiter: str | None = Field(default=None, pattern=r"^[^\r\n\"']$")
    decimal: Literal[".", ","] | None = None

    @model_validator(mode="after")
    def _label_declared(self) -> SiteSchema:
        if self.survival is not None and self.label not in (None, "label", self.survival.event):
            raise ValueError(f"[survival] event = {self.survival.event!r} is the label, but label = {self.label!r} "
                             "names another column; remove label (or set it to the event column)")
        if self.survival is not None:
            return self._roles_distinct()
        if self.label is None and not self.unlabeled:
            raise ValueError("label is not set: without a label column every patient would silently get label 0. "
                             "Set label = \"<your outcome column>\", or declare unlabeled = true for a table "
                             "without outcomes")
        if self.label is not None and self.unlabeled:
            raise ValueError(f"unlabeled = true but label = {self.label!r}; remove one of them")
        if self.label_codes is not None and (self.label is None or set(self.label_codes.values()) != {0, 1}):
            raise ValueError("label_codes needs a label column and must map codes to both 1 and 0, e.g. "
                             "label_codes = { \"dead\" = 1, \"alive\" = 0 }")
        return self._roles_distinct()

    def _roles_distinct(self) -> SiteSchema:
        """One job a column: the patient id, label, time, ... columns are distinct and none of them is
        also mapped as a feature or ignored (else one role would silently win). All conflicts at once."""
        if self.format == "long":
            lc = self.long
            roles = {"long.patient": lc.patient, "long.time": lc.time, "long.feature": lc.feature,
                     "long.value": lc.value, "long.unit": lc.unit, "label": self.label}
        else:
            roles = {"patient_id": self.patient_id, "label": self.label}
            roles |= {f"concepts[{i}]": c for i, c in enumerate(self.concepts or ())}
        if self.survival is not None:
            roles |= {"survival.time": self.survival.time, "survival.event": self.survival.event}
        by_col: dict[str, list[str]] = {}
        for role, col in roles.items():
            if col is not None:
                by_col.setdefault(col, []).append(role)
        problems = [f"column {col!r} is named by {' and '.join(rs)}; each role needs its own column"
                    for col, rs in by_col.items() if len(set(rs)) > 1 and not set(rs) <= {"label", "survival.event"}]
        if self.format == "wide":
            for col, rs in by_col.items():
                if col in self.columns:
                    problems.append(f"column {col!r} is the {rs[0]} column and also mapped under [columns]; "
                                    f"remove [columns.{col!r}]")
                if col in self.ignore:
                    problems.append(f"column {col!r} is the {rs[0]} column and also listed under ignore; "
                                    "remove it from ignore")
            problems += [f"column {col!r} is mapped under [columns] and also listed under ignore; keep one"
                         for col in self.columns if col in self.ignore]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @classmethod
    @checked_arguments
    def from_toml(cls, path: str | Path) -> SiteSchema:
        """Load a schema; errors name the file and the key."""
        from ..tomlio import load_toml_model

        return load_toml_model(cls, path, what="site schema")

    def check_against(self, dictionary: FeatureDictionary) -> None:
        """Every mapped feature exists and every unit converts; all problems at once."""
        problems = []
        for col, cm in self.columns.items():
            if cm.feature not in dictionary:
                problems.append(f"Column {col!r} maps to feature {cm.feature!r}, which is not in dictionary "
                                f"{dictionary.name} v{dictionary.version} (nearest: {dictionary.nearest(cm.feature)}). "
                                "Fix the feature name under [columns].")
                continue
            feat = dictionary.get(cm.feature)
            problems.extend(coding_problems(col, cm, feat))
            if cm.unit is not None and feat.kind == FeatureKind.NUMERIC:
                try:
                    conversion(feature=feat.id, analyte=feat.analyte, source=cm.unit, target=feat.unit,
                               molar_mass=feat.molar_mass, valence=feat.valence)
                except SchemaError as exc:
                    problems.extend(f"Column {col!r}: {p}" for p in exc.problems)
        targets = [cm.feature for cm in self.columns.values()]
        dupes = sorted({t for t in targets if targets.count(t) > 1})
        for d in dupes:
            cols = [c for c, cm in self.columns.items() if cm.feature == d]
            problems.append(f"Columns {cols} all map to feature {d!r}; map exactly one and list the others under ignore.")
        if problems:
            raise SchemaError(problems, title=f"Site schema {self.site!r} does not fit the dictionary")


def coding_problems(col: str, cm: ColumnMap, feat: Feature) -> list[str]:
    """Everything wrong with one column's declared coding (empty if none is declared)."""
    if cm.coding is None:
        return []
    where = f"Column {col!r} ({feat.id}, {feat.kind.value})"
    if feat.kind == FeatureKind.NUMERIC:
        return [f"{where}: a coding is only for binary or categorical features. Remove `coding` from "
                f"[columns].{col!r}."]
    problems = []
    if not cm.coding:
        problems.append(f"{where}: the coding is empty. Map each local code, or remove `coding`.")
    norm = [normalise_code(c) for c in cm.coding]
    clash = sorted({c for c, n in zip(cm.coding, norm, strict=True) if norm.count(n) > 1})
    if clash:
        problems.append(f"{where}: coding keys {clash} are the same code (case, spaces and number format are "
                        "ignored). Keep one of them.")
    if feat.kind == FeatureKind.BINARY:
        bad = sorted(c for c, v in cm.coding.items() if isinstance(v, str) or v not in (0, 1))
        if bad:
            problems.append(f"{where}: coding values for {bad} must be 0 or 1: 1 for the code(s) that mean "
                            f"{feat.id!r} ({feat.name}) is true, 0 for the others.")
    else:
        levels = {normalise_code(lvl) for lvl in feat.levels}
        bad = sorted(c for c, v in cm.coding.items() if normalise_code(v) not in levels)
        if bad:
            problems.append(f"{where}: coding for {bad} must map to one of the dictionary levels "
                            f"{list(feat.levels)}.")
    return problems
