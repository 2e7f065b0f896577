"""FHIR R4 Patient and Observation resources -> the long table :func:`ingest` takes.

Input is a Bundle (one JSON file), an NDJSON file of a bulk export (gzip-compressed
``.ndjson.gz`` too), or a folder of them (``Patient.ndjson``, ``Observation.ndjson.gz``, ...;
its other files are counted as not read). The fields read are validated strictly
(:mod:`.fhir_models`; ``validate="full"`` adds ``fhir.resources``' full R4B models); a resource
that does not validate is named by file, line (or entry) and field path -- never by value --
and all of them are reported at once. Resource types other than Patient and Observation are
counted by type and skipped. A date-only time reads at 00:00 UTC of its day (counted); a month
or a year only is excluded (counted). ``Patient.birthDate``/``gender`` give age and sex where the source file
names those features.

An Observation's ``code.coding`` maps through the dictionary's codes: the coding system's URL is
named by ``systems`` (``http://loinc.org`` -> ``LOINC``) and ``SYSTEM/CODE`` is looked up.
Values: ``valueQuantity`` (its UCUM ``code``, else its ``unit``, read through pint; a
``comparator`` makes it censored), ``valueBoolean`` (1/0) or ``valueInteger``; each
``component`` (a blood-pressure panel's systolic and diastolic) is read as an observation of its
own code at the panel's time; a ``dataAbsentReason`` is counted as missing; an Observation
``entered-in-error`` or ``cancelled`` is excluded and counted. ``subject`` references a Patient
relatively, absolutely, by version or by a bundle's ``urn:uuid:`` (:data:`PATIENT_REF`), or one
in the Observation's ``contained`` (``#p1``: the patient of its identifier), or logically
(``subject.identifier``: the one Patient read with that identifier). Codings of two
different dictionary features in one ``code`` are an error (which one is meant is ambiguous). Time: ``effectiveDateTime``, ``effectiveInstant``,
``effectivePeriod.start`` or ``issued``, counted in hours from the patient's first mapped
observation (with ``index``: from the start of the patient's first Encounter of its classes, the
Observations of its lookback only) and binned into snapshots of ``snapshot_hours``. The label is the latest
Observation coded ``label_code`` (boolean or 0/1 integer).
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from clinograph.core.errors import ConfigError, SchemaError

from ..ontology.dictionary import FeatureDictionary
from .ehr_values import CensorPolicy, declared_features
from .extract import EhrExtract, to_long
from .fhir_patients import (
    CONTAINED,
    LOGICAL,
    MAX_PROBLEMS_SHOWN,
    PATIENT_REF,
    logical_subjects,
    one_birth_a_patient,
    person_events,
)
from .omop import OmopSex

DEFAULT_SYSTEMS = {"http://loinc.org": "LOINC", "http://snomed.info/sct": "SNOMED",
                   "urn:oid:2.16.840.1.113883.6.1": "LOINC", "urn:oid:2.16.840.1.113883.6.96": "SNOMED",  # C-CDA
                   "https://clinograph.org/fhir/CodeSystem/alarm": "ALARM"}
UCUM_URL = "http://unitsofmeasure.org"
#: UCUM's system URL and OID (C-CDA conversions write the OID): valueQuantity.code is then UCUM
UCUM_SYSTEMS = (None, UCUM_URL, "urn:oid:2.16.840.1.113883.6.8")
#: counts key prefix of a coding system URL not in ``systems`` (the reading is "(uncoded)")
OTHER_SYSTEM = "system "
#: a system URL is shown in the report only if it looks like one (never free text)
_SYSTEM_URL = re.compile(r"^(https?://|urn:oid:|urn:uuid:)[A-Za-z0-9.:/_\-#]{1,100}$")
#: a resourceType shown in the report (a type's name, never free text)
_RESOURCE_TYPE = re.compile(r"^[A-Z][A-Za-z]{1,63}$")
#: the skipped counter's entry for the folder's files not read
FILES = "(files not read)"
#: Observation statuses whose value is not a result: excluded and counted
WITHDRAWN = frozenset({"entered-in-error", "cancelled"})


#: file names read: a Bundle or resource, NDJSON, and NDJSON compressed with gzip (bulk exports)
READ_SUFFIXES = (".json", ".ndjson", ".ndjson.gz")


def _is_read(f: Path) -> bool:
    return f.name.lower().endswith(READ_SUFFIXES)


def folder_files(path: Path) -> tuple[list[Path], int]:
    """The files of a folder that are read (:data:`READ_SUFFIXES`), and how many others it holds
    (counted in the report, never read silently as nothing)."""
    if not path.is_dir():
        return [path], 0
    files = sorted(p for p in path.iterdir() if p.is_file())
    read = [p for p in files if _is_read(p)]
    if not read:
        raise ConfigError(f"FHIR folder {path} holds no .ndjson, .ndjson.gz or .json file ({len(files)} other "
                          "file(s)). Give the folder of the bulk export's NDJSON files or of Bundle .json files.")
    return read, len(files) - len(read)


#: a file name shown in messages: a FHIR type's name with numbers (``Observation.ndjson``,
#: ``1.Observation.ndjson``, ``Observation_002.ndjson.gz``, ``hospitalInformation1671.json``); others
#: may name a patient (Synthea writes ``Given_Family_<uuid>.json``) and are shown by their place
_SHOWN_NAME = re.compile(r"^(\d{1,8}[._-])?(?P<word>[A-Za-z]{1,40})([._-]?\d{1,8})*\.(ndjson|json)(\.gz)?$")
#: words of shown file names besides FHIR's type names (Synthea's, bulk exporters')
_FILE_WORDS = frozenset({"bundle", "export", "output", "data", "fhir", "hospitalinformation",
                         "practitionerinformation"})


@functools.cache
def _type_names() -> frozenset[str]:
    """FHIR's resource and data type names, lower case (the modules of ``fhir.resources.R4B``)."""
    import pkgutil

    import fhir.resources.R4B as r4b

    return frozenset(m.name for m in pkgutil.iter_modules(r4b.__path__)) | _FILE_WORDS


