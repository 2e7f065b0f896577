"""sdk/model/predictions.py, fhir_risk.py, omop_results.py: the EHR writers on hand-made predictions
(no model): FHIR resources valid under fhir.resources, OMOP rows in the documented schema, and
refusals that count ids and never show one."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from clinograph.sdk.model.fhir_risk import REFERENCE, risk_assessments, write_risk_assessments
from clinograph.sdk.model.omop_results import RESULT_COLUMNS, check_table_name, result_rows
from clinograph.sdk.model.predictions import Predictions

from clinograph.core.errors import ConfigError

RiskAssessment = pytest.importorskip("fhir.resources.R4B.riskassessment").RiskAssessment
DIGEST = "ab" * 32
WHEN = datetime(2026, 11, 27, 16, 30, 5, tzinfo=timezone(timedelta(hours=1)))


def _preds(ids=("p1", "p2"), risks=((0.1,), (0.9,)), **kw):
    return Predictions(patient_ids=tuple(ids), risks=np.asarray(risks, dtype=float), model_sha256=DIGEST,
                       model_format="clinograph-nsfl-star/2", site="north", created=WHEN, **kw)


def test_reference_subjects_and_valid_r4_resources(tmp_path):
    n = write_risk_assessments(tmp_path / "r.ndjson", _preds(), subject=REFERENCE)
    lines = (tmp_path / "r.ndjson").read_text().splitlines()
    assert n == 2 and len(lines) == 2
    parsed = [RiskAssessment.parse_raw(x) for x in lines]
    assert [p.subject.reference for p in parsed] == ["Patient/p1", "Patient/p2"]
    assert [float(p.prediction[0].probabilityDecimal) for p in parsed] == [0.1, 0.9]
    doc = json.loads(lines[0])
    assert doc["occurrenceDateTime"] == "2026-11-27T16:30:05+01:00" and doc["status"] == "final"
    assert doc["prediction"][0]["outcome"]["text"] == f"outcome predicted by Clinograph model sha256:{DIGEST[:12]}"
    assert doc["method"]["coding"][0]["code"] == DIGEST and DIGEST in doc["basis"][0]["display"]


def test_ids_that_are_not_fhir_ids_are_counted_never_shown():
    secret = "MRN 12345/x"
    with pytest.raises(ConfigError, match=r"1 of 2 patient id\(s\) are not FHIR ids") as err:
        risk_assessments(_preds(ids=("p1", secret)), subject=REFERENCE)
    assert secret not in str(err.value)
    by_identifier = risk_assessments(_preds(ids=("p1", secret)), subject="urn:oid:1.2.3")
    assert by_identifier[1]["subject"] == {"identifier": {"system": "urn:oid:1.2.3", "value": secret}}
    RiskAssessment.parse_obj(by_identifier[1])


def test_survival_rows_and_resources_have_a_horizon_each():
    p = _preds(risks=((0.1, 0.2), (0.3, 0.5)), horizons=(6.0, 12.0), time_unit="mo")
    rows = result_rows(p, id_column="person_source_value")
    assert [(r["person_source_value"], r["horizon"], r["score"]) for r in rows] == [
        ("p1", 6.0, 0.1), ("p1", 12.0, 0.2), ("p2", 6.0, 0.3), ("p2", 12.0, 0.5)]
    assert all(set(r) == set(RESULT_COLUMNS) and r["horizon_unit"] == "mo" for r in rows)
    assert rows[0]["created_datetime"] == datetime(2026, 11, 27, 15, 30, 5)  # UTC, naive (OMOP TIMESTAMP)
    ra = RiskAssessment.parse_obj(risk_assessments(p, subject=REFERENCE)[1])
    assert [(float(x.whenRange.high.value), float(x.probabilityDecimal)) for x in ra.prediction] == [(6, .3), (12, .5)]


def test_person_id_rows_need_integer_ids_and_table_names_are_identifiers():
    assert [r["person_id"] for r in result_rows(_preds(ids=("17", "42")), id_column="person_id")] == [17, 42]
    with pytest.raises(ConfigError, match=r"1 of 2 patient id\(s\) are not OMOP person_id integers"):
        result_rows(_preds(ids=("17", "p2")), id_column="person_id")
    assert check_table_name("results.clinograph_risk") == ("results", "clinograph_risk")
    with pytest.raises(ConfigError, match="is not a table name"):
        check_table_name("risk; DROP TABLE person")


def test_predictions_are_checked_and_their_repr_shows_no_id():
    assert "p1" not in repr(_preds()) and "patients=2" in repr(_preds())
    with pytest.raises(ConfigError, match="risk column"):
        _preds(risks=((0.1, 0.2), (0.3, 0.4)))
    with pytest.raises(ConfigError, match="timezone-aware"):
        Predictions(patient_ids=("a",), risks=np.zeros((1, 1)), model_sha256=DIGEST, model_format="f", site="s",
                    created=datetime(2026, 1, 1))


def test_the_documented_formats_are_what_the_writers_write(tmp_path):
    """docs/ehr_formats.md: its RiskAssessment example is valid R4 and is what risk_assessments writes
    for its inputs; its results-table columns and CSV example are the writer's."""
    import csv
    import io
    import re
    from pathlib import Path

    from clinograph.sdk.model.omop_results import write_results_csv

    text = (Path(__file__).resolve().parents[3] / "docs" / "ehr_formats.md").read_text()
    section = text[text.index("## Predictions back into the EHR"):text.index("## Speed")]
    example = json.loads(re.search(r"```json\n(.*?)```", section, re.S).group(1))
    RiskAssessment.parse_obj(example)
    p = Predictions(patient_ids=("north-00017",), risks=np.array([[0.18, 0.31]]), model_sha256="3f2a" * 16,
                    model_format="clinograph-nsfl-survival/2", site="north",
                    created=datetime(2026, 11, 27, 9, 30, tzinfo=timezone.utc), horizons=(6.0, 12.0), time_unit="mo")
    assert risk_assessments(p, subject="https://hospital.example/fhir/sid/mrn", outcome="death")[0] == example
    documented = re.findall(r"^\| `([a-z_0-9]+)` \| [A-Z]", section, re.M)
    assert tuple(documented) == RESULT_COLUMNS
    csv_example = re.search(r"```csv\n(.*?)```", section, re.S).group(1)
    write_results_csv(tmp_path / "o.csv", result_rows(p, id_column="person_source_value"))
    assert list(csv.reader(io.StringIO((tmp_path / "o.csv").read_text()))) == list(csv.reader(io.StringIO(csv_example)))


def test_the_omop_results_csv_counts_the_ids_a_spreadsheet_would_run(tmp_path):
    """`--omop-out` is for a database, so ids are written as they are (an escaped id would not join),
    but an id `=HYPERLINK(...)` or `@SUM(1)` is a live formula in a spreadsheet: the writer counts
    those rows for the CLI to warn (it said nothing); plain numbers such as -12 are not counted."""
    import csv

    from clinograph.sdk.model.omop_results import write_results_csv

    ids = ("=HYPERLINK(\"http://x\")", "@SUM(1)", "+1+cmd|' /C calc'!A0", "-12", "\tx", "p3")
    p = _preds(ids=ids, risks=[(0.5,)] * len(ids))
    assert write_results_csv(tmp_path / "o.csv", result_rows(p, id_column="person_source_value")) == 4
    with (tmp_path / "o.csv").open(newline="") as fh:
        assert tuple(r["person_source_value"] for r in csv.DictReader(fh)) == ids
