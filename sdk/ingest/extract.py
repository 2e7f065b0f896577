"""What the EHR readers (OMOP, MEDS, FHIR) share: codes -> features, times -> snapshots, the long table.

Each reader turns its source into *events* -- one row per patient, hours since the patient's
index time, code (``SYSTEM/CODE``: ``OMOP/3004501``, ``LOINC/2345-7``, ``ALARM/HRBP``), value
and unit -- plus a label per patient. :func:`to_long` maps codes through the dictionary
(:meth:`FeatureDictionary.by_code`), bins hours into snapshots of ``snapshot_hours`` (the last
value of a feature in a snapshot is kept, the others counted) and returns an :class:`EhrExtract`:
the long table :func:`clinograph.sdk.ingest.ingest` takes, its site schema, and a report of
what was read, mapped and refused. Codes not in the dictionary are counted, never guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from clinograph.core.errors import SchemaError

from ..ontology.codes import describe_codes
from ..ontology.dictionary import FeatureDictionary
from ..ontology.schema import LongColumns, MissingLabelPolicy, SiteSchema
from .ehr_values import CensorPolicy, records_at, resolve_values
from .table import PatientTable

LONG_COLUMNS = LongColumns(patient="patient_id", time="time", feature="feature", value="value", unit="unit")
EVENT_COLUMNS = ("patient_id", "hours", "code", "value", "unit")
#: optional event columns: ``where`` (the source record: ``measurement_id 17``, ``x.ndjson line 4``) or, made
#: text only for the rows kept, ``where_prefix`` + ``where_row`` (``"measurement_id "``, 17: :func:`records_at`),
#: ``censor`` (``<``, ``<=``, ``>``, ``>=`` or None)
OPTIONAL_COLUMNS = ("where", "where_prefix", "where_row", "censor")


@dataclass(frozen=True)
class ExtractReport:
    """What a reader did. Counts and vocabulary codes only -- no values, no patient ids.

    ``unmapped_codes``: distinct codes of the source that no dictionary feature carries (shown
    as :func:`describe_codes` allows); ``collapsed``: repeated values of a feature within one
    snapshot, of which the last was kept.
    """

    source: str
    patients: int
    events_read: int
    events_mapped: int
    by_feature: dict[str, int] = field(default_factory=dict)
    unmapped_rows: int = 0
    unmapped_codes: str = ""
    collapsed: int = 0
    patients_without_label: int = 0
    patients_without_events: int = 0
    notes: tuple[str, ...] = ()
    #: rows the reader excluded before mapping, by reason (window, observation period, ...)
    excluded: dict[str, int] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """The report as text lines (for ``clinograph check``)."""
        out = [f"source: {self.source}", f"patients: {self.patients}",
               f"events read: {self.events_read}, mapped to the dictionary: {self.events_mapped}"]
        if self.unmapped_rows:
            out.append(f"not in the dictionary: {self.unmapped_rows} event(s) ({self.unmapped_codes})")
        if self.collapsed:
            out.append(f"repeated within a snapshot (last kept): {self.collapsed}")
        if self.patients_without_label:
            out.append(f"patients without a label (outcome unknown: dropped): {self.patients_without_label}")
        if self.patients_without_events:
            out.append(f"patients without any mapped event (absent from the table): {self.patients_without_events}")
        return out + list(self.notes)


@dataclass(frozen=True, repr=False)
class EhrExtract:
    """A long table for :func:`ingest`, its site schema, and the reader's report."""

    table: pd.DataFrame
    schema: SiteSchema
    report: ExtractReport

    def ingest(self, dictionary: FeatureDictionary) -> PatientTable:
        """Validate and ingest the extract (every problem at once, as :func:`ingest` does)."""
        from .validate import ingest

        if len(self.table) == 0:
            r = self.report
            counts = ", ".join([f"rows read: {r.events_read}", f"mapped to the dictionary: {r.events_mapped}",
                                *(f"{why}: {n}" for why, n in r.excluded.items())])
            raise SchemaError(f"The {r.source} extract of site {self.schema.site!r} holds no event to ingest "
                              f"({r.patients} patient(s) in the cohort; {counts}). {_empty_fix(r)}",
                              title="Nothing to ingest")
        try:
            return ingest(self.table, schema=self.schema, dictionary=dictionary)
        except SchemaError as exc:  # rows of the long table mean nothing to the user: name the source records
            if RECORD not in self.table:
                raise
            records = self.table[RECORD].to_numpy(dtype=object)  # ingest's rows are the long table's rows
            problems = [_ROWS.sub(lambda m: _records(m, records), p) for p in exc.problems]
            raise type(exc)(problems, title=f"{self.report.source} extract of site {self.schema.site!r} cannot be "
                                            "ingested") from None

    def __repr__(self) -> str:
        return (f"EhrExtract(source={self.report.source!r}, rows={len(self.table)}, "
                f"patients={self.report.patients})")