def shown_names(files: list[Path], *, folder: bool) -> list[str]:
    """How each file is named in messages and the report: its name when it is a FHIR type's name
    with numbers (:data:`_SHOWN_NAME`) or the user gave the file itself; else ``file 3 of 12 (by name)``."""
    if not folder:
        return [f.name for f in files]
    shown = [(m := _SHOWN_NAME.match(f.name)) is not None and m.group("word").lower() in _type_names() for f in files]
    return [f.name if ok else f"file {i} of {len(files)} (by name)" for i, (f, ok) in enumerate(zip(files, shown,
                                                                                                  strict=True), 1)]


def _resources(files: list[Path], names: list[str]):
    """(where, dict, the entry's fullUrl or None) for every resource in Bundles, NDJSON files
    (gzip-compressed too; a line may hold a Bundle) or single resources."""
    for f, name in zip(files, names, strict=True):
        if not f.is_file():
            raise ConfigError(f"FHIR input {name} does not exist. Give a Bundle .json, an .ndjson file or a folder.")
        if f.name.lower().endswith(".gz"):
            yield from _gzip_lines(f, name)
            continue
        if f.suffix.lower() == ".ndjson":
            with open(f, "rb") as fh:  # bytes: a line that is not UTF-8 is named, not a decoder traceback
                yield from _lines(fh, name)
            continue
        yield from _entries(_json(f.read_bytes(), name), name)


def _lines(fh, name: str):  # noqa: ANN001 - a binary file object
    for n, line in enumerate(fh, 1):
        if line.strip():
            yield from _entries(_json(line, f"{name} line {n}"), f"{name} line {n}")


def _entries(doc: dict, where: str):
    """The resource ``doc``, or the resources of a Bundle (each named by its entry)."""
    if doc.get("resourceType") != "Bundle":
        yield where, doc, None
        return
    entries = doc.get("entry") or []
    if not isinstance(entries, list):
        raise SchemaError(f"FHIR Bundle {where}: 'entry' is a JSON {type(entries).__name__}, not a list of "
                          "entries. Export the Bundle again.", title="FHIR input cannot be parsed")
    for n, entry in enumerate(entries, 1):
        resource = (entry or {}).get("resource") if isinstance(entry, dict | None) else entry
        if not isinstance(resource, dict | None):
            raise SchemaError(f"FHIR Bundle {where} entry {n} is not an object with a 'resource' object. "
                              "Export the Bundle again.", title="FHIR input cannot be parsed")
        url = entry.get("fullUrl") if isinstance(entry, dict) else None
        yield f"{where} entry {n}", resource or {}, url if isinstance(url, str) else None


