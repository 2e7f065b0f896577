"""One TOML file per EHR source: which reader, and how -- loaded strictly, read into an extract.

A source file names its site and exactly one of ``[omop]``, ``[meds]`` or ``[fhir]``::

    site = "north"

    [omop]                       # OmopSource without `site` (clinograph.sdk.ingest.omop)
    cohort = { visit_concept_ids = [32037] }
    label = { condition_concept_ids = [2000000100], window_days = 2.0 }
    patient_id = "person_source_value"

    units = { glucose = "mg/dL" }        # rows without a unit: else refused
    censored = "half_bound"              # "<0.5": "bound", "half_bound" or "refuse" (unset)

    [meds]                       # labels: a MEDS label file, relative to this file
    labels = "labels.parquet"
    lookback_hours = 24.0        # required with labels

    [fhir]
    label_code = "ALARM/SHUNT"
    systems = { "https://clinograph.org/fhir/CodeSystem/alarm" = "ALARM" }

Every key, with an example, is in docs/ehr_formats.md ("Every source-file key").

The location (a .duckdb file, a folder, a database URL, a MEDS root, a FHIR export) is given
apart, on the command line or in code: the same source file serves a test copy and production.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from clinograph.core.arguments import checked_arguments
from clinograph.core.configmodel import ConfigModel
from clinograph.core.errors import ConfigError

from ..ontology.dictionary import FeatureDictionary
from .ehr_values import CensorPolicy
from .extract import EhrExtract
from .omop import OmopOptions, OmopSex, OmopSource
from .table import PatientTable

SITE = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"


class MedsSex(OmopSex):
    """``[meds] sex``: the feature and the level codes male/female are written as (:class:`.omop.OmopSex`),
    and the MEDS codes that say so (MEDS has no standard one; MIMIC-IV's ETL writes ``GENDER//M``)."""

    male_code: str = Field(default="GENDER//M", min_length=1, max_length=200)
    female_code: str = Field(default="GENDER//F", min_length=1, max_length=200)


class MedsOptions(ConfigModel):
    """``[meds]``: the label file (None: unlabeled), the time binning, how far back features are read
    (required with labels: no default turns a years-old event into a snapshot) and the units of
    features whose events carry none."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    labels: str | None = None
    snapshot_hours: float = Field(default=24.0, gt=0, allow_inf_nan=False)
    lookback_hours: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    units: dict[str, str] = Field(default_factory=dict)
    censored: CensorPolicy | None = None
    #: a numeric feature: years from MEDS_BIRTH to the prediction time (unlabeled: the first mapped event)
    age: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_]{0,63}$")
    sex: MedsSex | None = None

    @model_validator(mode="after")
    def _lookback(self) -> MedsOptions:
        if self.labels is not None and self.lookback_hours is None:
            raise ValueError("with labels, declare lookback_hours: how far before the prediction time events are "
                             "read as features (e.g. lookback_hours = 24.0)")
        return self


class FhirIndex(ConfigModel):
    """``[fhir] index``: time 0 is the start of the patient's first Encounter of these classes (``class.code``,
    e.g. ``IMP`` inpatient, ``EMER``), as OMOP's visit cohort; features are the Observations from
    ``lookback_hours`` before it up to it (later ones: excluded, counted); patients without one: not read."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    encounter_classes: tuple[str, ...] = Field(min_length=1)
    lookback_hours: float = Field(gt=0, allow_inf_nan=False)


class FhirOptions(ConfigModel):
    """``[fhir]``: the label's code (None: unlabeled), extra coding systems, patient ids."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    label_code: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.\-]+/.+$")
    systems: dict[str, str] = Field(default_factory=dict)
    patient_id: Literal["id", "identifier"] = "id"
    #: with patient_id = "identifier": the system whose identifier names the patient (an MRN's URL);
    #: unset: each Patient's first identifier
    identifier_system: str | None = Field(default=None, min_length=1, max_length=2048)
    snapshot_hours: float = Field(default=24.0, gt=0, allow_inf_nan=False)
    units: dict[str, str] = Field(default_factory=dict)
    censored: CensorPolicy | None = None
    sex: OmopSex | None = None
    age: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_]{0,63}$")
    validate_: Literal["fields_read", "full"] = Field(default="fields_read", alias="validate")
    index: FhirIndex | None = None


class EhrSourceConfig(ConfigModel):
    """A source file (see the module docstring). Strict: unknown keys are errors that name them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    site: str = Field(pattern=SITE)
    omop: OmopOptions | None = None
    meds: MedsOptions | None = None
    fhir: FhirOptions | None = None

    @model_validator(mode="after")
    def _one(self) -> EhrSourceConfig:
        given = [k for k in ("omop", "meds", "fhir") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"a source file has exactly one of [omop], [meds], [fhir]; found {given or 'none'}")
        return self

    @property
    def kind(self) -> str:
        """``omop``, ``meds`` or ``fhir``."""
        return next(k for k in ("omop", "meds", "fhir") if getattr(self, k) is not None)

    @classmethod
    @checked_arguments
    def from_toml(cls, path: str | Path) -> EhrSourceConfig:
        """Load a source file; errors name the file and the key."""
        from ..tomlio import load_toml_model

        return load_toml_model(cls, path, what="EHR source file")


