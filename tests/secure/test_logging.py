"""The PHI guard on structured logs, and redacted, unpicklable key holders."""

from __future__ import annotations

import copy
import io
import json
import pickle

import numpy as np
import pandas as pd
import pytest
import structlog

from clinograph.core.identity import Identity
from clinograph.core.logging import PHILogError, configure_logging, get_logger, sensitive_key


class Tensorish:
    """Duck-typed like a torch tensor (shape + dtype), without importing torch."""

    shape = (4, 3)
    dtype = "float32"

    def __repr__(self) -> str:
        return "Tensorish([[0.12345, 98.7654, ...]])"


@pytest.fixture
def log_lines():
    stream = io.StringIO()
    configure_logging(stream=stream, whitelist=("cache_key",))
    yield lambda: [json.loads(x) for x in stream.getvalue().splitlines()]
    structlog.reset_defaults()


@pytest.mark.parametrize("field, value, shown", [
    ("arr", np.array([120.5, 80.25]), "ndarray with shape (2,)"),
    ("t", Tensorish(), "Tensorish with shape (4, 3)"),
    ("df", pd.DataFrame({"sodium": [141.0, 139.0]}), "DataFrame with shape (2, 1)"),
    ("s", pd.Series([1.5, 2.5]), "Series with shape (2,)"),
    ("blob", b"\x8f\x01hunter2", "bytes of length 9"),
    ("losses", [0.1 * i for i in range(17)], "list of 17 numbers"),
    ("nested", {"rows": [[1.0] * 9, [2.0] * 9]}, "list of 18 numbers"),
    ("patient_id", "P-000123", "a field named 'patient_id'"),
    ("PatientIds", ["P-1"], "a field named 'PatientIds'"),
    ("value", 141.0, "a field named 'value'"),
    ("cell_values", [1], "a field named 'cell_values'"),
    ("private_key", "abc", "a field named 'private_key'"),
    ("maskSeed", 7, "a field named 'maskSeed'"),
    ("secret", "hunter2", "a field named 'secret'"),
])
def test_guard_redacts(log_lines, field, value, shown):
    get_logger("t").info("event", **{field: value})
    (line,) = log_lines()
    # the timestamp's digits are not the event's; they matched the "1.6" canary by chance at hh:mm:51.6
    assert isinstance(line.pop("timestamp"), str)
    text = json.dumps(line)
    assert shown in text and "<redacted" in text
    for leak in ("120.5", "P-000123", "141.0", "0.12345", "hunter2", "1.6"):
        assert leak not in text.replace(shown, "")


def test_guard_keeps_what_events_may_carry(log_lines):
    get_logger("server").info("round closed", round=3, client="hosp-a", n_patients=120, shape=(120, 30),
                              module="gnn/layer1/has_feature", auroc=np.float64(0.81), loss=np.float32(0.5),
                              sha256="ab" * 32, cache_key="k1", features=["sodium", "heart_rate"],
                              small=[1.0, 2.0, 3.0])
    (line,) = log_lines()
    assert line["round"] == 3 and line["n_patients"] == 120 and line["auroc"] == pytest.approx(0.81)
    assert line["loss"] == 0.5 and line["cache_key"] == "k1" and line["small"] == [1.0, 2.0, 3.0]
    assert line["features"] == ["sodium", "heart_rate"] and line["logger"] == "server"
    assert "<redacted" not in json.dumps(line)


def test_bound_context_is_guarded_too(log_lines):
    get_logger("t").bind(seed=b"\x00" * 32).warning("bound")
    assert log_lines()[0]["seed"].startswith("<redacted")


def test_raise_mode_refuses():
    stream = io.StringIO()
    configure_logging(stream=stream, on_violation="raise")
    try:
        with pytest.raises(PHILogError, match=r"Log field 'arr' holds ndarray with shape \(3,\)"):
            get_logger("t").info("e", arr=np.zeros(3))
        assert stream.getvalue() == ""
    finally:
        structlog.reset_defaults()


def test_sensitive_key_matching():
    for key in ("patient_id", "patientId", "value", "Values", "seed_bytes", "key", "ckks_secret", "mrn"):
        assert sensitive_key(key), key
    for key in ("round", "client", "masked_mode", "keyword_count", "n_patients", "valuation", "module"):
        assert not sensitive_key(key), key


def test_level_filter_and_bad_level():
    stream = io.StringIO()
    configure_logging(stream=stream, level="warning")
    try:
        get_logger("t").info("hidden")
        get_logger("t").warning("shown")
        assert [json.loads(x)["event"] for x in stream.getvalue().splitlines()] == ["shown"]
    finally:
        structlog.reset_defaults()
    with pytest.raises(ValueError, match="Unknown log level"):
        configure_logging(level="loud")