def _gzip_lines(f: Path, name: str):
    """The resources of a gzip-compressed NDJSON file, line by line; a file that is not gzip (or
    is cut short) is a SchemaError naming it."""
    import gzip
    import zlib

    try:
        with gzip.open(f, "rb") as fh:
            yield from _lines(fh, name)
    except (OSError, EOFError, zlib.error) as exc:
        raise SchemaError(f"FHIR input {name} is not a complete gzip file ({type(exc).__name__}). Give the NDJSON "
                          "file compressed with gzip, or uncompressed as .ndjson.",
                          title="FHIR input cannot be parsed") from None


def _json(data: bytes, where: str) -> dict:
    """The JSON object in ``data`` (UTF-8); a SchemaError naming ``where`` for anything else --
    binary bytes, broken JSON, or nesting deeper than the decoder's recursion bound (never a
    FHIR resource: R4 nests a few levels)."""
    try:
        doc = json.loads(data.decode("utf-8-sig"), parse_constant=_no_constant)  # a leading BOM is allowed
    except UnicodeDecodeError as exc:
        raise SchemaError(f"FHIR input {where} is not UTF-8 text (byte {exc.start} cannot be decoded): a binary or "
                          "otherwise encoded file. Give the FHIR export as JSON/NDJSON in UTF-8.",
                          title="FHIR input cannot be parsed") from None
    except json.JSONDecodeError as exc:
        raise SchemaError(f"FHIR input {where} is not valid JSON (position {exc.pos}). Export it again.",
                          title="FHIR input cannot be parsed") from None
    except ValueError as exc:  # NaN / Infinity (not JSON), or an integer past Python's digit bound
        raise SchemaError(f"FHIR input {where} is not valid JSON ({exc}). Export it again.",
                          title="FHIR input cannot be parsed") from None
    except RecursionError:
        raise SchemaError(f"FHIR input {where} nests JSON arrays or objects too deeply to be a FHIR resource (past "
                          "the decoder's recursion bound). Export it again from the EHR; a hand-made or damaged "
                          "file is not read.", title="FHIR input cannot be parsed") from None
    if not isinstance(doc, dict):
        raise SchemaError(f"FHIR input {where} is not a JSON object (a resource).", title="FHIR input cannot be parsed")
    return doc


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _validate(model, doc: dict, where: str, problems: list[str], full=None):  # noqa: ANN001
    """``doc`` as ``model`` (the fields read, :mod:`.fhir_models`), and -- ``full`` given -- as the
    full ``fhir.resources`` model too; problems name the place and field paths, never values."""
    fields: set[str] = set()
    out = None
    for m in (model, full) if full is not None else (model,):
        try:
            parsed = m.model_validate(doc) if m is model else m.parse_obj(doc)  # fhir.resources: pydantic v1 API
        except Exception as exc:  # pydantic's ValidationError (ours, or fhir.resources' own)
            errors = exc.errors() if hasattr(exc, "errors") else []
            fields |= {".".join(str(x) for x in e.get("loc", ())) for e in errors} or {"?"}
            continue
        out = parsed if m is model else out
    if fields:
        problems.append(f"FHIR {doc.get('resourceType')} at {where} does not validate (fields: "
                        f"{', '.join(sorted(fields)[:5])}). Fix the export for those fields.")
        return None
    return out


def _when(obs) -> str | None:  # noqa: ANN001
    for t in (obs.effectiveDateTime, obs.effectiveInstant, obs.effectivePeriod.start if obs.effectivePeriod else None,
              obs.issued):
        if t is not None:
            return t
    return None


def _value(x) -> tuple[float | None, str | None, str | None]:  # noqa: ANN001 - an Observation or a component
    """(value, unit, censoring comparator) of an Observation or one of its components."""
    q = x.valueQuantity
    if q is not None and q.value is not None:
        unit = q.code if q.code and q.system in UCUM_SYSTEMS else q.unit
        try:
            value = float(q.value)
        except OverflowError:  # a JSON integer beyond a float: infinite, refused by ingest() with its place
            value = float("inf") if q.value > 0 else float("-inf")
        return value, unit, q.comparator
    if x.valueBoolean is not None:
        return float(x.valueBoolean), None, None
    if x.valueInteger is not None:
        return float(x.valueInteger), None, None
    return None, None, None


