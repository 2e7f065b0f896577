"""SiteSchema: one hospital's mapping of its own column names and units onto the dictionary.

Loaded from TOML, e.g.::

    site = "st_marys"
    format = "wide"            # one row a patient; or "long": (patient, time, feature, value[, unit])
    patient_id = "mrn"
    label = "outcome"
    ignore = ["ward"]          # dropped on purpose; counted in the ingest report

    [columns]
    "HR" = { feature = "heart_rate", unit = "bpm" }
    "PaCO2 (kPa)" = { feature = "paco2", unit = "kPa" }

Unknown columns are an error that names them and suggests the nearest dictionary entries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from clinograph.secure.errors import SchemaError
from pydantic import BaseModel, ConfigDict, Field

from .dictionary import FeatureDictionary, FeatureKind
from .units import conversion


class ColumnMap(BaseModel):
    """Where one local column goes: a dictionary feature, in a local unit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    feature: str
    unit: str | None = None


class LongColumns(BaseModel):
    """Column names of a long (OMOP-measurement-like) table."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    patient: str = "patient_id"
    time: str | None = "time"
    feature: str = "feature"
    value: str = "value"
    unit: str | None = None


class MissingLabelPolicy(BaseModel):
    """What to do with patients whose label is missing: refuse (default) or drop and count."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    missing_label: Literal["error", "drop"] = "error"


class SiteSchema(BaseModel):
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

    @classmethod
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
            if cm.unit is not None and feat.kind == FeatureKind.NUMERIC:
                try:
                    conversion(feature=feat.id, analyte=feat.analyte, source=cm.unit, target=feat.unit)
                except SchemaError as exc:
                    problems.extend(f"Column {col!r}: {p}" for p in exc.problems)
        targets = [cm.feature for cm in self.columns.values()]
        dupes = sorted({t for t in targets if targets.count(t) > 1})
        for d in dupes:
            cols = [c for c, cm in self.columns.items() if cm.feature == d]
            problems.append(f"Columns {cols} all map to feature {d!r}; map exactly one and list the others under ignore.")
        if problems:
            raise SchemaError(problems, title=f"Site schema {self.site!r} does not fit the dictionary")
