"""A synthetic OMOP CDM v5.4 instance of each demo hospital (the ALARM tables of :mod:`.alarm`).

Each hospital's wide table becomes its own OMOP database: a ``person`` per patient (the local
patient id in ``person_source_value``), an ICU ``visit_occurrence`` whose start is the index
time, one ``measurement`` per numeric value at the index time (in the hospital's own unit,
written in UCUM in ``unit_source_value``), ``observation`` rows for binary features, and the
outcome as a ``condition_occurrence`` one day after the index time. Distractors a real CDM has
are added on purpose: measurements of concepts outside the dictionary, measurements before the
feature window, and outcome conditions long after the label window -- a reader must skip them.

Works on any SQLAlchemy engine (DuckDB for files and tests, PostgreSQL for a real server).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..ingest.omop import OmopCohort, OmopLabel, OmopSource
from ..ingest.omop_vocab import UNIT_CONCEPTS
from ..ontology.dictionary import FeatureDictionary, FeatureKind
from ..ontology.schema import SiteSchema

ICU_VISIT = 32037                 # OMOP visit concept "Intensive Care"
SHUNT_CONDITION = 2_000_000_100   # site-local concept for the demo's outcome (intrapulmonary shunt)
DISTRACTOR_MEASUREMENT = 3_012_888  # diastolic blood pressure: not in the demo dictionary
EHR_TYPE = 32817                  # type concept "EHR"
INDEX_ORIGIN = pd.Timestamp("2024-01-01 00:00:00")
#: The demo's local unit spellings as UCUM writes them (what an OMOP ETL puts in unit_source_value).
UCUM = {"degF": "[degF]", "degC": "Cel", "mmHg": "mm[Hg]", "cmH2O": "cm[H2O]", "dyn.s/cm5": "dyn.s.cm-5",
        "1": "1"}


#: UCUM code -> its standard unit concept (what an ETL puts in unit_concept_id; 0 if not listed)
UNIT_CONCEPT_OF = {u: c for c, u in UNIT_CONCEPTS.items()}


def ucum(unit: str | None) -> str | None:
    """A demo unit in UCUM (``degF`` -> ``[degF]``); UCUM-compatible spellings unchanged."""
    return None if unit is None else UCUM.get(unit, unit)


def hospital_events(table: pd.DataFrame, schema: SiteSchema, dictionary: FeatureDictionary) -> pd.DataFrame:
    """One row per present value: patient (row index), local patient id, feature, value, UCUM unit, kind."""
    rows = []
    for col, cm in schema.columns.items():
        if col not in table.columns:
            continue
        feat = dictionary.get(cm.feature)
        values = pd.to_numeric(table[col], errors="coerce").to_numpy(dtype=float)
        ok = ~np.isnan(values)
        rows.append(pd.DataFrame({
            "row": np.flatnonzero(ok), "patient_id": table[schema.patient_id].to_numpy()[ok], "feature": feat.id,
            "value": values[ok], "unit": ucum(cm.unit) if feat.kind == FeatureKind.NUMERIC else None,
            "kind": feat.kind.value}))
    return pd.concat(rows, ignore_index=True)


def index_times(n: int) -> pd.DatetimeIndex:
    """Patient ``i``'s index time: the origin plus ``i`` hours (distinct, deterministic)."""
    return INDEX_ORIGIN + pd.to_timedelta(np.arange(n), unit="h")


