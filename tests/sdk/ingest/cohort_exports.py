"""One synthetic cohort written as the three EHR exports Clinograph reads (reusable by tests and scripts).

:class:`Cohort` holds patients (birth date, sex, index time = prediction time, outcome) and their
timed events (a lab in one of several units, a censored value such as ``<5``, a value without a
unit, a categorical observation, a condition). :func:`write_fhir` writes it as FHIR R4 (one
transaction Bundle a patient as Synthea writes them, or a bulk export's NDJSON files),
:func:`write_omop` as an OMOP CDM v5.4 folder of CSV files as ETL-Synthea writes them (upper-case
headers, with a ``concept`` table), :func:`write_meds` as a MEDS dataset (``data/`` shards,
``metadata/``, a label file). :func:`source_files` gives the three source-file sections that read
them with one dictionary, :data:`DICTIONARY`.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import date, datetime, timedelta
from pathlib import Path

import pandas as pd
from clinograph.sdk.ontology.dictionary import Feature, FeatureDictionary

#: feature -> (LOINC, OMOP concept, OMOP unit concepts by UCUM code)
LABS = {"glucose": ("2345-7", 3004501), "creatinine": ("2160-0", 3016723), "heart_rate": ("8867-4", 3027018)}
UNIT_CONCEPT = {"mg/dL": 8840, "mmol/L": 8753, "umol/L": 8749, "/min": 8541}
SMOKING = ("72166-2", 4275495)          # LOINC tobacco smoking status; OMOP observation concept
COPD = ("13645005", 255573)             # SNOMED, OMOP condition concept
OUTCOME = ("OUTCOME", 2_000_000_200)    # a site-local outcome concept (OMOP condition; FHIR/MEDS code)
LOCAL_SYSTEM = "https://hospital.example/fhir/CodeSystem/local"
INPATIENT = 9201                        # OMOP visit concept "Inpatient Visit": the index visit
LOOKBACK_DAYS = 2.0
WINDOW_DAYS = 7.0

DICTIONARY = FeatureDictionary(name="cohort", version="1", features=(
    Feature(id="glucose", name="Glucose", kind="numeric", unit="mmol/L", reference_low=3.9, reference_high=7.8,
            physical_min=0, physical_max=100, codes={"loinc": LABS["glucose"][0]}, omop_concept_id=LABS["glucose"][1],
            molar_mass=180.156),
    Feature(id="creatinine", name="Creatinine", kind="numeric", unit="umol/L", reference_low=50, reference_high=110,
            physical_min=0, physical_max=5000, codes={"loinc": LABS["creatinine"][0]},
            omop_concept_id=LABS["creatinine"][1], molar_mass=113.12),
    Feature(id="heart_rate", name="Heart rate", kind="numeric", unit="/min", reference_low=60, reference_high=100,
            physical_min=0, physical_max=400, codes={"loinc": LABS["heart_rate"][0]},
            omop_concept_id=LABS["heart_rate"][1]),
    Feature(id="age", name="Age", kind="numeric", unit="a", reference_low=18, reference_high=90, physical_min=0,
            physical_max=130),
    Feature(id="sex", name="Sex", kind="categorical", levels=("female", "male")),
    Feature(id="smoking", name="Smoking status", kind="categorical", levels=("never", "former", "current"),
            codes={"loinc": SMOKING[0]}, omop_concept_id=SMOKING[1]),
    Feature(id="copd", name="COPD", kind="binary", codes={"snomed": COPD[0]}, omop_concept_id=COPD[1]),
))


@dataclasses.dataclass(frozen=True)
class Event:
    """A lab value ``hours`` after the index time (negative: before) in ``unit`` (None: no unit);
    ``comparator`` (``<``, ``>``) makes it censored at ``value``."""

    hours: float
    feature: str
    value: float
    unit: str | None
    comparator: str | None = None


@dataclasses.dataclass(frozen=True)
class Patient:
    pid: int
    birth: date
    sex: str                               # "male" / "female"
    index: datetime                        # the index visit's start = MEDS prediction time
    outcome: bool                          # an outcome event a day after the index time (or none)
    events: tuple[Event, ...] = ()
    smoking: str | None = None             # a categorical observation at the index time
    copd_hours: float | None = None        # a COPD diagnosis this many hours after the index time


@dataclasses.dataclass(frozen=True)
class Cohort:
    patients: tuple[Patient, ...]


def example_cohort() -> Cohort:
    """The fixed cohort: units, a censored value, a value without a unit, a categorical observation, a
    condition, an outcome, a patient with nothing, a measurement after the prediction time."""
    t = datetime(2024, 3, 4, 10, 30)
    return Cohort(patients=(
        Patient(1, date(1950, 5, 17), "male", t, True, events=(
            Event(-30.0, "glucose", 99.0, "mg/dL"), Event(-2.0, "glucose", 6.1, "mmol/L"),
            Event(-2.0, "creatinine", 1.1, "mg/dL"), Event(-1.0, "heart_rate", 88.0, None)),
            smoking="former", copd_hours=-100.0),
        Patient(2, date(1972, 1, 2), "female", t + timedelta(hours=5), False, events=(
            Event(-20.0, "creatinine", 5.0, "umol/L", "<"), Event(-3.0, "glucose", 140.0, "mg/dL"),
            Event(+6.0, "glucose", 12.0, "mmol/L"))),   # after the prediction time: never a feature
        Patient(3, date(1990, 12, 31), "female", t + timedelta(days=1), False),   # nothing but a visit
        Patient(4, date(1944, 7, 1), "male", t + timedelta(days=2, hours=3), True, events=(
            Event(-40.0, "heart_rate", 120.0, "/min"), Event(-0.5, "creatinine", 200.0, "umol/L")),
            smoking="never"),
    ))


# -- OMOP CDM v5.4 (ETL-Synthea's CSV: upper-case headers, unit_source_value beside unit_concept_id) ---------

def omop_tables(cohort: Cohort) -> dict[str, pd.DataFrame]:
    person, period, visit, cond, meas, obs = [], [], [], [], [], []
    for p in cohort.patients:
        person.append({"person_id": p.pid, "gender_concept_id": 8507 if p.sex == "male" else 8532,
                       "year_of_birth": p.birth.year, "month_of_birth": p.birth.month, "day_of_birth": p.birth.day,
                       "birth_datetime": datetime.combine(p.birth, datetime.min.time()), "race_concept_id": 0,
                       "ethnicity_concept_id": 0, "person_source_value": f"p{p.pid}"})
        period.append({"observation_period_id": p.pid, "person_id": p.pid,
                       "observation_period_start_date": (p.index - timedelta(days=400)).date(),
                       "observation_period_end_date": (p.index + timedelta(days=30)).date(),
                       "period_type_concept_id": 32817})
        visit.append({"visit_occurrence_id": p.pid, "person_id": p.pid, "visit_concept_id": INPATIENT,
                      "visit_start_date": p.index.date(), "visit_start_datetime": p.index,
                      "visit_end_date": (p.index + timedelta(days=3)).date(),
                      "visit_end_datetime": p.index + timedelta(days=3), "visit_type_concept_id": 32817})
        for hours, concept in ((p.copd_hours, COPD[1]), (24.0 if p.outcome else None, OUTCOME[1])):
            if hours is not None:
                when = p.index + timedelta(hours=hours)
                cond.append({"condition_occurrence_id": len(cond) + 1, "person_id": p.pid,
                             "condition_concept_id": concept, "condition_start_date": when.date(),
                             "condition_start_datetime": when, "condition_type_concept_id": 32817})
        for e in p.events:
            when = p.index + timedelta(hours=e.hours)
            op = {"<": 4171756, ">": 4172704}.get(e.comparator or "", 0)
            meas.append({"measurement_id": len(meas) + 1, "person_id": p.pid,
                         "measurement_concept_id": LABS[e.feature][1], "measurement_date": when.date(),
                         "measurement_datetime": when, "measurement_type_concept_id": 32817,
                         "operator_concept_id": op, "value_as_number": e.value, "value_as_concept_id": 0,
                         "unit_concept_id": UNIT_CONCEPT.get(e.unit or "", 0), "unit_source_value": e.unit or "",
                         "value_source_value": f"{e.comparator or ''}{e.value:g}"})
        if p.smoking is not None:
            obs.append({"observation_id": len(obs) + 1, "person_id": p.pid, "observation_concept_id": SMOKING[1],
                        "observation_date": p.index.date(), "observation_datetime": p.index,
                        "observation_type_concept_id": 32817, "value_as_number": None, "value_as_string": p.smoking,
                        "value_as_concept_id": 45883458, "unit_concept_id": 0, "unit_source_value": ""})
    concept = pd.DataFrame({"concept_id": list(UNIT_CONCEPT.values()), "concept_name": list(UNIT_CONCEPT),
                            "domain_id": "Unit", "vocabulary_id": "UCUM", "concept_class_id": "Unit",
                            "standard_concept": "S", "concept_code": list(UNIT_CONCEPT)})
    cols = {"measurement": ["measurement_id", "person_id", "measurement_concept_id", "measurement_date",
                            "measurement_datetime", "measurement_type_concept_id", "operator_concept_id",
                            "value_as_number", "value_as_concept_id", "unit_concept_id", "unit_source_value",
                            "value_source_value"],
            "observation": ["observation_id", "person_id", "observation_concept_id", "observation_date",
                            "observation_datetime", "observation_type_concept_id", "value_as_number",
                            "value_as_string", "value_as_concept_id", "unit_concept_id", "unit_source_value"],
            "condition_occurrence": ["condition_occurrence_id", "person_id", "condition_concept_id",
                                     "condition_start_date", "condition_start_datetime",
                                     "condition_type_concept_id"]}
    return {"person": pd.DataFrame(person), "observation_period": pd.DataFrame(period),
            "visit_occurrence": pd.DataFrame(visit),
            "condition_occurrence": pd.DataFrame(cond, columns=cols["condition_occurrence"]),
            "measurement": pd.DataFrame(meas, columns=cols["measurement"]),
            "observation": pd.DataFrame(obs, columns=cols["observation"]), "concept": concept}


def write_omop(folder: str | Path, cohort: Cohort) -> Path:
    """An OMOP CDM v5.4 folder of CSV files, ETL-Synthea style (UPPER-CASE headers)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, df in omop_tables(cohort).items():
        df.rename(columns=str.upper).to_csv(folder / f"{name}.csv", index=False, date_format="%Y-%m-%d %H:%M:%S")
    return folder