def is_source_file(data: dict) -> bool:
    """True if a parsed TOML document is a source file rather than a site schema."""
    return any(k in data for k in ("omop", "meds", "fhir"))


def load_site_source(path: Path):  # noqa: ANN201 - a SiteSchema or an EhrSourceConfig
    """A hospital's site schema, or its EHR source file (``[omop]``, ``[meds]`` or ``[fhir]``): both name
    the site (``.site``); :func:`ingest_site` reads the hospital's table or source with it.

    Raises:
        ConfigError: the file cannot be read or does not validate (naming it and the key).
    """
    import tomllib

    from clinograph.core.tomlio import read_toml_text

    from ..ontology.schema import SiteSchema

    try:
        raw = tomllib.loads(read_toml_text(Path(path), what="schema"))
    except tomllib.TOMLDecodeError:
        raw = {}  # the loader below reports the syntax error with its line
    return EhrSourceConfig.from_toml(path) if is_source_file(raw) else SiteSchema.from_toml(path)


def ingest_site(location: str | Path, source, *, dictionary: FeatureDictionary,  # noqa: ANN001 - see load_site_source
                base: Path) -> PatientTable:
    """The hospital's PatientTable: its table read as its site schema says, or -- ``source`` an EHR
    source file -- the source at ``location`` (a CDM folder or .duckdb file, a MEDS root, a FHIR export)
    read and ingested, as ``clinograph check`` reads it. ``base``: the source file's folder."""
    if isinstance(source, EhrSourceConfig):
        return read_source(source, location, dictionary=dictionary, base=base).ingest(dictionary)
    from .read import read_site_table
    from .validate import ingest

    return ingest(read_site_table(location, source), schema=source, dictionary=dictionary)


def read_source(config: EhrSourceConfig, location: str | Path, *, dictionary: FeatureDictionary,
                base: Path | None = None, engine=None) -> EhrExtract:  # noqa: ANN001 - a sqlalchemy.Engine
    """Read ``location`` as ``config`` says. ``base``: the folder relative paths are taken from.
    ``engine`` (OMOP only): read through this engine instead of :func:`.omop.omop_engine` of
    ``location`` (the caller then owns it, e.g. to dispose of it before writing there)."""
    if config.omop is not None:
        from .omop import omop_engine, read_omop

        source = OmopSource(site=config.site, **config.omop.model_dump(exclude_none=False))
        return read_omop(engine if engine is not None else omop_engine(location), source=source,
                         dictionary=dictionary)
    if config.meds is not None:
        from .meds import read_meds

        labels = None if config.meds.labels is None else (base or Path(".")) / config.meds.labels
        return read_meds(location, dictionary=dictionary, site=config.site, labels=labels,
                         snapshot_hours=config.meds.snapshot_hours, lookback_hours=config.meds.lookback_hours,
                         units=config.meds.units, censored=config.meds.censored, age=config.meds.age,
                         sex=config.meds.sex)
    from .fhir import read_fhir

    f = config.fhir
    if f is None:  # the source model guarantees one of [omop], [meds], [fhir]; never silently assume
        raise ConfigError("The source file has no [omop], [meds] or [fhir] section; add the one your data uses.")
    return read_fhir(location, dictionary=dictionary, site=config.site, label_code=f.label_code, systems=f.systems,
                     patient_id=f.patient_id, identifier_system=f.identifier_system, snapshot_hours=f.snapshot_hours, units=f.units, censored=f.censored,
                     age=f.age, sex=f.sex, validate=f.validate_, index=f.index)
