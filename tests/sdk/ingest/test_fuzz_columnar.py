"""Fuzz: Parquet inputs whose column types are not what the format promises.

A MEDS shard or label file whose subject_id, time, code or numeric_value is of another Arrow type
(text, double, null, bool, dictionary, list, zoned time, date) or holds nulls, and a hospital
table (lifelines' rossi, written as Parquet) whose columns are swapped for such types: the only
exceptions are ClinographError subclasses. Found before: a text or double subject_id with a null
(IntCastingNaNError from pandas), a label file without boolean_value (KeyError). A successful
ingest accounts for every row. Derandomized, 20 examples each (~3 s; make test runs slow tests
too, so there is no longer variant): CLINOGRAPH_FUZZ_EXAMPLES=300 for a longer run.
"""

from __future__ import annotations

import datetime as dt
import os

import pyarrow as pa
import pyarrow.parquet as pq
from clinograph.sdk.ingest import ingest, read_table
from clinograph.sdk.ingest.meds import read_meds
from ehr_helpers import D as EHR_D
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tables_helpers import ColumnMap, D, wide

from clinograph.core.errors import ClinographError

T0 = dt.datetime(2024, 1, 2, 12)
EXAMPLES = int(os.environ.get("CLINOGRAPH_FUZZ_EXAMPLES", "20"))
KINDS = ["ok", "ok", "ok", "null", "text", "double", "int32", "bool", "dictionary", "list", "zoned", "date",
         "missing"]
GOOD = {"subject_id": ([1, 2, 3, None, 2**62], pa.int64()),
        "time": ([T0, None, dt.datetime(1, 1, 1), dt.datetime(9999, 1, 1), T0 - dt.timedelta(hours=5)],
                 pa.timestamp("us")),
        "prediction_time": ([T0, None, T0 - dt.timedelta(days=1)], pa.timestamp("us")),
        "code": (["LOINC/2345-7//mg/dL", "LOINC/8867-4", "LOINC/8310-5//[degF]", "", "MEDS_BIRTH", "//", None,
                  "LOINC/8867-4//bpm"], pa.string()),
        "numeric_value": ([1.0, None, float("nan"), float("inf"), -1e38, 80.0], pa.float32()),
        "boolean_value": ([True, False, None], pa.bool_())}


def _column(draw, name: str, n: int, *, mutate: bool = True):
    kind = draw(st.sampled_from(KINDS)) if mutate else "ok"
    if kind == "missing":
        return None
    if kind == "ok":
        values, typ = GOOD[name]
        return pa.array([draw(st.sampled_from(values)) for _ in range(n)], typ)
    if kind == "null":
        return pa.nulls(n)
    if kind == "text":
        return pa.array([draw(st.sampled_from(["1", "2", "", "x", None, "2024-01-01", "1e3"])) for _ in range(n)])
    if kind == "double":
        return pa.array([draw(st.sampled_from([1.0, 2.0, 2.5, None, float("nan")])) for _ in range(n)])
    if kind == "int32":
        return pa.array([draw(st.sampled_from([1, 2, None])) for _ in range(n)], pa.int32())
    if kind == "bool":
        return pa.array([draw(st.sampled_from([True, False, None])) for _ in range(n)])
    if kind == "dictionary":
        return pa.array(["1"] * n).dictionary_encode()
    if kind == "list":
        return pa.array([[1]] * n)
    if kind == "zoned":
        return pa.array([T0] * n, pa.timestamp("us", tz="UTC"))
    return pa.array([T0.date()] * n, pa.date32())


@st.composite
def meds_datasets(draw):
    shards = []
    for _ in range(draw(st.integers(1, 2))):
        n = draw(st.integers(0, 4))
        names = ("subject_id", "time", "code", "numeric_value")
        mutated = draw(st.sets(st.sampled_from(names), min_size=1, max_size=2))  # the rest fit: reach past align()
        cols = {k: c for k in names if (c := _column(draw, k, n, mutate=k in mutated)) is not None}
        if draw(st.booleans()):
            cols["text_value"] = pa.array([draw(st.sampled_from(["<5", "", None, "x", ">1e400"])) for _ in range(n)])
        shards.append(cols or {"x": pa.array([1] * n)})
    labels = None
    if draw(st.booleans()):
        n = draw(st.integers(0, 3))
        names = ("subject_id", "prediction_time", "boolean_value")
        mutated = draw(st.sets(st.sampled_from(names), max_size=1))
        labels = {k: c for k in names if (c := _column(draw, k, n, mutate=k in mutated)) is not None}
    return shards, labels


def _quick(n: int = EXAMPLES):
    return settings(max_examples=n, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _meds_property(tmp_path_factory, dataset):
    shards, labels = dataset
    root = tmp_path_factory.mktemp("meds")
    (root / "data").mkdir()
    for i, cols in enumerate(shards):
        pq.write_table(pa.table(cols), root / "data" / f"{i}.parquet")
    label_path = None
    if labels is not None:
        label_path = root / "labels.parquet"
        pq.write_table(pa.table(labels or {"x": pa.array([], pa.int64())}), label_path)
    try:
        read_meds(root, dictionary=EHR_D, site="s", labels=label_path, lookback_hours=48.0 if label_path else None,
                  units={"heart_rate": "/min"}).ingest(EHR_D)
    except ClinographError:
        pass


@st.composite
def rossi_tables(draw):
    from lifelines.datasets import load_rossi

    df = load_rossi().head(6)[["arrest", "age", "prio"]].rename(columns={"arrest": "y"})
    df.insert(0, "pid", [f"p{i}" for i in range(len(df))])
    cols = {c: pa.array(df[c].tolist()) for c in df.columns}
    for name in draw(st.lists(st.sampled_from(list(cols)), max_size=2, unique=True)):
        good = cols[name]
        cols[name] = _column(draw, "subject_id", len(df)) or good
    return cols


def _table_property(tmp_path_factory, cols):
    path = tmp_path_factory.mktemp("pq") / "rossi.parquet"
    pq.write_table(pa.table(cols), path)
    schema = wide(columns={"age": ColumnMap(feature="heart_rate", unit="/min"),
                           "prio": ColumnMap(feature="crp", unit="mg/L")})
    try:
        table = ingest(read_table(path), schema=schema, dictionary=D)
    except ClinographError:
        return
    r = table.report  # nothing left out silently: every row read is a patient or a counted drop
    assert r.rows_read == 6 and len(table.patient_ids) + r.dropped_patients_missing_label == 6


test_meds_columns_of_any_arrow_type_end_in_an_extract_or_a_clinograph_error = _quick()(given(meds_datasets())(
    _meds_property))
test_parquet_tables_with_columns_of_any_arrow_type_ingest_or_fail_clearly = _quick()(given(rossi_tables())(
    _table_property))