#: the long table's column naming each row's source record (ignored by ingest, used in its errors)
RECORD = "source_record"
_ROWS = re.compile(r"\brows? (\d+(?:, \d+)*)(?: \(and (\d+) more\))?")


#: what selects a source's cohort, by its report's source name's first word
_COHORT = {"OMOP": "[omop] cohort (its visit or condition concept ids, or its sql) against the CDM's "
                   "visit_occurrence / condition_occurrence",
           "FHIR": "[fhir] index if set (its encounter_classes against the export's Encounter class codes), and "
                   "that the export holds Patient resources",
           "MEDS": "[meds] labels (the label file's subject ids against the dataset's)"}
_WINDOW = "the window around the index time (the source file's lookback/after settings)"


def _empty_fix(r: ExtractReport) -> str:
    """The fix for an extract with no event, by where the events were lost: no patient in the
    cohort, the rows excluded (most for which reason), or none read or mapped."""
    cohort = _COHORT.get(r.source.split()[0], "the source file's cohort")
    if r.patients == 0:
        return f"The cohort selects no patient: check {cohort}."
    excluded = {why: n for why, n in r.excluded.items() if n}
    if excluded:
        why, n = max(excluded.items(), key=lambda kv: kv[1])
        what = cohort if "cohort" in why else _WINDOW if any(
            w in why for w in ("window", "lookback", "after", "before")) else "what the counts above name"
        return f"Most rows were excluded as '{why}' ({n}): check {what}."
    if r.events_read == 0:
        return f"No row of the cohort's {r.patients} patient(s) was read: check {cohort}, and the export."
    return ("No row maps to a dictionary feature: check the dictionary's codes (omop_concept_id, codes) against the "
            "export's, and the source file's systems (FHIR).")


def _records(m: re.Match, records: np.ndarray) -> str:
    """``rows 3, 9 (and 4 more)`` of the long table -> the source records of those rows."""
    shown = [str(records[int(i) - 1]) for i in m.group(1).split(", ") if 0 < int(i) <= len(records)]
    more = f" (and {m.group(2)} more)" if m.group(2) else ""
    return f"source record{'s' if len(shown) > 1 or more else ''} {', '.join(shown)}{more}"


def long_schema(site: str, *, labelled: bool) -> SiteSchema:
    """The site schema of an extract: features are already dictionary ids. A patient without a label
    (a FHIR Patient without a label Observation, a MEDS label row without boolean_value) is dropped
    and counted -- a source file has no [policy] to declare it, and its outcome is unknown, as a MEDS
    subject's outside the label file is."""
    if labelled:
        return SiteSchema(site=site, format="long", label="label", long=LONG_COLUMNS, ignore=(RECORD,),
                          policy=MissingLabelPolicy(missing_label="drop"))
    return SiteSchema(site=site, format="long", label=None, unlabeled=True, long=LONG_COLUMNS, ignore=(RECORD,))