def read_fhir(path: str | Path, *, dictionary: FeatureDictionary, site: str, label_code: str | None,
              systems: dict[str, str] | None = None, patient_id: Literal["id", "identifier"] = "id",
              identifier_system: str | None = None, snapshot_hours: float = 24.0, units: dict[str, str] | None = None,
              censored: CensorPolicy | None = None, age: str | None = None, sex: OmopSex | None = None,
              validate: Literal["fields_read", "full"] = "fields_read", index=None) -> EhrExtract:  # noqa: ANN001
    """FHIR R4 Patient and Observation resources as an :class:`EhrExtract`.

    ``label_code``: ``SYSTEM/CODE`` of the outcome Observation, or None for an unlabeled
    extract. ``systems``: coding-system URL -> system name, added to :data:`DEFAULT_SYSTEMS`.
    ``patient_id``: the Patient's resource id, or its identifier's value: the first identifier of
    system ``identifier_system`` (an MRN's, say: Synthea lists its own uuid first), else its first
    identifier; a Patient without one of that system is refused by place. ``units``:
    feature id -> unit of its values that carry none; ``censored``: how ``comparator`` values are
    read (:mod:`.ehr_values`). ``age``: a numeric feature given the age in years (from
    ``birthDate``) at the patient's first mapped observation; ``sex``: the feature and codes
    ``Patient.gender`` male/female are written as (other genders: missing, counted).
    ``validate``: the fields read (:mod:`.fhir_models`, default) or every resource in full with
    ``fhir.resources`` as well. ``index`` (a :class:`.sources.FhirIndex`): time 0 is the start of each
    patient's first Encounter of its classes, features the Observations from its ``lookback_hours``
    before it up to it; None: time 0 is each patient's first mapped Observation, every one read.

    Raises:
        ConfigError: the input does not exist.
        SchemaError: invalid JSON, or resources that do not validate (all named at once).
        UnitError: values without a unit (and none declared), or censored values without a
            declared policy (every feature at once).
    """
    from . import fhir_models as fm

    declared_features(section="[fhir]", person_section="[fhir]", age=age, sex=sex, conditions=(),
                      units=dict(units or {}), dictionary=dictionary)

    full_patient = full_observation = full_encounter = None
    if validate == "full":
        from fhir.resources.R4B.encounter import Encounter as full_encounter
        from fhir.resources.R4B.observation import Observation as full_observation
        from fhir.resources.R4B.patient import Patient as full_patient

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"FHIR input {path} does not exist. Give a Bundle .json, an .ndjson file or a folder.")
    names = {**DEFAULT_SYSTEMS, **(systems or {})}
    problems: list[str] = []
    patients: dict[str, str] = {}
    known = set(dictionary.by_code())
    readings: list[tuple] = []  # plain tuples, not model objects: 10^5 live models slow the garbage collector
    counts: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    holders: dict[str, dict[str, str]] = {}  # patient key -> Patient resource id -> where it was read
    records: dict[str, list[tuple[str | None, str | None, str]]] = {}  # key -> (birthDate, gender, where), all copies
    local: list[str] = []  # Observations whose contained Patient cannot name a patient (patient_id = "id")
    codings: dict[tuple[str, ...], list[str]] = {}  # codes of several features -> the Observations coded so
    feature_of = {k: f.id for k, f in dictionary.by_code().items()}
    idents: dict[tuple[str, str], set[str]] = {}  # (identifier system, value) -> keys of Patients that carry it
    nameless: list[str] = []  # Patients without an id (nor a Bundle fullUrl naming one), read by id
    lacking: list[str] = []  # Patients without an identifier of identifier_system, read by identifier
    encounters: list[tuple[str, str, str]] = []  # [fhir] index: (subject reference, period.start, where)
    files, other_files = folder_files(path)
    for where, doc, url in _resources(files, shown_names(files, folder=path.is_dir())):
        kind = doc.get("resourceType")
        if kind == "Patient":
            p = _validate(fm.Patient, doc, where, problems, full_patient)
            if p is not None:
                ident = _identifier(p, identifier_system)
                if patient_id == "identifier" and identifier_system and ident is None:
                    lacking.append(where)
                    continue
                # a transaction Bundle's entry may name its Patient by fullUrl only (urn:uuid:..., no id)
                m = PATIENT_REF.search(url or "")
                ids = list(dict.fromkeys(i for i in (p.id, m and (m.group(1) or m.group(2))) if i))
                if not ids and not (patient_id == "identifier" and ident):
                    nameless.append(where)
                    continue
                key = ident if patient_id == "identifier" and ident else ids[0]
                patients.update(dict.fromkeys(ids, key))
                for i in p.identifier or ():
                    if i.value:
                        idents.setdefault((i.system or "", i.value), set()).add(key)
                records.setdefault(key, []).append((p.birthDate, p.gender, where))
                holders.setdefault(key, {}).setdefault(ids[0] if ids else where, where)
        elif kind == "Observation":
            o = _validate(fm.Observation, doc, where, problems, full_observation)
            if o is not None:
                subject = (o.subject.reference or "") if o.subject else ""
                if not subject and o.subject and o.subject.identifier and o.subject.identifier.value:
                    subject = LOGICAL + json.dumps([o.subject.identifier.system or "", o.subject.identifier.value])
                if subject.startswith("#"):
                    subject = _contained_patient(o, subject, where, patient_id=patient_id,
                                                 identifier_system=identifier_system, problems=problems,
                                                 full=full_patient, records=records, local=local) or subject
                _read_observation(o, where, subject=subject, names=names, feature_of=feature_of,
                                  label_code=label_code, out=readings, counts=counts, codings=codings)
        elif kind == "Encounter" and index is not None:
            e = _validate(fm.Encounter, doc, where, problems, full_encounter)
            if e is not None and e.class_ is not None and e.class_.code in index.encounter_classes \
                    and e.period is not None and e.period.start and e.subject is not None and e.subject.reference:
                encounters.append((e.subject.reference, e.period.start, where))
        else:
            skipped[str(kind)] += 1
    born = one_birth_a_patient(records, holders, problems, patient_id=patient_id)
    if lacking:
        problems.append(f"{len(lacking)} Patient(s) carry no identifier of system {identifier_system!r} (e.g. "
                        f"{', '.join(lacking[:3])}), which [fhir] identifier_system names as the patient id: they "
                        "cannot be named. Export that identifier for every Patient, or name another system.")
    if nameless:
        problems.append(f"{len(nameless)} Patient(s) have no id, and no Bundle fullUrl naming one (e.g. "
                        f"{', '.join(nameless[:3])}): no Observation can reference them. Export the Patients with "
                        "their ids, or read patients by identifier: patient_id = \"identifier\" under [fhir].")
    if local:
        problems.append(f"{len(local)} Observation(s) reference a Patient contained in them (e.g. "
                        f"{', '.join(local[:3])}): a contained Patient's id means nothing outside its Observation, so "
                        "it cannot name one patient across Observations. Read patients by their identifier: "
                        "patient_id = \"identifier\" under [fhir] (each contained Patient needs one).")
    for codes, places in codings.items():
        problems.append(f"{len(places)} Observation(s) (e.g. {', '.join(places[:3])}) are coded "
                        f"{' and '.join(codes)}, codes of {'two' if len(codes) == 2 else len(codes)} different "
                        f"dictionary features ({', '.join(repr(feature_of.get(c, 'the label')) for c in codes)}): "
                        "which one the value measures is ambiguous. Keep one of those codings in the export, or "
                        "move the code in the dictionary.")
    shared = [places for places in holders.values() if len(places) > 1]
    if shared:  # two Patients read as one: their observations would be merged (ids are not shown)
        problems.append(f"{len(shared)} patient key(s) ({'identifier' if patient_id == 'identifier' else 'id'}) are "
                        f"shared by several Patient resources (e.g. {', '.join(list(shared[0].values())[:3])}): "
                        "their observations would be merged into one patient. Give each Patient its own "
                        "identifier, or read patients by patient_id = \"id\".")
    if problems:
        shown = problems[:MAX_PROBLEMS_SHOWN]
        if len(problems) > MAX_PROBLEMS_SHOWN:
            shown.append(f"... and {len(problems) - MAX_PROBLEMS_SHOWN} more resource(s) that do not validate.")
        raise SchemaError(shown, title=f"FHIR input {path} has invalid resources")
    patients.update({CONTAINED + key: key for key in records})  # contained Patients' subjects (their keys)
    patients.update(logical_subjects(readings, idents))
    skipped[FILES] = other_files
    return _assemble(readings, counts, patients, born, skipped, label_code=label_code, known=known,
                     dictionary=dictionary, site=site, snapshot_hours=snapshot_hours, units=units,
                     censored=censored, age=age, sex=sex, index=index, encounters=encounters)