def test_identity_has_redacted_repr_and_refuses_pickle_and_copy():
    ident = Identity.generate("hosp-a")
    raw_private = ident._key.private_bytes_raw()
    text = repr(ident) + str(ident) + f"{ident!r}"
    assert "redacted" in text and raw_private.hex() not in text
    with pytest.raises(TypeError, match="refuses to be pickled"):
        pickle.dumps(ident)
    with pytest.raises(TypeError, match="refuses to be pickled"):
        copy.deepcopy(ident)


# -- the canary scanner (tests/canary.py), which the federation-wide canary test reuses ------
def _canary_module():
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "canary.py"
    if "canary" not in sys.modules:
        spec = importlib.util.spec_from_file_location("canary", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["canary"] = module
        spec.loader.exec_module(module)
    return sys.modules["canary"]


def test_canary_scanner_finds_every_encoding(tmp_path):
    import base64
    import struct

    canary = _canary_module()
    c = canary.plant()
    s, x = c.strings[0], c.floats[0]
    assert len(set(c.strings)) == 4 and len(set(c.floats)) == 4 and c != canary.plant()
    assert all(60 <= v < 120 for v in canary.plant(low=60.0, high=120.0).floats)
    noise = bytes(range(256)) * 4
    cases = {
        "text": noise + f"patient {s} admitted".encode() + noise,
        "utf16": s.encode("utf-16-le"),
        "f64": noise + np.array([1.0, x], dtype="<f8").tobytes(),
        "f32": noise[:3] + np.array([x], dtype="<f4").tobytes(),
        "decimal": json.dumps({"sodium": x}).encode(),
        "decimal32": f"value={np.float32(x)}".encode(),
        "b64-f32": json.dumps({"data": base64.b64encode(b"\x01" + struct.pack("<f", x)).decode()}).encode(),
        "b64url-f64": base64.urlsafe_b64encode(b"ab" + struct.pack("<d", x) + b"zz"),
        "b64-text": base64.b64encode(b"x" + s.encode()),
    }
    for name, blob in cases.items():
        findings = canary.scan(c, blobs={name: blob})
        assert findings and all(f.where == name for f in findings), name
    assert canary.scan(c, blobs=[noise, b"clean log line", np.arange(1000, dtype="<f4").tobytes()]) == []
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "model.bin").write_bytes(noise + struct.pack("<d", c.floats[3]))
    (tmp_path / "clean.txt").write_text("nothing here")
    found = canary.scan(c, directories=[tmp_path])
    assert [f.where for f in found] == [str(tmp_path / "sub" / "model.bin")]
    assert repr(c.floats[3]) in canary.describe(found)


def test_canary_planted_in_a_table_stays_out_of_guarded_logs():
    canary = _canary_module()
    c = canary.plant()
    table = pd.DataFrame({"patient_id": [f"p{i}" for i in range(6)], "sodium": np.linspace(130, 145, 6),
                          "heart_rate": np.linspace(60, 90, 6)})
    planted = canary.plant_into_frame(table, c, id_column="patient_id", value_columns=["sodium", "heart_rate"])
    assert set(c.strings) <= set(planted["patient_id"]) and c.floats[0] in set(planted["sodium"])
    stream = io.StringIO()
    configure_logging(stream=stream)
    try:
        log = get_logger("ingest")
        log.info("table loaded", shape=planted.shape, columns=list(planted.columns), table=planted,
                 first=planted["sodium"].to_numpy(), patient_id=planted["patient_id"].iloc[0],
                 value=float(planted["sodium"].iloc[0]), row=planted.iloc[0].to_dict())
    finally:
        structlog.reset_defaults()
    out = stream.getvalue().encode()
    # The row dict has keys 'patient_id' and 'sodium': the id is redacted by name, the value is a
    # plain float under a harmless key -- exactly what the canary test exists to catch.
    leaks = canary.scan(c, blobs={"log": out})
    assert {f.marker for f in leaks} == {repr(c.floats[0])}
    assert c.strings[0] not in out.decode()


def test_stdlib_logging_of_clinograph_modules_is_guarded_too(caplog):
    import logging

    configure_logging(stream=io.StringIO())
    try:
        with caplog.at_level(logging.INFO):
            logging.getLogger("clinograph.secure.masking.client").warning(
                "clipped %d value(s) in %s: %s", 3, "gnn/layer1", np.array([123.456, 789.012]))
            logging.getLogger("someone.else").warning("%s", "untouched")
        text = "\n".join(r.getMessage() for r in caplog.records)
        assert "clipped 3 value(s) in gnn/layer1: <redacted: ndarray with shape (2,)>" in text
        assert "123.456" not in text and "untouched" in text
    finally:
        structlog.reset_defaults()


