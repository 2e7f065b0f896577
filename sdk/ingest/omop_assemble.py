"""The OMOP reader's second half: the rows it queried -> events, labels and an :class:`EhrExtract`.

Windows and observation periods are applied here, in pandas (the SQL stays the same on every
dialect); each exclusion is counted. Values: ``value_as_number``, else a text-only value
(``value_source_value`` / ``value_as_string``) that reads as a number with an optional
comparison (``<0.5``); ``operator_concept_id`` marks censored values. Units: the row's
``unit_concept_id`` through :data:`.omop_vocab.UNIT_CONCEPTS` (and the source file's
``unit_concepts``), else its ``unit_source_value``. Labels: an event from the index time to the
window's end; a date without a time on the index day counts (it reads as midnight); a death
before the index time is refused (the person would be labelled as surviving), other label events
before it are counted.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from clinograph.core.errors import SchemaError

from ..ontology.dictionary import FeatureDictionary, FeatureKind
from ..ontology.units import is_known_unit, same_unit
from .ehr_values import _clean, declared_features
from .extract import EhrExtract, to_long
from .omop_vocab import (
    FEMALE,
    MALE,
    OPERATOR_CONCEPTS,
    UNIT_CONCEPTS,
    censoring_in_text,
    parse_value_text,
)

AGE_UNIT = "a"  # UCUM: year (annum)


def check_declared(source, dictionary: FeatureDictionary) -> None:  # noqa: ANN001 - an OmopSource
    """``[omop.person]``, ``[omop.conditions]`` and ``units`` name dictionary features of the right kind.

    Raises:
        SchemaError: every bad declaration at once.
    """
    person = source.person
    declared_features(section="[omop]", person_section="[omop.person]", age=person.age if person else None,
                      sex=person.sex if person else None,
                      conditions=source.conditions.features if source.conditions else (), units=source.units,
                      dictionary=dictionary)


def _in_period(pid: pd.Series, t: pd.Series, periods: pd.DataFrame) -> np.ndarray:
    """True where the event's date lies in one of its person's observation periods (ends included)."""
    if len(pid) == 0:
        return np.zeros(0, dtype=bool)
    ev = pd.DataFrame({"i": np.arange(len(pid)), "person_id": pid.to_numpy(dtype=np.int64),
                       "d": pd.to_datetime(t).dt.normalize().to_numpy()})
    per = pd.DataFrame({"person_id": periods["person_id"].astype(np.int64).to_numpy(),
                        "start": pd.to_datetime(periods["start"]).to_numpy(),
                        "stop": pd.to_datetime(periods["stop"]).to_numpy()})
    m = ev.merge(per, on="person_id", how="inner")
    hit = m.loc[(m["start"] <= m["d"]) & (m["d"] <= m["stop"]), "i"].to_numpy()
    out = np.zeros(len(pid), dtype=bool)
    out[hit] = True
    return out


def _units(rows: pd.DataFrame, extra: dict[int, str], problems: list[str], notes: list[str]) -> pd.Series:
    """Each row's unit: its unit concept's UCUM code (``extra``, the CDM's concept table and the
    source file's ``unit_concepts``, before the built-in table), else its unit_source_value."""
    table = {**UNIT_CONCEPTS, **{int(k): v for k, v in extra.items()}}
    concept = pd.to_numeric(rows["unit_concept"], errors="coerce").fillna(0).astype(np.int64)
    text = _clean(rows["unit_text"])
    mapped = concept.map(table)
    unknown = (concept != 0) & mapped.isna()
    if (unknown & text.isna()).any():
        bad = sorted({int(c) for c in concept[unknown & text.isna()]})
        problems.append(f"OMOP measurement/observation: unit_concept_id(s) {bad[:10]} are not in Clinograph's table of "
                        f"standard unit concepts nor UCUM concepts of the CDM's concept table, and the rows have no unit_source_value ({int((unknown & text.isna()).sum())} "
                        "row(s)). Declare them in the source file: unit_concepts = { <id> = \"<UCUM code>\" } under [omop].")
    both = mapped.notna() & text.notna()
    pairs = {(a, b) for a, b in zip(mapped[both], text[both], strict=True) if a != b}
    clash = [(a, b) for a, b in pairs if not same_unit(a, b)]
    if clash:  # unit_source_value is shown only when it is a unit (else it may be any cell content)
        shown = sorted({f"{a} vs {b}" for a, b in clash if is_known_unit(b)})
        problems.append(f"OMOP measurement/observation: unit_concept_id and unit_source_value disagree on "
                        f"{len(clash)} unit pair(s) ({'; '.join(shown[:5]) or 'not shown: cell contents'}). Fix the "
                        "ETL's unit mapping (or unit_concepts in the source file).")
    fallback = int((unknown & text.notna()).sum())
    if fallback:
        notes.append(f"rows whose unit_concept_id is not in the unit table, read by their unit_source_value: "
                              f"{fallback}")
    return mapped.where(mapped.notna(), text)


def _unknown_operators(operator: pd.Series) -> list[str]:
    """A problem naming the operator_concept_ids that are no Meas Value Operator (0 and empty are
    none): read as exact, a censored value would silently be a measured one."""
    ids = pd.to_numeric(operator, errors="coerce").dropna().astype(np.int64)
    bad = ids[(ids != 0) & ~ids.isin(list(OPERATOR_CONCEPTS))]
    if not len(bad):
        return []
    return [f"OMOP measurement: operator_concept_id(s) {sorted(set(bad.tolist()))[:10]} ({len(bad)} row(s)) are not "
            f"Meas Value Operator concepts ({', '.join(f'{c} {o}' for c, o in OPERATOR_CONCEPTS.items())}); "
            "a value with an unknown operator is not read as exact. Map the operator to its standard concept in "
            "the ETL (0 for none)."]


def _check_source_values(person: pd.DataFrame, index: pd.Series, *, site: str) -> None:
    """SchemaError (counts, never values) unless every cohort person has its own person_source_value:
    a shared one merged two persons into one patient, a missing one became the text 'None'."""
    p = person.drop_duplicates("person_id")
    p = p[p["person_id"].astype(np.int64).isin(index.index)]
    value = p["person_source_value"]
    blank = value.isna().to_numpy() | (value.astype(str).str.strip() == "").to_numpy()
    absent = len(set(index.index) - set(p["person_id"].astype(np.int64)))
    shared = int(value[~blank].astype(str).str.strip().duplicated(keep=False).sum())
    problems = [f"{n} cohort person(s) {what}" for n, what in (
        (int(blank.sum()), "have no person_source_value"), (absent, "have no row in the person table"),
        (shared, "share their person_source_value with another person")) if n]
    if problems:
        raise SchemaError([f"OMOP site {site!r}, patient_id = \"person_source_value\": {p}. Each patient needs its "
                           "own id: fix the person table, or set patient_id = \"person_id\" under [omop]."
                           for p in problems], title="OMOP patient ids are not unique")


def _person_events(person: pd.DataFrame, index: pd.Series, source, dictionary) -> tuple[pd.DataFrame, int, int]:  # noqa: ANN001
    """Age (years at the index date) and sex events at the index time; persons of unknown sex or
    birth year counted."""
    spec = source.person
    p = person.drop_duplicates("person_id").set_index(person["person_id"].drop_duplicates().astype(np.int64))
    p = p.reindex(index.index)
    out, unknown_sex, unknown_age = [], 0, 0
    if spec.age:
        year = pd.to_numeric(p["year_of_birth"], errors="coerce")
        month = pd.to_numeric(p["month_of_birth"], errors="coerce").fillna(7)
        day = pd.to_numeric(p["day_of_birth"], errors="coerce").fillna(1)
        parts = pd.DataFrame({"year": year, "month": month, "day": day})
        born = pd.to_datetime(p["birth_datetime"], errors="coerce")
        born = born.where(born.notna(), pd.to_datetime(parts.where(year.notna()), errors="coerce"))
        age = ((pd.to_datetime(index) - born.to_numpy()) / pd.Timedelta(days=365.25)).to_numpy(dtype=float)
        out.append(pd.DataFrame({"person_id": index.index, "code": f"FEATURE/{spec.age}", "value": age,
                                 "unit": AGE_UNIT}))
        unknown_age = int(np.isnan(age).sum())
    if spec.sex:
        feat = dictionary.get(spec.sex.feature)
        g = pd.to_numeric(p["gender_concept_id"], errors="coerce").to_numpy()
        codes = {MALE: spec.sex.male, FEMALE: spec.sex.female}
        val = [codes.get(int(x)) if np.isfinite(x) else None for x in g]
        unknown_sex = sum(v is None for v in val)
        if feat.kind == FeatureKind.BINARY:
            val = [None if v is None else float(v) for v in val]
        out.append(pd.DataFrame({"person_id": index.index, "code": f"FEATURE/{spec.sex.feature}",
                                 "value": pd.Series(val, dtype=object), "unit": None}))
    out = [o for o in out if o["value"].notna().any()]  # an all-missing frame would only warn in concat
    ev = pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=["person_id", "code", "value", "unit"])
    ev = ev[ev["value"].notna().to_numpy()]
    return ev.assign(hours=0.0, where="the person table"), unknown_sex, unknown_age  # person_id identifies a patient