def _keys(code, names: dict[str, str]) -> list[str]:  # noqa: ANN001 - a CodeableConcept
    return [f"{names[c.system]}/{c.code}" for c in (code.coding or []) if c.system in names and c.code]


def _identifier(p, system: str | None) -> str | None:  # noqa: ANN001 - a Patient model
    """The value of ``p``'s first identifier of ``system`` (any system when None), or None."""
    return next((i.value for i in p.identifier or () if i.value and (system is None or i.system == system)), None)


def _contained_patient(o, ref: str, where: str, *, patient_id, identifier_system, problems, full, records,  # noqa: ANN001
                       local) -> str | None:
    """The subject reference of an Observation whose ``subject`` is a Patient in its ``contained``
    (``#p1``): :data:`CONTAINED` + the patient key (its identifier; ``patient_id = "id"`` cannot
    name a patient by a contained id: ``where`` is added to ``local``); None if no contained
    Patient has that id (then counted as without a Patient)."""
    from . import fhir_models as fm

    doc = next((r for r in o.contained or () if r.get("resourceType") == "Patient" and f"#{r.get('id')}" == ref),
               None)
    if doc is None:
        return None
    p = _validate(fm.Patient, doc, f"{where} (contained Patient)", problems, full)
    if p is None:
        return None
    ident = _identifier(p, identifier_system)
    if patient_id != "identifier" or not ident:
        local.append(where)
        return None
    records.setdefault(ident, []).append((p.birthDate, p.gender, where))
    return CONTAINED + ident