# -- FHIR R4 (Synthea: a transaction Bundle a patient, urn:uuid references; or bulk NDJSON) -----------------

KINDS = {"patient": 1, "encounter": 2, "observation": 3, "condition": 4}


def _uuid(kind: str, pid: int, n: int = 0) -> str:
    """A uuid-shaped id (Synthea's are uuids) naming the resource kind, patient and number."""
    return f"{pid:08d}-{KINDS[kind]:04d}-4000-8000-{n:012d}"


def _iso(t: datetime) -> str:
    return t.isoformat() + "Z"   # the hospital's local time, as UTC in every format (no offset to shift)


def fhir_resources(p: Patient) -> list[tuple[str, dict]]:
    """(fullUrl, resource) of one patient: Patient, Encounter, Observations, Conditions."""
    puid = _uuid("patient", p.pid)
    subject = {"reference": f"urn:uuid:{puid}"}
    out = [(f"urn:uuid:{puid}", {
        "resourceType": "Patient", "id": puid, "gender": p.sex, "birthDate": p.birth.isoformat(),
        "identifier": [{"system": "https://github.com/synthetichealth/synthea", "value": puid},
                       {"system": "http://hospital.example/mrn", "value": f"p{p.pid}"}]})]
    out.append((f"urn:uuid:{_uuid('encounter', p.pid)}", {
        "resourceType": "Encounter", "id": _uuid("encounter", p.pid), "status": "finished",
        "class": {"code": "IMP"}, "subject": subject, "period": {"start": _iso(p.index)}}))
    for n, e in enumerate(p.events, 1):
        q = {"value": e.value, **({"unit": e.unit, "system": "http://unitsofmeasure.org", "code": e.unit}
                                  if e.unit else {}), **({"comparator": e.comparator} if e.comparator else {})}
        oid = _uuid("observation", p.pid, n)
        out.append((f"urn:uuid:{oid}", {
            "resourceType": "Observation", "id": oid, "status": "final",
            "category": [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/observation-category",
                                      "code": "laboratory"}]}],
            "code": {"coding": [{"system": "http://loinc.org", "code": LABS[e.feature][0]}]}, "subject": subject,
            "effectiveDateTime": _iso(p.index + timedelta(hours=e.hours)), "valueQuantity": q}))
    if p.smoking is not None:
        oid = _uuid("observation", p.pid, 900)
        out.append((f"urn:uuid:{oid}", {
            "resourceType": "Observation", "id": oid, "status": "final",
            "code": {"coding": [{"system": "http://loinc.org", "code": SMOKING[0]}]}, "subject": subject,
            "effectiveDateTime": _iso(p.index),
            "valueCodeableConcept": {"coding": [{"system": "http://snomed.info/sct", "code": "8517006"}],
                                     "text": p.smoking}}))
    if p.copd_hours is not None:
        out.append((f"urn:uuid:{_uuid('condition', p.pid)}", {
            "resourceType": "Condition", "id": _uuid("condition", p.pid), "subject": subject,
            "code": {"coding": [{"system": "http://snomed.info/sct", "code": COPD[0]}]},
            "onsetDateTime": _iso(p.index + timedelta(hours=p.copd_hours))}))
    oid = _uuid("observation", p.pid, 999)   # the outcome, a day after the index time
    out.append((f"urn:uuid:{oid}", {
        "resourceType": "Observation", "id": oid, "status": "final",
        "code": {"coding": [{"system": LOCAL_SYSTEM, "code": OUTCOME[0]}]}, "subject": subject,
        "effectiveDateTime": _iso(p.index + timedelta(days=1)), "valueBoolean": p.outcome}))
    return out