def _metadata():
    import sqlalchemy as sa

    md = sa.MetaData()
    big, i, d, ts, s, f = sa.BigInteger, sa.Integer, sa.Date, sa.DateTime, sa.String(50), sa.Double
    sa.Table("person", md, sa.Column("person_id", big, primary_key=True, autoincrement=False), sa.Column("gender_concept_id", i),
             sa.Column("year_of_birth", i), sa.Column("month_of_birth", i), sa.Column("day_of_birth", i),
             sa.Column("birth_datetime", ts), sa.Column("race_concept_id", i), sa.Column("ethnicity_concept_id", i),
             sa.Column("person_source_value", s))
    sa.Table("observation_period", md, sa.Column("observation_period_id", big, primary_key=True, autoincrement=False),
             sa.Column("person_id", big), sa.Column("observation_period_start_date", d),
             sa.Column("observation_period_end_date", d), sa.Column("period_type_concept_id", i))
    sa.Table("death", md, sa.Column("person_id", big, primary_key=True, autoincrement=False), sa.Column("death_date", d),
             sa.Column("death_datetime", ts), sa.Column("death_type_concept_id", i))
    sa.Table("visit_occurrence", md, sa.Column("visit_occurrence_id", big, primary_key=True, autoincrement=False),
             sa.Column("person_id", big), sa.Column("visit_concept_id", i), sa.Column("visit_start_date", d),
             sa.Column("visit_start_datetime", ts), sa.Column("visit_end_date", d),
             sa.Column("visit_type_concept_id", i))
    sa.Table("condition_occurrence", md, sa.Column("condition_occurrence_id", big, primary_key=True, autoincrement=False),
             sa.Column("person_id", big), sa.Column("condition_concept_id", i), sa.Column("condition_start_date", d),
             sa.Column("condition_start_datetime", ts), sa.Column("condition_type_concept_id", i))
    for name in ("measurement", "observation"):
        sa.Table(name, md, sa.Column(f"{name}_id", big, primary_key=True, autoincrement=False), sa.Column("person_id", big),
                 sa.Column(f"{name}_concept_id", i), sa.Column(f"{name}_date", d), sa.Column(f"{name}_datetime", ts),
                 sa.Column(f"{name}_type_concept_id", i), sa.Column("value_as_number", f),
                 sa.Column("unit_source_value", s), sa.Column(f"{name}_source_value", s),
                 sa.Column("unit_concept_id", i), sa.Column("value_as_concept_id", i),
                 *((sa.Column("operator_concept_id", i), sa.Column("value_source_value", s)) if name == "measurement"
                   else (sa.Column("value_as_string", s),)))
    return md


def omop_tables(table: pd.DataFrame, schema: SiteSchema, dictionary: FeatureDictionary) -> dict[str, pd.DataFrame]:
    """The CDM tables of one demo hospital, as DataFrames (``death`` empty: the demo's outcome is a
    condition). Each person is observed from a year before to a year after the index time."""
    n = len(table)
    t0 = index_times(n)
    pid = np.arange(1, n + 1, dtype=np.int64)
    person = pd.DataFrame({"person_id": pid, "gender_concept_id": 0, "year_of_birth": 1960, "month_of_birth": None,
                           "day_of_birth": None, "birth_datetime": pd.NaT, "race_concept_id": 0,
                           "ethnicity_concept_id": 0, "person_source_value": table[schema.patient_id].astype(str)})
    period = pd.DataFrame({"observation_period_id": pid, "person_id": pid,
                           "observation_period_start_date": (t0 - pd.Timedelta(days=365)).date,
                           "observation_period_end_date": (t0 + pd.Timedelta(days=365)).date,
                           "period_type_concept_id": EHR_TYPE})
    visit = pd.DataFrame({"visit_occurrence_id": pid, "person_id": pid, "visit_concept_id": ICU_VISIT,
                          "visit_start_date": t0.date, "visit_start_datetime": t0, "visit_end_date": t0.date,
                          "visit_type_concept_id": EHR_TYPE})
    ev = hospital_events(table, schema, dictionary)
    concept = ev["feature"].map({f.id: f.omop_concept_id for f in dictionary.features})
    when = t0[ev["row"].to_numpy()]
    rows = pd.DataFrame({"person_id": pid[ev["row"].to_numpy()], "concept_id": concept.to_numpy(), "t": when,
                         "value_as_number": ev["value"].to_numpy(), "unit_source_value": ev["unit"].to_numpy(),
                         "source_value": ev["feature"].to_numpy(), "kind": ev["kind"].to_numpy()})
    every7, every13 = pid[::7], pid[::13]
    distract = pd.DataFrame({"person_id": np.concatenate([every7, every13]),
                             "concept_id": [DISTRACTOR_MEASUREMENT] * len(every7)
                             + [dictionary.get("heart_rate").omop_concept_id] * len(every13),
                             "t": np.concatenate([t0[every7 - 1], t0[every13 - 1] - pd.Timedelta(days=3)]),
                             "value_as_number": 70.0, "unit_source_value": "mm[Hg]",
                             "source_value": "distractor", "kind": "numeric"})
    distract.loc[len(every7):, "unit_source_value"] = "/min"
    out = {"person": person, "observation_period": period, "visit_occurrence": visit,
           "death": pd.DataFrame({"person_id": pd.Series([], dtype=np.int64), "death_date": pd.Series([], dtype=object),
                                  "death_datetime": pd.Series([], dtype="datetime64[ns]"),
                                  "death_type_concept_id": pd.Series([], dtype=np.int64)})}
    for name, sel in (("measurement", rows["kind"] != "binary"), ("observation", rows["kind"] == "binary")):
        part = rows[sel.to_numpy()]
        if name == "measurement":
            part = pd.concat([part, distract], ignore_index=True)
        out[name] = pd.DataFrame({
            f"{name}_id": np.arange(1, len(part) + 1, dtype=np.int64), "person_id": part["person_id"].to_numpy(),
            f"{name}_concept_id": part["concept_id"].astype(np.int64).to_numpy(),
            f"{name}_date": pd.DatetimeIndex(part["t"]).date, f"{name}_datetime": pd.DatetimeIndex(part["t"]),
            f"{name}_type_concept_id": EHR_TYPE, "value_as_number": part["value_as_number"].to_numpy(dtype=float),
            "unit_source_value": part["unit_source_value"].to_numpy(), f"{name}_source_value": part["source_value"],
            "unit_concept_id": part["unit_source_value"].map(UNIT_CONCEPT_OF).fillna(0).astype(np.int64).to_numpy(),
            "value_as_concept_id": None,
            **({"operator_concept_id": None, "value_source_value": None} if name == "measurement"
               else {"value_as_string": None})})
    label = table[schema.label].to_numpy(dtype=int) if schema.label else np.zeros(n, int)
    sick, late = pid[label == 1], pid[(label == 0) & (pid % 11 == 0)]
    when = np.concatenate([t0[sick - 1] + pd.Timedelta(days=1), t0[late - 1] + pd.Timedelta(days=40)])
    out["condition_occurrence"] = pd.DataFrame({
        "condition_occurrence_id": np.arange(1, len(when) + 1, dtype=np.int64),
        "person_id": np.concatenate([sick, late]), "condition_concept_id": SHUNT_CONDITION,
        "condition_start_date": pd.DatetimeIndex(when).date, "condition_start_datetime": pd.DatetimeIndex(when),
        "condition_type_concept_id": EHR_TYPE})
    return out