def _target(keys: list[str], where: str, *, feature_of, label_code, codings) -> str | None:  # noqa: ANN001
    """The one code of ``keys`` that is read: the first coding of a dictionary feature (or the
    label); codings of the same feature are one reading. None, with ``where`` added to
    ``codings``, when they are codes of different features (or a feature and the label)."""
    hits: dict[str, str] = {}
    for k in keys:
        t = "(label)" if k == label_code else feature_of.get(k)
        if t is not None:
            hits.setdefault(t, k)
    if len(hits) > 1:
        codings.setdefault(tuple(hits.values()), []).append(where)
        return None
    return next(iter(hits.values()), keys[0] if keys else "(uncoded)")


def _read_observation(o, where: str, *, subject: str, names, feature_of, label_code, out: list,  # noqa: ANN001
                      counts: Counter, codings: dict) -> None:
    """The readings of one Observation (itself, or each component of a panel) as tuples
    ``(subject reference, time, SYSTEM/CODE, value, unit, comparator, where)``; those with a
    ``dataAbsentReason`` or no value are counted."""
    if o.status in WITHDRAWN:
        counts["withdrawn"] += 1
        return
    when = _when(o)
    parts = [(o, _keys(o.code, names))]
    if o.component:  # a panel (blood pressure): each component is an observation of its own code
        parts += [(c, _keys(c.code, names)) for c in o.component]
    for x, keys in parts:
        if x is o and o.component and x.valueQuantity is None and x.valueBoolean is None \
                and x.valueInteger is None and x.dataAbsentReason is None:
            continue  # the panel's own code carries no value
        key = _target(keys, where, feature_of=feature_of, label_code=label_code, codings=codings)
        if key is None:
            continue
        if not keys:  # coded only in systems not named: which ones, so that `systems` can name them
            counts.update(f"{OTHER_SYSTEM}{c.system}" for c in (x.code.coding or []) if c.system and c.code)
        if x.dataAbsentReason is not None:
            counts["absent"] += 1
            continue
        value, unit, comparator = _value(x)
        if value is None:
            counts["no_value"] += 1
            continue
        # one string object a distinct subject, code and unit (not one a reading): 10^6 readings share them
        out.append((sys.intern(subject), when, sys.intern(key), value, sys.intern(unit) if isinstance(unit, str)
                    else unit, None if comparator == "ad" else comparator, where))