# -- EHR formats' keys (OMOP, MIMIC, FHIR) ---------------------------------------------------
EHR_KEYS = ["person_id", "subject_id", "encounter_id", "visit_occurrence_id", "visitOccurrenceId", "hadm_id",
            "stay_id", "name", "given", "family", "first_name", "last_name", "firstName", "birth_date",
            "birthDate", "dob", "DOB", "birth_datetime", "year_of_birth", "identifier"]


@pytest.mark.parametrize("key", EHR_KEYS)
def test_ehr_keys_are_sensitive(key):
    assert sensitive_key(key), key


@pytest.mark.parametrize("key", EHR_KEYS)
def test_ehr_keys_are_redacted_and_refused(log_lines, key):
    get_logger("t").info("event", **{key: "ZZ-CANARY-1"})
    (line,) = log_lines()
    assert line[key] == f"<redacted: a field named {key!r}>"
    stream = io.StringIO()
    configure_logging(stream=stream, on_violation="raise")
    try:
        with pytest.raises(PHILogError, match=f"Log field '{key}' holds a field named"):
            get_logger("t").info("e", **{key: "ZZ-CANARY-1"})
        assert stream.getvalue() == ""
    finally:
        structlog.reset_defaults()


def test_names_of_columns_features_and_modules_stay_loggable():
    for key in ("module_name", "feature_name", "column_name", "client_id", "round_id", "federation_id",
                "n_patients", "n_visits", "features"):
        assert not sensitive_key(key), key


def test_nested_ids_inside_event_values_are_redacted(log_lines):
    event = {
        "batch": [{"person_id": "ZZ-CANARY-2", "n": 3}, {"subject": {"id": "ZZ-CANARY-3", "reference": "Patient/ZZ-CANARY-4"}}],
        "fhir": {"resourceType": "Patient", "name": [{"given": ["ZZ-CANARY-5"], "family": "ZZ-CANARY-6"}],
                 "birthDate": "1970-01-01", "identifier": [{"system": "urn:mrn", "value": "ZZ-CANARY-7"}]},
        "rows": ({"encounter": {"ids": ["ZZ-CANARY-8"]}},),
        "patients": [{"id": "ZZ-CANARY-9"}],
        "module": {"id": "gnn/layer1", "shape": [16, 8]},
    }
    get_logger("t").info("nested", **event)
    (line,) = log_lines()
    text = json.dumps(line)
    assert "ZZ-CANARY" not in text and "1970-01-01" not in text
    assert line["batch"][0]["n"] == 3 and line["fhir"]["resourceType"] == "Patient"
    assert line["module"] == {"id": "gnn/layer1", "shape": [16, 8]}  # an id outside a patient context is kept


def test_canary_in_ehr_shaped_events_stays_out_of_guarded_logs():
    canary = _canary_module()
    c = canary.plant()
    s = c.strings
    stream = io.StringIO()
    configure_logging(stream=stream)
    try:
        log = get_logger("ingest")
        log.info("omop person", person_id=s[0], birth_datetime=s[1], year_of_birth=1970,
                 visit={"visit_occurrence_id": s[2], "visit_concept_id": 9201})
        log.info("mimic stay", subject_id=s[3], hadm_id=s[0], stay_id=s[1])
        log.info("fhir patient", resource={"subject": {"reference": f"Patient/{s[2]}"},
                                           "name": [{"given": [s[3]], "family": s[0]}], "dob": s[1]})
        log.bind(encounter_id=s[2]).warning("bound")
    finally:
        structlog.reset_defaults()
    out = stream.getvalue().encode()
    assert canary.scan(c, blobs={"log": out}) == []
    assert b"omop person" in out and b"9201" in out


def test_get_logger_guards_its_events_without_configuring_structlog_for_the_process(capsys):
    """A host embedding Clinograph keeps structlog's process-wide configuration: get_logger once
    configured it on first use (JSON to stderr for the host's own structlog events too)."""
    structlog.reset_defaults()
    log = get_logger("embedded")
    log.bind(round=2).info("event", patient_id="P-000123", n=3)
    assert not structlog.is_configured()
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert line["patient_id"] == "<redacted: a field named 'patient_id'>"
    assert (line["event"], line["n"], line["round"], line["logger"]) == ("event", 3, 2, "embedded")
    stream = io.StringIO()  # the host configures structlog later: Clinograph's events follow it
    structlog.configure(processors=[structlog.processors.JSONRenderer()],
                        logger_factory=structlog.PrintLoggerFactory(stream))
    try:
        log.info("after")
        assert json.loads(stream.getvalue()) == {"event": "after"}
    finally:
        structlog.reset_defaults()
