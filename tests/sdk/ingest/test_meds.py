"""MEDS datasets (meds package schema, Parquet): codes through the dictionary, units, labels, errors."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from clinograph.sdk.datasets.ehr import write_meds
from clinograph.sdk.ingest.meds import read_meds, split_code
from ehr_helpers import D, demo_hospitals

from clinograph.core.errors import ConfigError, SchemaError, UnitError


def _shard(root, rows, **extra):
    (root / "data").mkdir(parents=True, exist_ok=True)
    cols = {"subject_id": pa.array([r[0] for r in rows], pa.int64()),
            "time": pa.array([r[1] for r in rows], pa.timestamp("us")),
            "code": pa.array([r[2] for r in rows], pa.string()),
            "numeric_value": pa.array([r[3] for r in rows], pa.float32())}
    cols.update(extra)
    pq.write_table(pa.table(cols), root / "data" / "0.parquet")


def _labels(path, subjects, when):
    pq.write_table(pa.table({"subject_id": pa.array(subjects, pa.int64()),
                             "prediction_time": pa.array([when] * len(subjects), pa.timestamp("us")),
                             "boolean_value": pa.array([True, False][: len(subjects)])}), path)
    return path


T0 = dt.datetime(2024, 1, 2, 12)


def test_codes_units_snapshots_and_the_prediction_time(tmp_path):
    rows = [(1, T0, "LOINC/2345-7//mg/dL", 90.078), (1, T0 - dt.timedelta(hours=30), "LOINC/8867-4", 70.0),
            (1, T0 + dt.timedelta(hours=1), "LOINC/8867-4", 150.0),   # after the prediction time: not read
            (1, None, "ALARM/HISTORY", 1.0),                          # static: snapshot of the prediction time
            (2, T0, "ICD10/J98", None), (2, T0, "loinc/8867-4", 80.0)]
    _shard(tmp_path, rows)
    ex = read_meds(tmp_path, dictionary=D, site="s", labels=_labels(tmp_path / "l.parquet", [1, 2], T0),
                   lookback_hours=48.0, units={"heart_rate": "/min"})
    t = ex.ingest(D)
    assert t.n_snapshots == 2 and t.labels.tolist() == [1, 0]
    glucose = t.value[t.node == D.node_index()["glucose"]]
    assert glucose.tolist() == pytest.approx([5.0], rel=1e-6)       # mg/dL from the code, molar mass of glucose
    assert ex.report.unmapped_rows == 1 and "1 other code(s) not shown" in ex.report.unmapped_codes  # one row
    assert "after the prediction time: 1" in ex.report.notes[0]
    assert any("'heart_rate' without a unit, read in the declared '/min': 2" in n for n in ex.report.notes)


def test_split_code():
    assert split_code("loinc/2345-7//mg/dL") == ("LOINC/2345-7", "mg/dL")
    assert split_code("ALARM/HRBP") == ("ALARM/HRBP", None)


def test_a_unit_column_wins_and_unlabeled_datasets(tmp_path):
    _shard(tmp_path, [(1, T0, "LOINC/8310-5", 98.6)], unit=pa.array(["[degF]"]))
    t = read_meds(tmp_path, dictionary=D, site="s", labels=None, lookback_hours=None).ingest(D)
    assert t.value.tolist() == pytest.approx([37.0], rel=1e-4) and t.labels.tolist() == [-1]


def test_an_unlabeled_dataset_without_a_dictionary_code_is_a_schema_error(tmp_path):
    """Under pandas 3 the hours were mapped through an empty Series of times: TypeError (Cannot
    cast DatetimeArray to dtype float64) instead of the error naming what was read."""
    _shard(tmp_path, [(1, T0, "ICD10/J98", None), (2, None, "FOO/1", 1.0)])
    ex = read_meds(tmp_path, dictionary=D, site="s", labels=None, lookback_hours=None)
    with pytest.raises(SchemaError, match=r"holds no event to ingest .*rows read: 2, mapped to the dictionary: 0.*"
                                          r"No row maps to a dictionary feature: check the dictionary's codes"):
        ex.ingest(D)


def test_shards_that_do_not_fit_the_schema_are_all_named(tmp_path):
    (tmp_path / "data").mkdir()
    pq.write_table(pa.table({"subject_id": pa.array([1]), "code": pa.array(["x"])}), tmp_path / "data" / "a.parquet")
    (tmp_path / "data" / "b.parquet").write_bytes(b"not parquet")
    with pytest.raises(SchemaError) as err:
        read_meds(tmp_path, dictionary=D, site="s", labels=None, lookback_hours=None)
    text = str(err.value)
    assert "data/a.parquet does not fit the MEDS data schema" in text and "data/b.parquet is not a readable" in text
    with pytest.raises(ConfigError, match="has no Parquet shards under data/"):
        read_meds(tmp_path / "none", dictionary=D, site="s", labels=None, lookback_hours=None)


def test_one_prediction_time_a_subject(tmp_path):
    _shard(tmp_path, [(1, T0, "LOINC/8867-4", 70.0)])
    pq.write_table(pa.table({"subject_id": pa.array([1, 1], pa.int64()),
                             "prediction_time": pa.array([T0, T0], pa.timestamp("us")),
                             "boolean_value": pa.array([True, False])}), tmp_path / "l.parquet")
    with pytest.raises(SchemaError, match="1 subject\\(s\\) have several prediction times"):
        read_meds(tmp_path, dictionary=D, site="s", labels=tmp_path / "l.parquet", lookback_hours=24.0)


def test_the_demo_writer_fits_the_meds_schema(tmp_path):
    import meds

    table, schema = demo_hospitals()[1]
    write_meds(tmp_path, table, schema, D)
    shard = pq.read_table(tmp_path / "data" / "0.parquet")
    assert shard.schema.field("numeric_value").type == pa.float32()
    meds.DataSchema.validate(shard)


def test_a_value_without_a_unit_is_refused_per_feature_naming_shard_rows(tmp_path):
    _shard(tmp_path, [(1, T0, "LOINC/8867-4", 70.0), (1, T0, "LOINC/2345-7", 5.0),
                      (2, T0, "LOINC/8867-4", 71.0), (2, T0, "LOINC/2345-7//mmol/L", 5.5)])
    with pytest.raises(UnitError) as err:
        read_meds(tmp_path, dictionary=D, site="s", labels=None, lookback_hours=None)
    text = str(err.value)
    assert "feature 'heart_rate': 2 value(s) carry no unit (e.g. data/0.parquet row 1, data/0.parquet row 3)" in text
    assert "feature 'glucose': 1 value(s) carry no unit (e.g. data/0.parquet row 2)" in text
    assert "units = { glucose = \"mmol/L\" } under [meds] in the source file" in text
    assert "70" not in text and "5.5" not in text


def test_mixed_convertible_units_in_one_feature_are_converted_row_by_row(tmp_path):
    _shard(tmp_path, [(1, T0, "LOINC/2345-7//mg/dL", 90.078), (2, T0, "LOINC/2345-7//mmol/L", 6.0)])
    ex = read_meds(tmp_path, dictionary=D, site="s", labels=None, lookback_hours=None)
    t = ex.ingest(D)
    assert sorted(t.value.tolist()) == pytest.approx([5.0, 6.0], rel=1e-6)
    assert any("'glucose' converted row by row from mg/dL" in n for n in ex.report.notes)


def test_presence_only_codes_are_present_and_the_lookback_is_required(tmp_path):
    old = T0 - dt.timedelta(days=3 * 365)
    _shard(tmp_path, [(1, T0, "ALARM/HISTORY", None),
                      (1, old, "LOINC/8867-4//{beats}/min", 70.0), (1, T0, "LOINC/8867-4//{beats}/min", 80.0),
                      (2, T0, "LOINC/8867-4", None)])
    labels = _labels(tmp_path / "l.parquet", [1, 2], T0)
    with pytest.raises(ConfigError, match="needs lookback_hours"):
        read_meds(tmp_path, dictionary=D, site="s", labels=labels, lookback_hours=None)
    ex = read_meds(tmp_path, dictionary=D, site="s", labels=labels, lookback_hours=24.0)
    t = ex.ingest(D)
    idx = D.node_index()
    assert t.value[t.node == idx["history_lvf"]].tolist() == [1.0]
    assert t.n_snapshots == 1 and t.value[t.node == idx["heart_rate"]].tolist() == [80.0]
    assert any("before the lookback (24.0 h before the prediction time; excluded): 1" in n for n in ex.report.notes)
    assert any("numeric features without numeric_value (excluded): 1" in n for n in ex.report.notes)


def test_declared_units_must_name_numeric_features(tmp_path):
    _shard(tmp_path, [(1, T0, "LOINC/8867-4//{beats}/min", 70.0)])
    with pytest.raises(SchemaError) as err:
        read_meds(tmp_path, dictionary=D, site="s", labels=None, lookback_hours=None,
                  units={"heart_rat": "/min", "history_lvf": "1"})
    text = str(err.value)
    assert "[meds] units: 'heart_rat' is not a feature" in text and "'heart_rate'" in text
    assert "[meds] units: 'history_lvf' is binary; expected numeric" in text


def test_a_censored_text_value_needs_a_declared_policy(tmp_path):
    _shard(tmp_path, [(1, T0, "LOINC/2345-7//mmol/L", None), (1, T0, "LOINC/8867-4//{beats}/min", 70.0)],
           text_value=pa.array(["<2.0", None]))
    with pytest.raises(UnitError, match=r"feature 'glucose': 1 censored value\(s\).*data/0.parquet row 1"):
        read_meds(tmp_path, dictionary=D, site="s", labels=None, lookback_hours=None)
    ex = read_meds(tmp_path, dictionary=D, site="s", labels=None, lookback_hours=None, censored="half_bound")
    t = ex.ingest(D)
    assert t.value[t.node == D.node_index()["glucose"]].tolist() == [1.0]
    assert any("values read from text_value: 1" in n for n in ex.report.notes)


def test_text_subject_ids_that_integers_would_merge_are_refused_and_numeric_value_is_optional(tmp_path):
    def shard(root, **cols):
        (root / "data").mkdir(parents=True)
        pq.write_table(pa.table({"time": pa.array([T0, T0], pa.timestamp("us")),
                                 "code": pa.array(["LOINC/8867-4//{beats}/min"] * 2), **cols}), root / "data" / "0.parquet")
        return root
    twins = shard(tmp_path / "a", subject_id=pa.array(["007", "7"]), numeric_value=pa.array([80.0, 90.0], pa.float32()))
    with pytest.raises(SchemaError, match=r"subject_id is text, and some ids are not plain integers") as err:
        read_meds(twins, dictionary=D, site="s", labels=None, lookback_hours=None)
    assert "007" not in str(err.value).replace("('007', '7')", "")
    plain = read_meds(shard(tmp_path / "b", subject_id=pa.array(["1", "2"]), numeric_value=pa.array([80.0, 90.0])),
                      dictionary=D, site="s", labels=None, lookback_hours=None)
    assert not any("lookback" in n for n in plain.report.notes)  # unlabeled: there is none (was 'None h')
    assert plain.ingest(D).patient_ids == ("1", "2")
    with pytest.raises(SchemaError, match=r"numeric code without numeric_value: 2"):
        read_meds(shard(tmp_path / "c", subject_id=pa.array([1, 2], pa.int64())), dictionary=D, site="s",
                  labels=None, lookback_hours=None).ingest(D)


def test_meds_etl_codes_units_and_birth_rows(tmp_path):
    """MEDS ETLs write labs as ``LAB//50912//mg/dL`` (``//UNK``: no unit) and a MEDS_BIRTH row decades
    before the first lab: the code was split as system 'LAB' with unit '50912//mg/dL' (never
    mapped), and an unlabeled dataset counted time from birth (snapshot ~23 000)."""
    from clinograph.sdk.ontology.dictionary import FeatureDictionary

    creat = D.get("creatinine")
    d = FeatureDictionary(name=D.name, version=D.version, features=tuple(
        f.model_copy(update={"codes": {**f.codes, "lab": "50912"}}) if f is creat else f for f in D.features))
    rows = [(1, dt.datetime(1960, 5, 4), "MEDS_BIRTH", None), (1, None, "GENDER//M", None),
            (1, T0, "LAB//50912//mg/dL", 1.0), (1, T0 + dt.timedelta(days=2), "LAB//50912//UNK", 2.0),
            (1, T0 + dt.timedelta(days=9), "MEDS_DEATH", None)]
    _shard(tmp_path, rows)
    (tmp_path / "metadata").mkdir()
    (tmp_path / "metadata" / "dataset.json").write_text('{"dataset_name": "x", "meds_version": "0.3.3"}')
    assert split_code("LAB//50912//mg/dL", {"LAB/50912"}) == ("LAB/50912", "mg/dL")
    assert split_code("LAB//50912", {"LAB/50912"}) == ("LAB/50912", None)
    with pytest.raises(UnitError, match=r"'creatinine': 1 value\(s\) carry no unit \(e.g. data/0.parquet row 4\)"):
        read_meds(tmp_path, dictionary=d, site="s", labels=None, lookback_hours=None)
    ex = read_meds(tmp_path, dictionary=d, site="s", labels=None, lookback_hours=None, units={"creatinine": "umol/L"})
    assert ex.table["time"].tolist() == [0, 2]  # snapshots from the first lab, not from birth
    assert ex.ingest(d).value.tolist() == pytest.approx([88.4017, 2.0], rel=1e-5)


def test_shards_and_labels_mixing_zoned_and_naive_times_are_refused(tmp_path):
    """meds' align() converts a zoned time to UTC: events written in Europe/Berlin beside naive local
    prediction times were shifted by an hour, silently -- an event after the prediction time read
    as a feature."""
    berlin = pa.timestamp("us", tz="Europe/Berlin")
    after = dt.datetime(2024, 1, 2, 11, 30, tzinfo=dt.timezone.utc)  # 12:30 in Berlin: after 12:00 local
    _shard(tmp_path, [(1, None, "LOINC/8867-4//min-1", 80.0)], time=pa.array([after], berlin))
    labels = _labels(tmp_path / "l.parquet", [1], T0)
    with pytest.raises(SchemaError, match=r"MEDS times mix time-zone-aware and naive timestamps \(with a time zone: "
                                          r"data/0.parquet\)"):
        read_meds(tmp_path, dictionary=D, site="s", labels=labels, lookback_hours=24.0)
    assert read_meds(tmp_path, dictionary=D, site="s", labels=None, lookback_hours=None).report.events_mapped == 1


def test_a_numeric_value_beside_a_censored_text_value_is_censored_not_exact(tmp_path):
    """MEDS ETLs copy the source's text to text_value beside the parsed numeric_value: 2.0 beside
    '<2.0' was read as an exact 2.0, silently."""
    _shard(tmp_path, [(1, T0, "LOINC/2345-7//mmol/L", 2.0), (1, T0, "LOINC/8867-4//{beats}/min", 70.0)],
           text_value=pa.array(["<2.0", "70"]))
    with pytest.raises(UnitError, match=r"feature 'glucose': 1 censored value\(s\)"):
        read_meds(tmp_path, dictionary=D, site="s", labels=None, lookback_hours=None)
    ex = read_meds(tmp_path, dictionary=D, site="s", labels=None, lookback_hours=None, censored="half_bound")
    assert ex.ingest(D).value[ex.ingest(D).node == D.node_index()["glucose"]].tolist() == [1.0]
    assert any("censored by their text_value" in n and n.endswith(": 1") for n in ex.report.notes)


def test_codes_linked_to_dictionary_codes_by_the_metadata_parent_codes_are_named(tmp_path):
    """metadata/codes.parquet's parent_codes (LAB//50912//mg/dL -> LOINC/2160-0, as MEDS ETLs write
    them) were never read: the code was one more 'not in the dictionary'. Now named with the fix."""
    _shard(tmp_path, [(1, T0, "LAB//50912//mg/dL", 1.0), (1, T0, "LOINC/8867-4//{beats}/min", 70.0)])
    (tmp_path / "metadata").mkdir()
    pq.write_table(pa.table({"code": ["LAB//50912//mg/dL", "LAB//1//mg/dL"], "description": ["Creatinine", "x"],
                             "parent_codes": pa.array([["LOINC/2160-0"], None], pa.list_(pa.string()))}),
                   tmp_path / "metadata" / "codes.parquet")
    ex = read_meds(tmp_path, dictionary=D, site="s", labels=None, lookback_hours=None)
    hint = [n for n in ex.report.notes if "parent_codes" in n]
    assert len(hint) == 1 and ": 1 (LAB/50912 -> LOINC/2160-0 ('creatinine'))" in hint[0]
    assert 'lab = "50912"' in hint[0]


def test_empty_subject_ids_that_the_schema_cast_lets_through_are_named_by_shard_and_row(tmp_path):
    # a text or double subject_id with a null passes meds' align() (it checks nulls before casting)
    # and escaped as pandas' IntCastingNaNError from astype(int64)
    _shard(tmp_path, [(1, T0, "LOINC/8867-4", 70.0)] * 3, subject_id=pa.array(["1", None, "2"]))
    with pytest.raises(SchemaError, match=r"data/0.parquet: subject_id is empty in 1 row\(s\) \(rows: 2\)"):
        read_meds(tmp_path, dictionary=D, site="s", labels=None, lookback_hours=None)


def test_a_label_file_with_an_empty_subject_id_or_without_boolean_value_is_a_schema_error(tmp_path):
    _shard(tmp_path, [(1, T0, "LOINC/8867-4", 70.0)])
    pq.write_table(pa.table({"subject_id": pa.array([1.0, None]),
                             "prediction_time": pa.array([T0, None], pa.timestamp("us")),
                             "boolean_value": pa.array([True, False])}), tmp_path / "l.parquet")
    with pytest.raises(SchemaError) as err:  # IntCastingNaNError before
        read_meds(tmp_path, dictionary=D, site="s", labels=tmp_path / "l.parquet", lookback_hours=24.0)
    assert "l.parquet: subject_id is empty in 1 row(s) (rows: 2)" in str(err.value)
    assert "l.parquet: prediction_time is empty in 1 row(s) (rows: 2)" in str(err.value)  # NaT: no window
    pq.write_table(pa.table({"subject_id": pa.array([1], pa.int64()),
                             "prediction_time": pa.array([T0], pa.timestamp("us")),
                             "integer_value": pa.array([1], pa.int64())}), tmp_path / "l.parquet")
    with pytest.raises(SchemaError, match="has no boolean_value"):  # KeyError before
        read_meds(tmp_path, dictionary=D, site="s", labels=tmp_path / "l.parquet", lookback_hours=24.0)


def test_age_from_meds_birth_and_sex_from_its_codes_as_omop_reads_them(tmp_path):
    # before: [meds] had no age nor sex: a MEDS hospital lacked the features its OMOP and FHIR peers read
    from clinograph.sdk.ingest.sources import MedsSex
    from ehr_helpers import extended_dictionary

    d = extended_dictionary()
    born = dt.datetime(1950, 1, 2, 12)
    rows = [(1, born, "MEDS_BIRTH", None), (1, None, "GENDER//F", None), (1, T0, "LOINC/8867-4//{beats}/min", 80.0),
            (2, born, "MEDS_BIRTH", None), (2, born.replace(year=1951), "MEDS_BIRTH", None),  # two births: no age
            (2, None, "GENDER//M", None), (2, None, "GENDER//F", None),                       # both sexes: no sex
            (2, T0, "LOINC/8867-4//{beats}/min", 70.0)]
    _shard(tmp_path, rows)
    sex = MedsSex(feature="sex", male="male", female="female")
    ex = read_meds(tmp_path, dictionary=d, site="s", labels=_labels(tmp_path / "l.parquet", [1, 2], T0),
                   lookback_hours=24.0, age="age", sex=sex)
    t = ex.ingest(d)
    node = {i: n for n, i in d.node_index().items()}
    got = {(t.patient_ids[p], node[int(n)]): v for p, n, v in zip(t.patient, t.node, t.value, strict=True)}
    assert got[("1", "age")] == pytest.approx(74.0, abs=0.01) and got[("1", "sex=female")] == 1.0
    assert {k[1] for k in got if k[0] == "2"} == {"heart_rate"}
    assert "without one MEDS_BIRTH time (age missing): 1" in " ".join(ex.report.notes)
    assert "(sex missing): 1" in " ".join(ex.report.notes) and ex.report.unmapped_rows == 0  # sex codes read


def test_the_window_counts_features_only_and_codes_outside_the_dictionary_are_counted_as_such(tmp_path):
    # before: MEDS_BIRTH (decades before) and an outcome code after the prediction time were counted as events
    # "before the lookback" / "after the prediction time" -- 200 of a 200-patient dataset's, none a feature
    rows = [(1, dt.datetime(1950, 1, 1), "MEDS_BIRTH", None), (1, T0 + dt.timedelta(hours=5), "LOCAL/OUTCOME", None),
            (1, T0 - dt.timedelta(hours=100), "LOINC/8867-4//{beats}/min", 60.0),   # a feature, before the lookback
            (1, T0 + dt.timedelta(hours=1), "LOINC/8867-4//{beats}/min", 150.0),    # a feature, after
            (1, T0, "LOINC/8867-4//{beats}/min", 70.0)]
    _shard(tmp_path, rows)
    ex = read_meds(tmp_path, dictionary=D, site="s", labels=_labels(tmp_path / "l.parquet", [1], T0),
                   lookback_hours=24.0)
    assert ex.report.excluded["before the lookback"] == 1 and ex.report.excluded["after the prediction time"] == 1
    assert ex.report.unmapped_rows == 2  # MEDS_BIRTH and LOCAL/OUTCOME: codes outside the dictionary


def _cohort_source(root):
    """The cohort of cohort_exports read as test_cross_format reads it (age, sex, declared units, censoring)."""
    from clinograph.sdk.ingest.sources import EhrSourceConfig
    from cohort_exports import source_files

    return EhrSourceConfig.model_validate({"site": "h", "meds": source_files()["meds"]})


def test_events_the_reader_never_reads_are_counted_not_kept_and_change_nothing_else(tmp_path, monkeypatch):
    """Session 53: the shards are filtered in pyarrow (codes outside the dictionary, subjects outside the label
    file, dictionary events surely outside the window), batch by batch. The cohort with such events added (in its
    own shard after its rows, and in another shard; batches of 5 rows) gives the same table -- source records
    included -- and the same report, but for the added events' counts, known by construction. A filter that
    compared raw codes with the dictionary's (dropping LOINC/2345-7//mg/dL) lost the glucose rows."""
    import meds
    from clinograph.sdk.ingest import meds as meds_reader
    from clinograph.sdk.ingest.sources import read_source
    from clinograph.sdk.ontology.codes import describe_codes
    from cohort_exports import DICTIONARY, LOOKBACK_DAYS, example_cohort, write_meds

    monkeypatch.setattr(meds_reader, "BATCH_ROWS", 5)
    cohort = example_cohort()

    def read(root):
        ex = read_source(_cohort_source(root), root, dictionary=DICTIONARY, base=root)
        return ex.table, ex.report

    write_meds(tmp_path / "clean", cohort)
    clean, clean_report = read(tmp_path / "clean")
    outcomes = sum(p.outcome for p in cohort.patients)
    assert clean_report.unmapped_codes == describe_codes({"LOCAL/OUTCOME": outcomes})

    write_meds(tmp_path / "noisy", cohort)
    shard = tmp_path / "noisy" / "data" / "train" / "0.parquet"
    rows, codes = [], {}
    for p in cohort.patients:  # in the cohort: codes outside the dictionary (some with a //unit), timed or static
        for i, code in enumerate(("LAB//50912//mg/dL", "LAB//50912//UNK", "ICD10/I10", "MEDS_DEATH")):
            rows.append((p.pid, p.index - dt.timedelta(hours=i), code, 1.0 if i < 2 else None))
            rows.append((p.pid, None, code, None))
            base = meds_reader.split_code(code)[0]
            codes[base] = codes.get(base, 0) + 2
    lookback = 24.0 * LOOKBACK_DAYS
    after = [(p.pid, p.index + dt.timedelta(hours=3), "LOINC/2345-7//mg/dL", 99.0) for p in cohort.patients]
    before = [(p.pid, p.index - dt.timedelta(hours=lookback + 5), "LOINC/2345-7//mg/dL", 99.0) for p in cohort.patients]
    strangers = [(900 + k, T0, code, 5.0) for k in range(6)  # subjects outside the label file: nothing read
                 for code in ("LOINC/2345-7//mg/dL", "LOINC/8867-4", "LAB//1//mg/dL", meds.birth_code, "GENDER//F")]
    table = pq.read_table(shard)
    extra = pa.table({"subject_id": pa.array([r[0] for r in rows + after], pa.int64()),
                      "time": pa.array([r[1] for r in rows + after], pa.timestamp("us")),
                      "code": pa.array([r[2] for r in rows + after], pa.string()),
                      "numeric_value": pa.array([r[3] for r in rows + after], pa.float32()),
                      "text_value": pa.array([None] * len(rows + after), pa.large_string())})
    pq.write_table(pa.concat_tables([table, extra.cast(table.schema)]), shard)  # the cohort's rows keep their numbers
    more = before + strangers
    pq.write_table(pa.table({"subject_id": pa.array([r[0] for r in more], pa.int64()),
                             "time": pa.array([r[1] for r in more], pa.timestamp("us")),
                             "code": pa.array([r[2] for r in more], pa.string()),
                             "numeric_value": pa.array([r[3] for r in more], pa.float32())}),
                   tmp_path / "noisy" / "data" / "train" / "1.parquet")
    noisy, report = read(tmp_path / "noisy")

    pd.testing.assert_frame_equal(noisy, clean)
    n = len(rows)
    assert (report.events_read, report.unmapped_rows) == (clean_report.events_read + n, clean_report.unmapped_rows + n)
    assert report.unmapped_codes == describe_codes({"LOCAL/OUTCOME": outcomes, **codes})
    want = dict(clean_report.excluded)
    want["outside the cohort"] += len(strangers)
    want["after the prediction time"] += len(after)
    want["before the lookback"] += len(before)
    assert report.excluded == want
    assert report.notes[0] == f"events outside the cohort or after the prediction time: " \
                              f"{want['outside the cohort'] + want['after the prediction time']}"
    assert report.notes[1].endswith(f"excluded): {want['before the lookback']}")
    assert report.notes[2:] == clean_report.notes[2:]
    same = ("source", "patients", "events_mapped", "by_feature", "collapsed", "patients_without_label",
            "patients_without_events")
    assert {k: getattr(report, k) for k in same} == {k: getattr(clean_report, k) for k in same}