def _assemble(readings, counts, patients, born, skipped, *, label_code, known, dictionary, site,  # noqa: ANN001, PLR0913
              snapshot_hours, units, censored, age, sex, index=None, encounters=()):
    rows, label_rows, orphans = [], [], 0

    def patient_of(ref: str) -> str | None:
        local = ref.startswith((CONTAINED, LOGICAL))
        m = None if local else PATIENT_REF.search(ref)
        return patients.get(ref) if local else patients.get(m.group(1) or m.group(2)) if m else None

    for ref, when, key, value, unit, comparator, where in readings:
        pid = patient_of(ref)
        if pid is None:
            orphans += 1
            continue
        (label_rows if key == label_code else rows).append((pid, when, key, value, unit, comparator, where))
    no_value, absent, withdrawn = counts["no_value"], counts["absent"], counts["withdrawn"]
    ev = pd.DataFrame(rows, columns=["patient_id", "t", "code", "value", "unit", "censor", "where"])
    del rows
    readings.clear()  # consumed (read_fhir's list): its tuples are not kept alive beside the frame through to_long
    t = _times(ev["t"], ev["where"]).dt.tz_localize(None)
    mapped = ev["code"].isin(known)
    precision = ev["t"].str.len()  # R4 dateTime: YYYY, YYYY-MM, YYYY-MM-DD, or a time with its offset
    partial = (mapped & (precision < len("YYYY-MM-DD"))).to_numpy()  # a year or month: no day to place it in
    date_only = int((mapped & (precision == len("YYYY-MM-DD"))).sum())  # read at 00:00 UTC of that day
    t = t.mask(pd.Series(partial, index=t.index))
    timeless = (mapped & t.isna()).to_numpy()  # no effective[x] nor issued: no snapshot to put it in
    ev, t, mapped = ev[~timeless], t[~timeless], mapped[~timeless]
    index_notes: tuple[str, ...] = ()
    outside: dict[str, int] = {}
    if index is None:
        origin = t[mapped].groupby(ev.loc[mapped, "patient_id"]).min()
    else:  # time 0: each patient's first Encounter of the index classes (as OMOP's first visit)
        enc = pd.DataFrame([(patient_of(r), when, where) for r, when, where in encounters],
                           columns=["patient_id", "t", "where"]).dropna(subset=["patient_id"])
        origin = _times(enc["t"], enc["where"]).dt.tz_localize(None).groupby(enc["patient_id"].to_numpy()).min()
    # reindex, not map: pandas 3 cannot map through an empty Series of times (no Observation read)
    hours = ((t - origin.reindex(ev["patient_id"]).to_numpy()) / pd.Timedelta(hours=1)).to_numpy(dtype=float)
    if index is not None:  # the window: lookback_hours before time 0 up to it; patients without an index: none
        no_index = np.isnan(hours)
        after, before = ~no_index & (hours > 0), ~no_index & (hours < -index.lookback_hours)
        keep = ~(no_index | after | before)
        ev, hours = ev[keep], hours[keep]
        outside = {"patients without an index Encounter": int(len(set(patients.values())) - len(origin)),
                   "after the index time": int(after.sum()), "before the lookback": int(before.sum())}
        index_notes = (f"Observations after the index time (the first Encounter of class "
                       f"{', '.join(index.encounter_classes)}; excluded): {int(after.sum())}",
                       f"Observations more than {index.lookback_hours:g} h before the index time (excluded): "
                       f"{int(before.sum())}",
                       f"patients without an index Encounter (not read): {outside['patients without an index Encounter']}")
    events = ev.assign(hours=np.where(np.isnan(hours), 0.0, hours))
    person, unknown_sex = person_events(born, origin, age=age, sex=sex, dictionary=dictionary)
    if index is not None and len(person):  # outside the cohort: no index Encounter
        person = person[person["patient_id"].isin(origin.index)]
    if len(person):
        events = pd.concat([events, person], ignore_index=True)
    labels = None
    if label_code is not None:
        lab = pd.DataFrame(label_rows, columns=["patient_id", "t", "code", "value", "unit", "censor", "where"])
        lab = lab.assign(t=_times(lab["t"], lab["where"])).sort_values("t", na_position="first")  # timed: latest
        labels = lab.groupby("patient_id")["value"].last().astype(float)
        if index is not None:  # patients without an index time are outside the cohort
            labels = labels[labels.index.isin(origin.index)]
    notes = tuple(f"{what}: {n}" for what, n in (
        ("Observation readings (a panel: each component) without a Patient read here", orphans),
        ("Observations (or components) without a numeric or boolean value", no_value),
        ("Observations (or components) with a dataAbsentReason (read as missing)", absent),
        ("Observations (or components) without a time: no effective[x] nor issued (excluded)",
         int(timeless.sum()) - int(partial.sum())),
        ("Observations (or components) dated to a month or year only (excluded: no day to place them in)",
         int(partial.sum())),
        ("Observations (or components) dated to the day only, read at 00:00 UTC of that day", date_only),
        ("Observations entered in error or cancelled (excluded)", withdrawn),
        ("patients of a gender other than male/female (sex missing)", unknown_sex),
        (f"other resources skipped{_kinds(skipped)}", sum(n for k, n in skipped.items() if k != FILES)),
        ("files in the folder not read (not .json, .ndjson or .ndjson.gz)", skipped[FILES])) if n)
    others = {k.removeprefix(OTHER_SYSTEM): n for k, n in counts.items() if k.startswith(OTHER_SYSTEM)}
    if others:
        shown = sorted(u for u in others if _SYSTEM_URL.match(u))[:5]
        notes += (f"codings in coding systems not named in systems (read as '(uncoded)'): {sum(others.values())} in "
                  f"{len(others)} system(s) ({', '.join(shown) or 'not shown'}); name a system with systems = "
                  "{ \"<url>\" = \"<NAME>\" } under [fhir] if the dictionary has its codes",)
    notes += index_notes
    cohort = sorted(set(patients.values()) if index is None else set(origin.index) & set(patients.values()))
    return to_long(events, labels=labels, patients=cohort, dictionary=dictionary, site=site,
                   source="FHIR R4", snapshot_hours=snapshot_hours, notes=notes, units=units, censored=censored,
                   setting="[fhir] in the source file",
                   excluded={"without a Patient": orphans, "without a value": no_value, "dataAbsentReason": absent,
                             "without a time": int(timeless.sum()) - int(partial.sum()),
                             "dated to a month or year only": int(partial.sum()),
                             "entered in error or cancelled": withdrawn, **outside})


