"""Time-to-event labels on ingestion: a site schema's ``[survival]`` (time + event columns).

The follow-up time is read in the schema's ``time_unit`` and converted to days with the unit
machinery (pint, :func:`clinograph.sdk.ontology.units.conversion`), so one hospital may record
days, another months or years. The event column becomes the table's label (1 event, 0
censored) and :attr:`PatientTable.survival` carries (time in days, event). Censored patients
are kept: they contribute their survival terms to the loss (:mod:`clinograph.sdk.training.survival`).

Refused, with every problem listed (row numbers, never values): a missing time column or
event column, a missing or non-numeric time, a negative time, an event that is not 0/1 (or
a declared code), and a hospital at which every patient is censored (no event to learn a
hazard from -- usually an inverted event coding). ``[policy] missing_label = "drop"`` drops
and counts patients without a time or an event instead of refusing them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from clinograph.core.errors import SchemaError

from ..ontology.codes import describe_codes, normalise_code, shown_codes
from ..ontology.schema import SiteSchema, SurvivalColumns
from ..ontology.units import conversion
from .cells import TEXT_KINDS, as_text, classify_text, date_cells, present_mask, undecided_codes_fix
from .columns import header_unit
from .dialect import decimal_comma_cells, point_grouped_cells, point_grouped_problem
from .rows import rows_text
from .table import PatientTable, SurvivalTarget

#: canonical unit of follow-up time
TIME_UNIT = "d"


MAX_FOLLOW_UP_DAYS = 150 * 365.25  # longer than any human follow-up: a wrong time_unit or a broken value


def days_per(unit: str) -> float:
    """How many days one ``unit`` is (``d`` 1, ``wk`` 7, ``mo`` 30.44, ``a`` 365.25)."""
    scale, _ = conversion(feature="survival time", analyte=None, source=unit, target=TIME_UNIT)
    return float(scale)


def _events(raw: pd.Series, spec: SurvivalColumns, present: np.ndarray, problems: list[str]) -> np.ndarray:
    codes = {normalise_code(k): int(v) for k, v in (spec.event_codes or {}).items()}
    codes = codes or {normalise_code(k): v for k, v in (("0", 0), ("1", 1), ("false", 0), ("true", 1))}
    out = np.full(len(raw), np.nan)
    text = as_text(raw).str.strip()
    for i in np.flatnonzero(present):
        v = codes.get(normalise_code(text.iloc[i]))
        if v in (0, 1):
            out[i] = v
    bad = present & np.isnan(out)
    if bad.any():  # codes shown as describe_codes allows: a one-off cell may be patient text
        seen = describe_codes(text[bad].value_counts().to_dict())
        fix = None if spec.event_codes else undecided_codes_fix(
            "[survival] event_codes", "the event was observed", shown_codes(text[present].value_counts().to_dict()))
        problems.append(f"Event column {spec.event!r}: {rows_text(bad)}: not 0/1 (codes seen: {seen}). " + (
            fix or "Code the event as 1 (observed) or 0 (censored), or declare event_codes under [survival]."))
    return out


def _times(raw: pd.Series, spec: SurvivalColumns, present: np.ndarray, problems: list[str]) -> np.ndarray:
    if pd.api.types.is_timedelta64_dtype(raw.dtype):  # a duration (Parquet): exact, in time_unit as the rest
        t = (raw / pd.Timedelta(days=1)).to_numpy(dtype=float, na_value=np.nan) / days_per(spec.time_unit)
    else:
        if pd.api.types.is_datetime64_any_dtype(raw.dtype):  # not nanoseconds since 1970: named as dates below
            raw = as_text(raw)
        t = pd.to_numeric(raw.where(present), errors="coerce").to_numpy(dtype=float)
    bad = present & ~np.isfinite(t)
    dates = bad & date_cells(raw)
    if dates.any():  # a date is not a duration; which of 03/04 is the day is not guessed either
        problems.append(f"Time column {spec.time!r}: {rows_text(dates)}: dates, not follow-up times. Compute the "
                        "follow-up from the index date (diagnosis, admission) to the event or the last contact, and "
                        f"write it as a number of {spec.time_unit!r}.")
    comma = bad & ~dates & decimal_comma_cells(as_text(raw).str.strip())
    if comma.any():
        problems.append(f"Time column {spec.time!r}: {rows_text(comma)}: numbers written with a decimal comma. Declare "
                        "decimal = \",\" in the site schema for German/French Excel exports, or export them with "
                        "decimal points.")
    for kind, mask in classify_text(as_text(raw).str.strip(), bad & ~dates & ~comma):  # as a feature's cells
        fix = TEXT_KINDS[kind] if kind != "text" else f"not a number. Write the follow-up as a number of {spec.time_unit!r}."
        problems.append(f"Time column {spec.time!r}: {rows_text(mask)}: {fix}")
    neg = np.isfinite(t) & (t < 0)
    if neg.any():
        problems.append(f"Time column {spec.time!r}: {rows_text(neg)}: negative follow-up time. Follow-up runs from "
                        "the index date to the event or the last contact; check the dates it was computed from.")
    return t


def _named_time_unit(spec: SurvivalColumns) -> str | None:
    """The problem of a time column whose name gives a time unit other than days (``fu_months``)
    while ``time_unit`` is not written (so days, the default, would be read); None otherwise."""
    if "time_unit" in spec.model_fields_set or (unit := header_unit(spec.time)) is None:
        return None
    try:
        if days_per(unit) == 1.0:
            return None
    except SchemaError:  # not a time unit: the name's last word is not this column's unit
        return None
    return (f"Time column {spec.time!r}: its name gives the unit {unit!r}, but [survival] time_unit is not written, "
            f"so its values would be read in days (the default). Write the unit the times are in: [survival] "
            f"time_unit = {unit!r}, or \"d\" if the name is wrong.")


@dataclasses.dataclass(frozen=True)
class SurvivalInput:
    """A ``[survival]`` table checked and split for :func:`.validate.ingest`: ``frame`` holds
    the features with the event as the label (the time column ignored), ``schema`` the plain
    schema that reads it; :func:`with_survival` then attaches (time in days, event)."""

    frame: pd.DataFrame
    schema: SiteSchema
    #: one row per usable observation row: patient id, time in days, event
    days: pd.DataFrame
    time_column: str

    def __repr__(self) -> str:  # the frame holds patient data: never in a repr
        return f"SurvivalInput(rows={len(self.frame)}, usable={len(self.days)})"


def survival_input(df: pd.DataFrame, *, schema: SiteSchema) -> SurvivalInput:
    """Check the time and event columns of a table whose schema declares ``[survival]`` (every
    problem at once) and split it for ingestion: the event becomes the label.

    Raises:
        SchemaError: every problem of the time and event columns at once (module docstring).
    """
    spec = schema.survival
    if spec is None:
        raise SchemaError(f"Site schema of {schema.site!r} has no [survival] section, so there is no time or event "
                          "column to read. Declare [survival] time, event and time_unit in the site schema, or "
                          "ingest the table with ingest() for a binary label.",
                          title="Time-to-event label cannot be ingested")
    title = f"Time-to-event label of site {schema.site!r} cannot be ingested"
    missing = [f"{what} column {col!r} is not in the table (columns: {', '.join(map(str, df.columns[:12]))}). "
               f"Fix [survival] {what.lower()} in the site schema."
               for what, col in (("Time", spec.time), ("Event", spec.event)) if col not in df.columns]
    if missing:
        raise SchemaError(missing, title=title)
    try:
        scale = days_per(spec.time_unit)
    except SchemaError as exc:
        raise SchemaError([f"[survival] time_unit {spec.time_unit!r}: {p}" for p in exc.problems], title=title) from None
    problems: list[str] = []
    if (named := _named_time_unit(spec)) is not None:
        problems.append(named)
    has_t, has_e = present_mask(df[spec.time]), present_mask(df[spec.event])
    drop = schema.policy.missing_label == "drop"
    if not drop and (~has_t).any():
        problems.append(f"Time column {spec.time!r}: {rows_text(~has_t)}: no follow-up time. Fill it (the time of "
                        "the last contact for a censored patient) or set [policy] missing_label = \"drop\".")
    if not drop and (~has_e).any():
        problems.append(f"Event column {spec.event!r}: {rows_text(~has_e)}: no event status. Fill it (1 event, "
                        "0 censored) or set [policy] missing_label = \"drop\".")
    time = _times(df[spec.time], spec, has_t, problems)
    if (grouped := has_t & point_grouped_cells(df, spec.time)).any():  # '1.150' in a decimal-comma file
        problems.append(point_grouped_problem(f"Time column {spec.time!r}", grouped))
    with np.errstate(over="ignore", invalid="ignore"):
        too_long = has_t & np.isfinite(time) & ~(time * scale <= MAX_FOLLOW_UP_DAYS)  # inf after conversion too
    if too_long.any():
        problems.append(f"Time column {spec.time!r}: {rows_text(too_long)}: follow-up longer than 150 years once "
                        f"converted from {spec.time_unit!r} to days. Check [survival] time_unit (hours, days, months) "
                        "or the values.")
    event = _events(df[spec.event], spec, has_e, problems)
    if problems:
        raise SchemaError(problems, title=title)
    usable = has_t & has_e
    if usable.any() and not (event[usable] == 1).any():
        raise SchemaError([f"Event column {spec.event!r}: every one of the {int(usable.sum())} patients is censored "
                           "(no event). A hazard cannot be learned without events; check the coding (1 = event "
                           "observed, 0 = censored) or leave this hospital out of the time-to-event task."],
                          title=title)
    label = "__survival_event__"
    local = df.drop(columns=[spec.event]).assign(**{label: np.where(usable, event, np.nan)})
    plain = schema.model_copy(update={"survival": None, "label": label,
                                      "ignore": tuple(schema.ignore) + (spec.time,)})
    ids = as_text(df[schema.patient_id if schema.format == "wide" else schema.long.patient]).str.strip()
    days = pd.DataFrame({"id": ids.to_numpy(), "t": time * scale, "e": event})[usable]
    return SurvivalInput(frame=local, schema=plain, days=days, time_column=spec.time)


#: follow-up beyond which three quarters of a column's times look like Excel serial dates (days since
#: 1900: 25569 is 1970-01-01) rather than durations; reported, not refused (age as the time scale, in days)
SERIAL_DATE_DAYS = 25569.0


def _serial_dates(days: np.ndarray) -> str | None:
    v = days[np.isfinite(days)]
    if len(v) < 3 or np.percentile(v, 25) < SERIAL_DATE_DAYS:
        return None
    return ("three quarters of its follow-up times are over 70 years: they look like Excel serial dates (days since "
            "1900, 44927 is 2023-01-01), not durations. Compute the follow-up from the index date to the event or "
            "the last contact")


def with_survival(table: PatientTable, prepared: SurvivalInput) -> PatientTable:
    """``table`` (ingested from ``prepared.frame``) with :attr:`PatientTable.survival` attached.

    Raises:
        SchemaError: a patient with more than one follow-up time or event status across rows.
    """
    title = f"Time-to-event label of site {prepared.schema.site!r} cannot be ingested"
    per = prepared.days.groupby("id", sort=False).agg(t=("t", "first"), e=("e", "first"), nt=("t", "nunique"),
                                                      ne=("e", "nunique"))
    clash = per.index[(per["nt"] > 1) | (per["ne"] > 1)]
    if len(clash):
        raise SchemaError([f"{len(clash)} patient(s) have more than one follow-up time or event status across "
                           "their rows. A time-to-event label is one (time, event) a patient."], title=title)
    per = per.reindex(list(table.patient_ids))
    target = SurvivalTarget(time=per["t"].to_numpy(np.float64), event=per["e"].to_numpy().astype(np.int64))
    far = dict(table.report.far_from_reference)
    if (why := _serial_dates(target.time)) is not None:
        far[prepared.time_column] = why
    report = dataclasses.replace(table.report, ignored_columns=tuple(c for c in table.report.ignored_columns
                                                                      if c != prepared.time_column),
                                 far_from_reference=far)
    return dataclasses.replace(table, survival=target, report=report)