def write_omop(engine, table: pd.DataFrame, schema: SiteSchema, dictionary: FeatureDictionary, *,
               cdm_schema: str | None = None) -> None:
    """Create the CDM tables (dropping the demo's own) and load one hospital into them."""
    import sqlalchemy as sa

    md = _metadata()
    md.schema = cdm_schema
    tables = omop_tables(table, schema, dictionary)
    with engine.begin() as conn:
        if cdm_schema:
            conn.execute(sa.text(f"CREATE SCHEMA IF NOT EXISTS {cdm_schema}"))
        for t in md.sorted_tables:
            t.schema = cdm_schema
        md.drop_all(conn)
        md.create_all(conn)
        for t in md.sorted_tables:
            df = tables[t.name]
            records = df.astype(object).where(df.notna(), None).to_dict("records")
            for start in range(0, len(records), 5000):
                conn.execute(t.insert(), records[start:start + 5000])


def demo_source(site: str, *, cdm_schema: str | None = None, cohort_sql: bool = False) -> OmopSource:
    """How the demo's OMOP instances are read: ICU visits, shunt within 2 days, features at the index time."""
    cohort = OmopCohort(sql=("SELECT person_id, visit_start_datetime AS index_datetime FROM "  # noqa: S608 (constants)
                             f"{cdm_schema + '.' if cdm_schema else ''}visit_occurrence WHERE visit_concept_id = "
                             f"{ICU_VISIT}")) if cohort_sql else OmopCohort(visit_concept_ids=(ICU_VISIT,))
    label = OmopLabel(condition_concept_ids=(SHUNT_CONDITION,), window_days=2.0)
    return OmopSource(site=site, cohort=cohort, label=label, cdm_schema=cdm_schema, patient_id="person_source_value", lookback_days=1.0, after_days=0.0)