def _index_time(person_id: pd.Series, index: pd.Series) -> pd.Series:
    """Each row's index time (NaT outside the cohort), aligned with ``person_id``. Not ``map``:
    pandas 3 cannot map through an empty Series of times (an empty cohort raised TypeError)."""
    return pd.Series(index.reindex(person_id.astype(np.int64)).to_numpy(), index=person_id.index)


def _records(kept: pd.DataFrame) -> dict[str, np.ndarray]:
    """The rows' source records (``measurement_id 17``): an integer id kept as a number beside its table's
    prefix, made text only for the rows kept (:func:`.extract.records_at`); any other id as text."""
    if kept["record_id"].dtype.kind in "iu":
        prefix = {t: f"{t}_id " for t in pd.unique(kept["source_table"])}  # one string a table
        return {"where_prefix": kept["source_table"].map(prefix).to_numpy(dtype=object),
                "where_row": kept["record_id"].to_numpy(dtype=np.int64)}
    return {"where": (kept["source_table"].astype(str) + "_id " + kept["record_id"].astype(str)).to_numpy()}


def assemble(cohort, frames, conditions, label_frames, person, periods, unmapped, *, source,  # noqa: ANN001, PLR0913
             dictionary: FeatureDictionary, unit_vocabulary: dict[int, str] | None = None,
             absent_columns: tuple[str, ...] = ()) -> EhrExtract:
    """Events, labels and counts of the queried rows (see the module docstring)."""
    cohort = cohort.dropna(subset=["person_id"]).drop_duplicates("person_id")
    index = pd.Series(pd.to_datetime(cohort["index_datetime"]).to_numpy(), index=cohort["person_id"].astype(np.int64))
    if source.patient_id == "person_source_value":
        _check_source_values(person, index, site=source.site)
    names = (dict(zip(person["person_id"].astype(np.int64), person["person_source_value"].astype(str), strict=True))
             if source.patient_id == "person_source_value" else {})
    key = (lambda pid: names.get(int(pid), str(int(pid)))) if names else (lambda pid: str(int(pid)))
    patients = [key(p) for p in index.index]
    cols = ["source_table", "record_id", "person_id", "concept_id", "t", "value", "unit_text", "unit_concept",
            "operator", "value_concept", "value_text"]
    live = [f for f in frames if len(f)]
    for f in live:  # one dtype a column; column by column (astype of the frame copied every column, twice)
        for c in ("unit_concept", "operator", "value_concept"):
            f[c] = f[c].astype(float)
        for c in ("unit_text", "value_text"):
            f[c] = f[c].astype(object)
    rows = (pd.concat(live, ignore_index=True) if len(live) > 1 else live[0].reset_index(drop=True)) if live \
        else pd.DataFrame(columns=cols)
    del live
    frames.clear()  # consumed: the queried rows live on in `rows` only (not three copies of 10^6 rows)
    t = pd.to_datetime(rows["t"])
    hours = ((t - _index_time(rows["person_id"], index)) / pd.Timedelta(hours=1)).to_numpy(dtype=float)
    window = (hours >= -24.0 * source.lookback_days) & (hours <= 24.0 * source.after_days)
    period = _in_period(rows["person_id"], t, periods)
    value = pd.to_numeric(rows["value"], errors="coerce").to_numpy(dtype=float).copy()
    op = pd.to_numeric(rows["operator"], errors="coerce").map(OPERATOR_CONCEPTS).to_numpy(dtype=object, copy=True)
    marked, substituted = censoring_in_text(value, rows["value_text"], op)  # 0.5 beside "<0.5": censored
    text_only = np.isnan(value) & rows["value_text"].notna().to_numpy()
    from_text = 0
    for i in np.flatnonzero(text_only):
        number, text_op = parse_value_text(rows["value_text"].iat[i])
        if number is not None:
            value[i], from_text = number, from_text + 1
            op[i] = text_op if text_op is not None else op[i]
    no_number = np.isnan(value)
    keep = window & period & ~no_number
    problems: list[str] = _unknown_operators(rows["operator"][keep])
    unit_notes: list[str] = []
    kept = rows[keep]
    unit = _units(kept, {**(unit_vocabulary or {}), **source.unit_concepts}, problems, unit_notes)
    if unit_vocabulary:
        unit_notes.append(f"unit concepts read from the CDM's concept table (UCUM concept_code): {len(unit_vocabulary)}")
    name_of = pd.Series(patients, index=index.index)  # one key() call a person, not one a row
    concept = kept["concept_id"].astype(np.int64)
    code_of = {c: f"OMOP/{c}" for c in pd.unique(concept)}  # one string a concept, not one a row (10^6 rows)
    events = pd.DataFrame({"patient_id": kept["person_id"].astype(np.int64).map(name_of).to_numpy(),
                           "hours": hours[keep],
                           "code": concept.map(code_of).to_numpy(dtype=object),
                           "value": value[keep],
                           "unit": unit.to_numpy(), "censor": op[keep],
                           **_records(kept)})
    extra = []
    unknown_sex = unknown_age = 0
    if source.person is not None:
        pe, unknown_sex, unknown_age = _person_events(person, index, source, dictionary)
        extra.append(pe.assign(patient_id=[key(p) for p in pe["person_id"]]))
    n_cond_excluded = 0
    if conditions is not None:
        ct = pd.to_datetime(conditions["t"])
        ch = ((ct - _index_time(conditions["person_id"], index)) / pd.Timedelta(hours=1)).to_numpy(dtype=float)
        cw = (ch >= -24.0 * source.conditions.lookback_days) & (ch <= 24.0 * source.after_days)
        cp = _in_period(conditions["person_id"], ct, periods)
        n_cond_excluded = int((~(cw & cp)).sum())
        hit = conditions[cw & cp]
        present = set(zip(hit["person_id"].astype(np.int64), hit["concept_id"].astype(np.int64), strict=True))
        for fid in source.conditions.features:
            cid = dictionary.get(fid).omop_concept_id
            extra.append(pd.DataFrame({"patient_id": patients, "hours": 0.0, "code": f"OMOP/{cid}",
                                       "value": [float((int(p), cid) in present) for p in index.index],
                                       "unit": None, "where": "condition_occurrence"}))
    if extra:
        extra = [e.drop(columns=["person_id"], errors="ignore") for e in extra]
        if "where_prefix" in events.columns:  # their records are text already: the prefix alone (row -1)
            extra = [e.rename(columns={"where": "where_prefix"}).assign(where_row=np.int64(-1)) for e in extra]
        events = pd.concat([events, *extra], ignore_index=True)
    labels = None
    if source.label is not None:
        hits, before, dead_before = set(), set(), set()
        span = 24.0 * source.label.window_days
        for i, lf in enumerate(label_frames):
            if len(lf):
                t_label, t_index = pd.to_datetime(lf["t"]), _index_time(lf["person_id"], index)
                h = ((t_label - t_index) / pd.Timedelta(hours=1)).to_numpy(dtype=float)
                # a date without a time (midnight) on the index day is not before the index time
                same_day = ((t_label == t_label.dt.normalize()) & (t_label == t_index.dt.normalize())).to_numpy()
                h = np.where(same_day & (h < 0), 0.0, h)
                hits |= {int(p) for p, x in zip(lf["person_id"], h, strict=True) if 0 <= x <= span}
                early = {int(p) for p, x in zip(lf["person_id"], h, strict=True) if x < 0}
                (dead_before if source.label.death and i == len(label_frames) - 1 else before).update(early)
        labels = pd.Series({key(p): float(int(p) in hits) for p in index.index}, dtype=float)
        if dead_before:
            raise SchemaError(f"{len(dead_before)} person(s) of the cohort of site {source.site!r} died before their "
                              "index time (death table): each would be labelled as surviving. Correct the death "
                              "dates or the index times, or leave those persons out of the cohort.",
                              title="OMOP labels contradict the cohort")
        label_notes = [f"persons whose only label events lie before the index time (labelled 0): "
                       f"{len(before - hits)}"] if before - hits else []
    n_window, n_period = int((~window).sum()), int((window & ~period).sum())
    t_index = _index_time(rows["person_id"], index)
    day_only = int((keep & (t == t.dt.normalize()).to_numpy() & (t.dt.normalize() == t_index.dt.normalize()).to_numpy()
                    & (t_index != t_index.dt.normalize()).to_numpy()).sum())
    n_value = int((window & period & no_number).sum())
    excluded = {"outside the feature window": n_window, "outside the person's observation periods": n_period,
                "without a numeric value": n_value}
    notes = (f"rows outside the feature window ({source.lookback_days:g} day(s) before to {source.after_days:g} "
             f"after the index time): {n_window}",
             f"rows outside the person's observation periods (excluded): {n_period}",
             f"rows without a numeric value (value_as_concept_id only, or text that is no number; excluded): "
             f"{n_value}",
             *([f"values read from text (value_source_value / value_as_string): {from_text}"] if from_text else []),
             *([f"rows of the index day at 00:00 (a date without a time), read as before the index time though "
                f"they may have been taken after it (set after_days, or give the ETL's times): {day_only}"]
               if day_only else []),
             *([f"values censored by their text (value_as_number beside a value_source_value / value_as_string "
                f"such as '<0.5', no operator_concept_id): {marked}"] if marked else []),
             *([f"values whose text is censored but whose value_as_number differs from its bound (an ETL's "
                f"substitute; read as value_as_number): {substituted}"] if substituted else []),
             *([f"persons of unknown sex (gender_concept_id not 8507/8532): {unknown_sex}"] if unknown_sex else []),
             *([f"persons without a usable birth date (no year of birth, or an impossible month or day; age "
                f"missing): {unknown_age}"] if unknown_age else []),
             *([f"condition rows outside the window or periods: {n_cond_excluded}"] if conditions is not None else []),
             *unit_notes, *(label_notes if source.label is not None else []),
             *([f"columns the CDM lacks, times read from the date at 00:00 (CDM v5.2 and older, or a minimal ETL): "
                f"{', '.join(absent_columns)}"] if absent_columns else []))
    del rows, kept, t, t_index, hours, window, period, value, op, keep, unit  # not needed by to_long: freed first
    return to_long(events, labels=labels, patients=patients, dictionary=dictionary, site=source.site,
                   source="OMOP CDM v5.4", snapshot_hours=source.snapshot_hours, notes=notes, unmapped=unmapped,
                   units=source.units, censored=source.censored, setting="[omop] in the source file",
                   excluded=excluded, problems=problems)