def to_long(events: pd.DataFrame, *, labels: pd.Series | None, patients: list[str], dictionary: FeatureDictionary,
            site: str, source: str, snapshot_hours: float, notes: tuple[str, ...] = (),
            unmapped: dict[str, int] | None = None, units: dict[str, str] | None = None,
            censored: CensorPolicy | None = None, setting: str = "the source file",
            excluded: dict[str, int] | None = None, problems: list[str] | None = None) -> EhrExtract:
    """Map ``events`` (columns :data:`EVENT_COLUMNS`) onto the dictionary and build the extract. ``events`` is
    consumed: when every row maps, its columns are overwritten in place (the readers pass their own frame).

    ``labels``: patient id -> 1/0 (NaN: no label); None for an unlabeled extract.
    ``patients``: every patient of the cohort (those without events are counted).
    ``unmapped``: code -> rows a reader counted without reading them (not in the dictionary).
    ``units``, ``censored``: the source file's declarations (:func:`.ehr_values.resolve_values`);
    ``excluded``: rows excluded before mapping, by reason (printed if nothing is left);
    ``problems``: the reader's own unit problems, raised with the others. A code
    ``FEATURE/<id>`` names a dictionary feature directly (values a reader derives: age, sex).

    Raises:
        UnitError: values without a unit, in units that do not convert, or censored without a
            declared policy (every feature at once).
    """
    if not snapshot_hours > 0:
        raise ValueError("snapshot_hours must be > 0")
    counted = dict(unmapped or {})
    by_code = {k: f.id for k, f in dictionary.by_code().items()}
    cols = [*EVENT_COLUMNS, *(c for c in OPTIONAL_COLUMNS if c in events.columns)]
    ids = {f.id for f in dictionary.features}
    direct = {c: c.removeprefix("FEATURE/") for c in pd.unique(events["code"].dropna())
              if isinstance(c, str) and c.startswith("FEATURE/") and c.removeprefix("FEATURE/") in ids}
    feature = events["code"].map({**by_code, **direct}).to_numpy(dtype=object)
    refused = pd.isna(feature)
    counts = events.loc[refused, "code"].astype(str).value_counts().to_dict()
    for code, n in counted.items():
        counts[code] = counts.get(code, 0) + n
    n_events = len(events)
    if not refused.any() and events.index.equals(pd.RangeIndex(n_events)):
        ev = events  # every row mapped (MEDS keeps only those): the reader's frame, consumed, not copied
        ev["feature"] = feature
    else:  # one copy of the mapped rows
        ev = events.loc[~refused, cols].reset_index(drop=True)
        ev["feature"] = feature[~refused]
    del feature, events
    if "where" not in ev and "where_prefix" not in ev:
        ev["where"] = None
    ev, value_notes = resolve_values(ev, dictionary=dictionary, source=source, units=dict(units or {}),
                                     censored=censored, setting=setting, problems=problems)
    hours = pd.to_numeric(ev["hours"], errors="coerce").fillna(0.0).to_numpy(dtype=float)
    # the order and the last value a snapshot from the key columns only; the other columns taken once, at the end
    keys = pd.DataFrame({"patient_id": ev["patient_id"].to_numpy(), "time": np.floor(hours / snapshot_hours)
                         .astype(np.int64), "feature": ev["feature"].to_numpy(), "_h": hours})
    keys = keys.sort_values(["patient_id", "time", "feature", "_h"], kind="stable")
    last = ~keys.duplicated(["patient_id", "time", "feature"], keep="last").to_numpy()
    collapsed = int((~last).sum())
    pick = keys.index.to_numpy()[last]
    time = keys["time"].to_numpy()[last]
    del keys, hours
    out = pd.DataFrame({"patient_id": ev["patient_id"].take(pick).astype(str).to_numpy(), "time": time,
                        "feature": ev["feature"].to_numpy()[pick], "value": ev["value"].to_numpy()[pick],
                        "unit": ev["unit"].to_numpy()[pick], RECORD: records_at(ev, pick).to_numpy()})
    n_mapped = len(ev)
    del ev
    if labels is not None:
        out["label"] = out["patient_id"].map(labels).to_numpy()
    everyone = pd.Index(patients, dtype=object)
    has_events = everyone.isin(out["patient_id"].unique())
    report = ExtractReport(
        source=source, patients=len(patients), events_read=n_events + sum(counted.values()),
        events_mapped=n_mapped,
        by_feature={str(k): int(v) for k, v in out["feature"].value_counts().sort_index().items()},
        unmapped_rows=int(sum(counts.values())),
        unmapped_codes=describe_codes({str(k): int(v) for k, v in counts.items()}),
        collapsed=collapsed,
        patients_without_label=int((has_events & labels.reindex(everyone).isna().to_numpy()).sum())
        if labels is not None else 0,
        patients_without_events=int((~has_events).sum()),
        notes=(*notes, *value_notes), excluded=dict(excluded or {}))
    return EhrExtract(table=out.reset_index(drop=True), schema=long_schema(site, labelled=labels is not None),
                      report=report)