def write_fhir(path: str | Path, cohort: Cohort, *, form: str = "bundles") -> Path:
    """``form="bundles"``: a folder of one transaction Bundle a patient (Synthea); ``"ndjson"``: a bulk
    export's folder (Patient.ndjson, Observation.ndjson, Encounter.ndjson, Condition.ndjson)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if form == "bundles":
        for p in cohort.patients:
            entries = [{"fullUrl": url, "resource": r, "request": {"method": "POST", "url": r["resourceType"]}}
                       for url, r in fhir_resources(p)]
            (path / f"Given{p.pid}_Family_{_uuid('patient', p.pid)}.json").write_text(
                json.dumps({"resourceType": "Bundle", "type": "transaction", "entry": entries}))
        return path
    by_type: dict[str, list[str]] = {}
    for p in cohort.patients:
        for _, r in fhir_resources(p):
            if "subject" in r:   # bulk exports reference by type and id
                r = {**r, "subject": {"reference": f"Patient/{_uuid('patient', p.pid)}"}}
            by_type.setdefault(r["resourceType"], []).append(json.dumps(r))
    for kind, lines in by_type.items():
        (path / f"{kind}.ndjson").write_text("\n".join(lines) + "\n")
    return path


# -- MEDS (data/ shards, metadata/, a label file) ------------------------------------------------------------

def write_meds(root: str | Path, cohort: Cohort) -> Path:
    """A MEDS dataset under ``root``; returns its label file (prediction time = index time)."""
    import meds
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(root)
    (root / "data" / "train").mkdir(parents=True, exist_ok=True)
    (root / "metadata").mkdir(parents=True, exist_ok=True)
    rows = []
    for p in cohort.patients:
        rows.append((p.pid, None, f"GENDER//{p.sex[0].upper()}", None, None))
        rows.append((p.pid, datetime.combine(p.birth, datetime.min.time()), meds.birth_code, None, None))
        for e in p.events:
            code = f"LOINC/{LABS[e.feature][0]}" + (f"//{e.unit}" if e.unit else "")
            text = f"{e.comparator}{e.value:g}" if e.comparator else None
            rows.append((p.pid, p.index + timedelta(hours=e.hours), code, None if e.comparator else e.value, text))
        if p.smoking is not None:
            rows.append((p.pid, p.index, f"LOINC/{SMOKING[0]}", None, p.smoking))
        if p.copd_hours is not None:
            rows.append((p.pid, p.index + timedelta(hours=p.copd_hours), f"SNOMED/{COPD[0]}", None, None))
        if p.outcome:
            rows.append((p.pid, p.index + timedelta(days=1), f"LOCAL/{OUTCOME[0]}", None, None))
    sid, time, code, value, text = zip(*rows, strict=True)
    table = pa.table({"subject_id": pa.array(sid, pa.int64()), "time": pa.array(time, pa.timestamp("us")),
                      "code": pa.array(code, pa.string()), "numeric_value": pa.array(value, pa.float32()),
                      "text_value": pa.array(text, pa.large_string())})
    table = meds.DataSchema.align(table).sort_by([("subject_id", "ascending"), ("time", "ascending")])
    pq.write_table(table, root / "data" / "train" / "0.parquet")
    (root / "metadata" / "dataset.json").write_text(json.dumps({"dataset_name": "cohort", "dataset_version": "1",
                                                                "etl_name": "tests", "etl_version": "1",
                                                                "meds_version": meds.__version__}))
    pq.write_table(pa.table({"code": pa.array([f"LOINC/{c}" for c, _ in LABS.values()]),
                             "description": pa.array(list(LABS)),
                             "parent_codes": pa.array([[] for _ in LABS], pa.list_(pa.string()))}),
                   root / "metadata" / "codes.parquet")
    labels = meds.LabelSchema.align(pa.table({
        "subject_id": pa.array([p.pid for p in cohort.patients], pa.int64()),
        "prediction_time": pa.array([p.index for p in cohort.patients], pa.timestamp("us")),
        "boolean_value": pa.array([p.outcome for p in cohort.patients], pa.bool_())}))
    pq.write_table(labels, root / "labels.parquet")
    return root / "labels.parquet"


def write_dictionary(path: str | Path) -> Path:
    """:data:`DICTIONARY` as a dictionary TOML file."""
    import tomli_w

    features = [f.model_dump(mode="json", exclude_none=True, exclude_defaults=True) | {"id": f.id, "kind": f.kind.value}
                for f in DICTIONARY.features]
    Path(path).write_text(tomli_w.dumps({"name": DICTIONARY.name, "version": DICTIONARY.version,
                                         "features": features}))
    return Path(path)


def write_source_file(path: str | Path, kind: str, site: str) -> Path:
    """A source file (``site`` and the ``[omop]``, ``[meds]`` or ``[fhir]`` of :func:`source_files`)."""
    import tomli_w

    Path(path).write_text(tomli_w.dumps({"site": site, kind: source_files()[kind]}))
    return Path(path)


def source_files() -> dict[str, dict]:
    """The three source-file sections (``[omop]``, ``[meds]``, ``[fhir]``) reading the exports alike."""
    units, censored = {"heart_rate": "/min"}, "half_bound"
    return {
        "omop": {"cohort": {"visit_concept_ids": [INPATIENT]},
                 "label": {"condition_concept_ids": [OUTCOME[1]], "window_days": WINDOW_DAYS},
                 "lookback_days": LOOKBACK_DAYS, "units": units, "censored": censored,
                 "person": {"age": "age", "sex": {"feature": "sex", "male": "male", "female": "female"}}},
        "meds": {"labels": "labels.parquet", "lookback_hours": 24.0 * LOOKBACK_DAYS, "units": units,
                 "censored": censored, "age": "age", "sex": {"feature": "sex", "male": "male", "female": "female"}},
        "fhir": {"label_code": f"LOCAL/{OUTCOME[0]}", "systems": {LOCAL_SYSTEM: "LOCAL"}, "units": units,
                 "censored": censored, "age": "age", "sex": {"feature": "sex", "male": "male", "female": "female"}},
    }