def test_problems_in_a_later_batch_of_a_shard_name_the_shard_rows(tmp_path, monkeypatch):
    """Shards are read in batches: empty (text) subject ids in the third and fourth batches are named by their
    rows in the shard, and a bad label file is reported after the shards' problems, as when shards were read
    whole."""
    from clinograph.sdk.ingest import meds as meds_reader

    monkeypatch.setattr(meds_reader, "BATCH_ROWS", 4)
    _shard(tmp_path, [(1, T0, "LOINC/8867-4//{beats}/min", 70.0)] * 15, subject_id=pa.array(["1"] * 8 + [None] * 7))
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(SchemaError, match=r"data/0.parquet: subject_id is empty in 7 row\(s\) \(rows: 9, 10, 11, 12, 13, "
                                          r"\.\.\.\)"):
        read_meds(tmp_path, dictionary=D, site="s", labels=tmp_path / "bad.parquet", lookback_hours=24.0)


def test_the_lookback_edge_is_decided_as_before_the_shards_were_filtered(tmp_path):
    """Events more than lookback_hours + 1 s before the prediction time are dropped in pyarrow; nearer ones are
    left to pandas: an event exactly lookback_hours before is read, one 0.5 s or 2 s further back is not."""
    hr = "LOINC/8867-4//{beats}/min"
    edge = T0 - dt.timedelta(hours=24)
    _shard(tmp_path, [(1, edge, hr, 60.0), (1, edge - dt.timedelta(milliseconds=500), hr, 61.0),
                      (1, edge - dt.timedelta(seconds=2), hr, 62.0), (1, T0 + dt.timedelta(microseconds=1), hr, 63.0)])
    ex = read_meds(tmp_path, dictionary=D, site="s", labels=_labels(tmp_path / "l.parquet", [1], T0),
                   lookback_hours=24.0)
    assert ex.report.excluded["before the lookback"] == 2 and ex.report.excluded["after the prediction time"] == 1
    assert ex.table["value"].tolist() == [60.0] and ex.table["source_record"].tolist() == ["data/0.parquet row 1"]