def _kinds(skipped: Counter[str]) -> str:
    """`` (Claim 3, Encounter 2)``: the resource types skipped (those spelled as resource types)."""
    kinds = sorted((k, n) for k, n in skipped.items() if k != FILES and n and _RESOURCE_TYPE.match(k))
    return f" ({', '.join(f'{k} {n}' for k, n in kinds[:12])}{', ...' if len(kinds) > 12 else ''})" if kinds else ""


def _times(values: pd.Series, where: pd.Series) -> pd.Series:
    """ISO 8601 times as UTC timestamps; a SchemaError naming the places (never the values) of
    those outside what a timestamp holds (years 1677-2262) or not ISO 8601."""
    t = pd.to_datetime(values, utc=True, format="ISO8601", errors="coerce")
    # pandas 3 parses at the resolution the text needs (years 0001-9999 fit): the years a nanosecond
    # timestamp holds are checked here, so that pandas 2 and 3 refuse the same times
    outside = t.notna() & ((t < pd.Timestamp.min.tz_localize("UTC")) | (t > pd.Timestamp.max.tz_localize("UTC")))
    bad = (t.isna() | outside) & values.notna()
    if bad.any():
        places = ", ".join(where[bad].astype(str).head(MAX_PROBLEMS_SHOWN))
        raise SchemaError(f"FHIR {int(bad.sum())} time(s) are not ISO 8601 times between the years 1677 and 2262 "
                          f"(at {places}). Fix those effectiveDateTime / issued values in the export.",
                          title="FHIR times cannot be read")
    return t.dt.as_unit("ns")
