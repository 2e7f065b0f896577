"""FHIR R4 (fhir.resources R4B models): bundles and NDJSON, LOINC codes and UCUM units, labels, errors."""

from __future__ import annotations

import json

import pytest
from clinograph.sdk.datasets.ehr import LABEL_CODE, fhir_resources, write_fhir
from clinograph.sdk.ingest.fhir import read_fhir
from ehr_helpers import D, assert_same, demo_hospitals

from clinograph.core.errors import ConfigError, SchemaError

LOINC = "http://loinc.org"


def _obs(i, pid, code, when, **value):
    return {"resourceType": "Observation", "id": f"o{i}", "status": "final",
            "code": {"coding": [{"system": LOINC, "code": code}]}, "subject": {"reference": f"Patient/{pid}"},
            "effectiveDateTime": when, **value}


def _ndjson(path, resources):
    path.write_text("".join(json.dumps(r) + "\n" for r in resources))
    return path


def test_loinc_codes_and_ucum_units_map_through_the_dictionary(tmp_path):
    res = [{"resourceType": "Patient", "id": "p1", "identifier": [{"value": "MRN-1"}]},
           _obs(1, "p1", "2345-7", "2024-01-01T08:00:00+01:00",
                valueQuantity={"value": 90.078, "unit": "mg/dl", "system": "http://unitsofmeasure.org", "code": "mg/dL"}),
           _obs(2, "p1", "8310-5", "2024-01-01T07:00:00Z", valueQuantity={"value": 98.6, "code": "[degF]"}),
           _obs(3, "p1", "8867-4", "2024-01-02T09:00:00Z", valueQuantity={"value": 80, "unit": "/min"}),
           _obs(4, "p1", "12345-6", "2024-01-01T07:00:00Z", valueQuantity={"value": 1}),     # not in the dictionary
           _obs(5, "ghost", "8867-4", "2024-01-01T07:00:00Z", valueQuantity={"value": 1}),   # no such Patient
           {"resourceType": "Encounter", "id": "e1", "status": "finished", "class": {"code": "IMP"}}]
    ex = read_fhir(_ndjson(tmp_path / "x.ndjson", res), dictionary=D, site="s", label_code=None, patient_id="identifier")
    t = ex.ingest(D)
    assert t.patient_ids == ("MRN-1",) and t.n_snapshots == 2
    idx = D.node_index()
    assert t.value[t.node == idx["glucose"]].tolist() == pytest.approx([5.0])
    assert t.value[t.node == idx["temperature"]].tolist() == pytest.approx([37.0])
    assert ex.report.unmapped_rows == 1
    assert any("without a Patient read here: 1" in n for n in ex.report.notes)
    assert "other resources skipped (Encounter 1): 1" in ex.report.notes


def test_bundle_and_ndjson_read_the_same_and_match_the_csv(tmp_path):
    from clinograph.sdk.ingest import ingest

    table, schema = demo_hospitals()[2]
    ref = ingest(table, schema=schema, dictionary=D)
    bulk = read_fhir(write_fhir(tmp_path / "bulk", table, schema, D), dictionary=D, site="east", label_code=LABEL_CODE)
    bundle = read_fhir(write_fhir(tmp_path / "b.json", table, schema, D, form="bundle"), dictionary=D, site="east",
                       label_code=LABEL_CODE)
    assert_same(ref, bulk.ingest(D))
    assert_same(ref, bundle.ingest(D))


def test_invalid_resources_are_all_named_by_place_and_field_without_values(tmp_path):
    table, schema = demo_hospitals()[3]
    res = fhir_resources(table.iloc[:2], schema, D)
    res[0]["birthDate"] = "ZQXCANARY"
    res[3]["valueQuantity"] = {"value": "ZQXCANARY"}
    with pytest.raises(SchemaError) as err:
        read_fhir(_ndjson(tmp_path / "x.ndjson", res), dictionary=D, site="s", label_code=LABEL_CODE)
    text = str(err.value)
    assert "FHIR Patient at x.ndjson line 1 does not validate (fields: birthDate" in text
    assert "FHIR Observation at x.ndjson line 4 does not validate (fields: valueQuantity" in text
    assert "ZQXCANARY" not in text


def test_broken_inputs(tmp_path):
    (tmp_path / "bad.ndjson").write_text('{"resourceType": "Patient", "id": \n')
    with pytest.raises(SchemaError, match=r"bad.ndjson line 1 is not valid JSON"):
        read_fhir(tmp_path / "bad.ndjson", dictionary=D, site="s", label_code=None)
    with pytest.raises(ConfigError, match="does not exist"):
        read_fhir(tmp_path / "none", dictionary=D, site="s", label_code=None)



@pytest.mark.parametrize(("name", "data", "found"), [
    ("deep.ndjson", b"[" * 200_000 + b"]" * 200_000 + b"\n", r"deep.ndjson line 1 nests JSON .* too deeply"),
    ("deep.json", b'{"a":' * 200_000 + b"1" + b"}" * 200_000, r"deep.json nests JSON .* too deeply"),
    ("binary.ndjson", b'{"resourceType": "Patient"}\n\xff\xfe\x00\x81\n', r"binary.ndjson line 2 is not UTF-8 text"),
    ("binary.json", b"\x89PNG\r\n\x1a\n\xff", r"binary.json is not UTF-8 text"),
])
def test_deep_or_binary_json_is_a_clear_schema_error(tmp_path, name, data, found):
    """Issue 31: 200 000 levels of nesting (RecursionError) and binary bytes (UnicodeDecodeError)
    were internal errors."""
    (tmp_path / name).write_bytes(data)
    with pytest.raises(SchemaError, match=found):
        read_fhir(tmp_path / name, dictionary=D, site="s", label_code=None)


def test_a_utf8_byte_order_mark_is_read(tmp_path):
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps({"resourceType": "Bundle", "entry": []}).encode())
    extract = read_fhir(tmp_path / "bom.json", dictionary=D, site="s", label_code=None)  # read as JSON
    assert extract.table.empty


def _bp_panel(i, pid, when, sys_mmhg, dia):
    return {"resourceType": "Observation", "id": f"bp{i}", "status": "final",
            "code": {"coding": [{"system": LOINC, "code": "85354-9"}]}, "subject": {"reference": f"Patient/{pid}"},
            "effectiveDateTime": when,
            "component": [{"code": {"coding": [{"system": LOINC, "code": "8480-6"}]},
                           "valueQuantity": {"value": sys_mmhg, "system": "http://unitsofmeasure.org", "code": "mm[Hg]"}},
                          {"code": {"coding": [{"system": LOINC, "code": "8462-4"}]}, **dia}]}


def test_patient_sex_and_age_components_absent_values_and_comparators(tmp_path):
    from clinograph.sdk.ingest.omop import OmopSex
    from ehr_helpers import extended_dictionary

    d2 = extended_dictionary()
    res = [{"resourceType": "Patient", "id": "p1", "gender": "female", "birthDate": "1964-01-01"},
           {"resourceType": "Patient", "id": "p2", "gender": "unknown", "birthDate": "1990"},
           _bp_panel(1, "p1", "2024-01-01T08:00:00Z", 120, {"valueQuantity": {"value": 10.0, "code": "kPa"}}),
           _bp_panel(2, "p2", "2024-01-01T08:00:00Z", 110, {"dataAbsentReason": {"text": "not measured"}}),
           _obs(3, "p1", "2345-7", "2024-01-01T08:00:00Z",
                valueQuantity={"value": 1.0, "comparator": "<", "code": "mmol/L"}),
           _obs(4, "p2", "2345-7", "2024-01-01T08:00:00Z", dataAbsentReason={"text": "error"})]
    path = _ndjson(tmp_path / "x.ndjson", res)
    with pytest.raises(SchemaError, match=r"feature 'glucose': 1 censored value\(s\).*\(e\.g\. x\.ndjson line 5\)"):
        read_fhir(path, dictionary=d2, site="s", label_code=None, age="age",
                  sex=OmopSex(feature="sex", male="male", female="female"))
    ex = read_fhir(path, dictionary=d2, site="s", label_code=None, censored="bound", age="age",
                   sex=OmopSex(feature="sex", male="male", female="female"))
    t = ex.ingest(d2)
    idx = d2.node_index()
    assert sorted(t.value[t.node == idx["systolic_bp"]].tolist()) == [110.0, 120.0]
    assert t.value[t.node == idx["diastolic_bp"]].tolist() == pytest.approx([75.006], abs=1e-3)  # 10 kPa
    assert t.value[t.node == idx["glucose"]].tolist() == [1.0]
    assert sorted(t.value[t.node == idx["age"]].tolist()) == pytest.approx([33.5, 60.0], abs=0.01)  # "1990": July
    assert int((t.node == idx["sex=female"]).sum()) == 1 and int((t.node == idx["sex=male"]).sum()) == 0
    notes = "\n".join(ex.report.notes)
    assert "with a dataAbsentReason (read as missing): 2" in notes
    assert "gender other than male/female (sex missing): 1" in notes


def test_a_quantity_without_a_unit_is_refused_unless_declared(tmp_path):
    res = [{"resourceType": "Patient", "id": "p1"},
           _obs(1, "p1", "8867-4", "2024-01-01T08:00:00Z", valueQuantity={"value": 80}),
           _obs(2, "p1", "2345-7", "2024-01-01T08:00:00Z", valueQuantity={"value": 5.0})]
    path = _ndjson(tmp_path / "x.ndjson", res)
    with pytest.raises(SchemaError) as err:
        read_fhir(path, dictionary=D, site="s", label_code=None)
    text = str(err.value)
    assert "FHIR R4: feature 'heart_rate': 1 value(s) carry no unit (e.g. x.ndjson line 2)" in text
    assert "FHIR R4: feature 'glucose': 1 value(s) carry no unit (e.g. x.ndjson line 3)" in text
    t = read_fhir(path, dictionary=D, site="s", label_code=None,
                  units={"heart_rate": "/min", "glucose": "mmol/L"}).ingest(D)
    assert sorted(t.value.tolist()) == [5.0, 80.0]


def test_strict_fields_and_full_validation(tmp_path):
    res = [{"resourceType": "Patient", "id": "p1", "gender": "f"},
           _obs(1, "p1", "8867-4", "2024-01-01T08:00:00Z", valueQuantity={"value": "80", "unit": "/min"}),
           _obs(2, "p1", "8867-4", "yesterday", valueBoolean="true")]
    with pytest.raises(SchemaError) as err:
        read_fhir(_ndjson(tmp_path / "x.ndjson", res), dictionary=D, site="s", label_code=None)
    text = str(err.value)
    assert "Patient at x.ndjson line 1 does not validate (fields: gender)" in text
    assert "line 2 does not validate (fields: valueQuantity.value" in text
    assert "line 3 does not validate (fields: effectiveDateTime, valueBoolean)" in text
    assert "yesterday" not in text
    table, schema = demo_hospitals()[3]
    ok = _ndjson(tmp_path / "ok.ndjson", fhir_resources(table.iloc[:3], schema, D))
    fast = read_fhir(ok, dictionary=D, site="west", label_code=LABEL_CODE).ingest(D)
    full = read_fhir(ok, dictionary=D, site="west", label_code=LABEL_CODE, validate="full").ingest(D)
    assert_same(fast, full)


_PATIENT = {"resourceType": "Patient", "id": "p1", "gender": "female", "birthDate": "1964-01-01"}


@pytest.mark.parametrize(("name", "text", "found"), [
    ("entry.json", '{"resourceType": "Bundle", "entry": 5}', r"Bundle entry.json: 'entry' is a JSON int, not a list"),
    ("entries.json", '{"resourceType": "Bundle", "entry": ["x"]}', r"Bundle entries.json entry 1 is not an object"),
    ("resource.json", '{"resourceType": "Bundle", "entry": [{"resource": "Patient"}]}',
     r"Bundle resource.json entry 1 is not an object with a 'resource' object"),
    ("nan.ndjson", json.dumps(_obs(1, "p1", "2345-7", "2024-01-01T08:00:00Z", valueQuantity={"value": 1.0}))
     .replace("1.0", "NaN"), r"nan.ndjson line 1 is not valid JSON \(NaN is not a JSON number\)"),
    ("digits.ndjson", '{"resourceType": "Patient", "id": "p1", "x": ' + "9" * 5000 + "}",
     r"digits.ndjson line 1 is not valid JSON \(Exceeds the limit"),
    ("late.ndjson", "\n".join(json.dumps(r) for r in (_PATIENT, _obs(1, "p1", "2345-7", "9999-12-31T23:59:59+14:00",
                                                                       valueQuantity={"value": 5.0, "code": "mmol/L"}))),
     r"1 time\(s\) are not ISO 8601 times between the years 1677 and 2262 \(at late.ndjson line 2\)"),
    ("born.ndjson", "\n".join(json.dumps(r) for r in ({**_PATIENT, "birthDate": "1964-02-30"},
                                                       _obs(1, "p1", "2345-7", "2024-01-01T08:00:00Z",
                                                            valueQuantity={"value": 5.0, "code": "mmol/L"}))),
     r"1 Patient birthDate\(s\) are not a calendar date .* \(at born.ndjson line 1\)"),
])
def test_hostile_json_shapes_numbers_and_dates_are_schema_errors(tmp_path, name, text, found):
    """Adversarial rerun of issue 31: a Bundle whose entries are not objects, an integer past
    Python's digit bound, a time or birth date outside a timestamp's years gave internal errors
    (TypeError, AttributeError, ValueError, OutOfBoundsDatetime, DateParseError); NaN was read as
    a missing value."""
    from clinograph.sdk.ingest.omop import OmopSex
    from ehr_helpers import extended_dictionary

    (tmp_path / name).write_text(text + "\n")
    with pytest.raises(SchemaError, match=found):
        read_fhir(tmp_path / name, dictionary=extended_dictionary(), site="s", label_code=None, age="age",
                  sex=OmopSex(feature="sex", male="male", female="female"))


def test_absolute_versioned_and_bundle_uuid_references_withdrawn_results_and_huge_numbers(tmp_path):
    uuid = "3f1c2b9e-8a7d-4c1e-9b2a-0d4e5f6a7b8c"
    hr = {"valueQuantity": {"value": 80, "code": "/min"}}
    res = [{"resourceType": "Patient", "id": "p1"}, {"resourceType": "Patient", "id": uuid},
           {**_obs(1, "x", "8867-4", "2024-01-01T07:00:00Z", **hr), "subject": {"reference": f"urn:uuid:{uuid}"}},
           {**_obs(2, "x", "8867-4", "2024-01-01T07:00:00Z", **hr),
            "subject": {"reference": "https://ehr.example/fhir/Patient/p1/_history/2"}},
           {**_obs(3, "p1", "8867-4", "2024-01-01T08:00:00Z", valueQuantity={"value": 999, "code": "/min"}),
            "status": "entered-in-error"}]
    bundle = tmp_path / "b.json"  # a Synthea-style transaction bundle
    bundle.write_text(json.dumps({"resourceType": "Bundle", "type": "transaction",
                                  "entry": [{"fullUrl": f"urn:uuid:{r['id']}", "resource": r} for r in res]}))
    ex = read_fhir(bundle, dictionary=D, site="s", label_code=None)
    t = ex.ingest(D)
    assert t.n_patients == 2 and t.value.tolist() == pytest.approx([80.0, 80.0])
    assert "Observations entered in error or cancelled (excluded): 1" in ex.report.notes
    huge = _ndjson(tmp_path / "h.ndjson", [res[0], _obs(4, "p1", "8867-4", "2024-01-01T07:00:00Z",
                                                        valueQuantity={"value": 10**400, "code": "/min"})])
    with pytest.raises(SchemaError, match="h.ndjson line 2: infinite value"):
        read_fhir(huge, dictionary=D, site="s", label_code=None).ingest(D)


def test_two_patients_sharing_an_identifier_are_refused_not_merged(tmp_path):
    hr = {"valueQuantity": {"value": 80, "code": "/min"}}
    res = [{"resourceType": "Patient", "id": "a", "identifier": [{"value": "MRN-1"}]},
           {"resourceType": "Patient", "id": "b", "identifier": [{"value": "MRN-1"}]},
           _obs(1, "a", "8867-4", "2024-01-01T07:00:00Z", **hr), _obs(2, "b", "8867-4", "2024-01-01T07:00:00Z", **hr)]
    path = _ndjson(tmp_path / "x.ndjson", res)
    with pytest.raises(SchemaError, match=r"1 patient key\(s\) \(identifier\) are shared by several Patient resources "
                                          r"\(e.g. x.ndjson line 1, x.ndjson line 2\)") as err:
        read_fhir(path, dictionary=D, site="s", label_code=None, patient_id="identifier")
    assert "MRN-1" not in str(err.value)
    assert read_fhir(path, dictionary=D, site="s", label_code=None).ingest(D).n_patients == 2  # by resource id


def test_a_patient_contained_in_its_observation_is_resolved_by_identifier(tmp_path):
    """A lab feed's standalone Observation carries its Patient in ``contained`` (subject ``#p1``);
    it was counted as "without a Patient". A contained id means nothing outside its resource, so
    the patient is its identifier -- one patient with a top-level Patient of that identifier."""
    from clinograph.sdk.ingest.omop import OmopSex
    from ehr_helpers import extended_dictionary

    d2 = extended_dictionary()
    hr = {"valueQuantity": {"value": 80, "code": "/min"}}
    mine = {"resourceType": "Patient", "id": "p1", "identifier": [{"value": "MRN-7"}], "gender": "female"}
    res = [{"resourceType": "Patient", "id": "top", "identifier": [{"value": "MRN-1"}], "gender": "male"},
           _obs(1, "top", "8867-4", "2024-01-01T07:00:00Z", **hr),
           {**_obs(2, "x", "8867-4", "2024-01-01T07:00:00Z", **hr), "contained": [mine], "subject": {"reference": "#p1"}},
           {**_obs(3, "x", "2345-7", "2024-01-01T09:00:00Z", valueQuantity={"value": 5.0, "code": "mmol/L"}),
            "contained": [{**mine, "identifier": [{"value": "MRN-1"}], "gender": "male"}], "subject": {"reference": "#p1"}}]
    path = _ndjson(tmp_path / "x.ndjson", res)
    sex = OmopSex(feature="sex", male="male", female="female")
    ex = read_fhir(path, dictionary=d2, site="s", label_code=None, patient_id="identifier", sex=sex)
    t = ex.ingest(d2)
    assert t.patient_ids == ("MRN-1", "MRN-7")
    idx = d2.node_index()
    assert sorted(t.value[t.node == idx["heart_rate"]].tolist()) == [80.0, 80.0]
    assert t.value[(t.node == idx["glucose"])].tolist() == [5.0]
    assert t.patient[t.node == idx["glucose"]].tolist() == [0]                  # MRN-1: the top-level Patient
    assert t.patient[t.node == idx["sex=female"]].tolist() == [1]               # MRN-7's contained gender
    assert not any("without a Patient" in n for n in ex.report.notes)
    with pytest.raises(SchemaError, match=r"2 Observation\(s\) reference a Patient contained in them \(e.g. x.ndjson "
                                          r"line 3, x.ndjson line 4\).*patient_id = \"identifier\""):
        read_fhir(path, dictionary=d2, site="s", label_code=None)
    clash = _ndjson(tmp_path / "c.ndjson", [*res[:3], {**res[3], "contained": [{**mine, "identifier": [{"value": "MRN-1"}]}]}])
    with pytest.raises(SchemaError, match=r"1 patient\(s\) .* disagree on gender or birthDate \(e.g. c.ndjson line 1, "
                                          r"c.ndjson line 4\)") as err:
        read_fhir(clash, dictionary=d2, site="s", label_code=None, patient_id="identifier", sex=sex)
    assert "MRN" not in str(err.value)


def test_codings_of_one_feature_read_once_and_of_two_features_are_an_error(tmp_path):
    """An Observation coded LOINC 8867-4 and ALARM HRBP (two dictionary features) was read silently
    under the first coding's feature only; two codings of one feature are one reading."""
    alarm = "https://clinograph.org/fhir/CodeSystem/alarm"

    def coded(i, *codes):
        o = _obs(i, "p1", "x", "2024-01-01T07:00:00Z", valueQuantity={"value": 80, "code": "/min"})
        return {**o, "code": {"coding": [{"system": s, "code": c} for s, c in codes]}}

    same = [{"resourceType": "Patient", "id": "p1"}, coded(1, (LOINC, "8867-4"), (alarm, "HREKG"), (LOINC, "8867-4"))]
    ex = read_fhir(_ndjson(tmp_path / "same.ndjson", same), dictionary=D, site="s", label_code=None)
    assert ex.report.events_mapped == 1 and ex.report.collapsed == 0
    assert ex.ingest(D).value.tolist() == [80.0]
    two = [*same, coded(2, (LOINC, "8867-4"), (alarm, "HRBP")), coded(3, (LOINC, "12345-6"), (alarm, "HRSAT"))]
    with pytest.raises(SchemaError, match=r"1 Observation\(s\) \(e.g. two.ndjson line 3\) are coded LOINC/8867-4 and "
                                          r"ALARM/HRBP, codes of two different dictionary features \('heart_rate', "
                                          r"'heart_rate_art'\)"):
        read_fhir(_ndjson(tmp_path / "two.ndjson", two), dictionary=D, site="s", label_code=None)


def test_a_transaction_bundle_naming_patients_by_fullurl_only_is_resolved(tmp_path):
    """A transaction Bundle (POST entries) may leave resource ids out and name each resource by its
    entry's fullUrl (``urn:uuid:``); its Observations were all counted as "without a Patient" and
    the Patient read as a patient called 'None'."""
    uuid = "3f1c2b9e-8a7d-4c1e-9b2a-0d4e5f6a7b8c"
    obs = {k: v for k, v in _obs(1, "x", "8867-4", "2024-01-01T07:00:00-05:00",
                                 valueQuantity={"value": 80, "code": "/min"}).items() if k != "id"}
    entries = [{"fullUrl": f"urn:uuid:{uuid}", "resource": {"resourceType": "Patient", "gender": "male"},
                "request": {"method": "POST", "url": "Patient"}},
               {"fullUrl": "urn:uuid:0d4e5f6a-0000-4c1e-9b2a-3f1c2b9e8a7d",
                "resource": {**obs, "subject": {"reference": f"urn:uuid:{uuid}"}},
                "request": {"method": "POST", "url": "Observation"}}]
    bundle = tmp_path / "b.json"
    bundle.write_text(json.dumps({"resourceType": "Bundle", "type": "transaction", "entry": entries}))
    t = read_fhir(bundle, dictionary=D, site="s", label_code=None).ingest(D)
    assert t.patient_ids == (uuid,) and t.value.tolist() == [80.0]
    nameless = _ndjson(tmp_path / "x.ndjson", [{"resourceType": "Patient"}, {**obs, "subject": {"reference": "Patient/1"}}])
    with pytest.raises(SchemaError, match=r"1 Patient\(s\) have no id, and no Bundle fullUrl naming one \(e.g. x.ndjson "
                                          r"line 1\)"):
        read_fhir(nameless, dictionary=D, site="s", label_code=None)


def test_an_observation_without_a_time_is_excluded_and_counted_not_put_in_the_first_snapshot(tmp_path):
    """An Observation with no effective[x] nor issued was read at hour 0 and, as the last value of
    that snapshot, silently replaced the patient's real first value."""
    hr = [_obs(i, "p1", "8867-4", when, valueQuantity={"value": v, "code": "/min"})
          for i, (when, v) in enumerate((("2024-01-01T08:00:00Z", 70), ("2024-01-03T08:00:00Z", 90), (None, 150)))]
    del hr[2]["effectiveDateTime"]
    ex = read_fhir(_ndjson(tmp_path / "x.ndjson", [{"resourceType": "Patient", "id": "p1"}, *hr]), dictionary=D,
                   site="s", label_code=None)
    assert ex.ingest(D).value.tolist() == [70.0, 90.0]
    assert "Observations (or components) without a time: no effective[x] nor issued (excluded): 1" in ex.report.notes


def test_a_logical_subject_reference_resolves_to_the_patient_carrying_that_identifier(tmp_path):
    """``subject: {identifier: {system, value}}`` (no ``reference``, as converted HL7 v2 feeds send
    it) was counted as "without a Patient"; it names the Patient with that identifier -- any of
    its identifiers -- and nothing else (an unknown MRN is not made into a patient)."""
    mrn = "https://hospital.example/mrn"
    hr = {"valueQuantity": {"value": 80, "code": "/min"}}
    res = [{"resourceType": "Patient", "id": "p1", "identifier": [{"system": "urn:synthea", "value": "u1"},
                                                                  {"system": mrn, "value": "M-1"}]},
           {**_obs(1, "x", "8867-4", "2024-01-01T07:00:00Z", **hr), "subject": {"identifier": {"system": mrn,
                                                                                               "value": "M-1"}}},
           {**_obs(2, "x", "8867-4", "2024-01-02T07:00:00Z", **hr), "subject": {"identifier": {"value": "M-1"}}},
           {**_obs(3, "x", "8867-4", "2024-01-03T07:00:00Z", **hr), "subject": {"identifier": {"value": "M-2"}}}]
    for key, found in (("id", "p1"), ("identifier", "u1")):
        ex = read_fhir(_ndjson(tmp_path / "x.ndjson", res), dictionary=D, site="s", label_code=None, patient_id=key)
        t = ex.ingest(D)
        assert t.patient_ids == (found,) and t.value.tolist() == [80.0, 80.0]
        assert "Observation readings (a panel: each component) without a Patient read here: 1" in ex.report.notes


def test_loinc_by_its_oid_maps_and_unnamed_coding_systems_are_reported(tmp_path):
    """C-CDA-converted FHIR codes LOINC by its OID; a system Clinograph does not know was reported
    only as '(uncoded)', without saying which system to name."""
    hr = {"valueQuantity": {"value": 80, "code": "/min"}}
    oid = {**_obs(1, "p1", "8867-4", "2024-01-01T07:00:00Z", **hr),
           "code": {"coding": [{"system": "urn:oid:2.16.840.1.113883.6.1", "code": "8867-4"}]}}
    local = {**_obs(2, "p1", "8867-4", "2024-01-01T08:00:00Z", **hr),
             "code": {"coding": [{"system": "https://hospital.example/labcodes", "code": "HR"}]}}
    ex = read_fhir(_ndjson(tmp_path / "x.ndjson", [{"resourceType": "Patient", "id": "p1"}, oid, local]),
                   dictionary=D, site="s", label_code=None)
    assert ex.ingest(D).value.tolist() == [80.0]
    assert ("codings in coding systems not named in systems (read as '(uncoded)'): 1 in 1 system(s) "
            "(https://hospital.example/labcodes)") in "\n".join(ex.report.notes)


def test_the_identifier_system_names_the_patient_and_a_patient_without_one_is_refused(tmp_path):
    """Synthea lists each Patient's own uuid first and the MRN after it: patient_id = "identifier"
    read the first identifier only; identifier_system picks the MRN's."""
    from ehr_helpers import extended_dictionary

    d2 = extended_dictionary()
    mrn, uuid = "http://hospital.example/mrn", "https://github.com/synthetichealth/synthea"
    hr = {"valueQuantity": {"value": 80, "code": "/min"}}
    res = [{"resourceType": "Patient", "id": "a", "identifier": [{"system": uuid, "value": "u-1"},
                                                                 {"system": mrn, "value": "MRN-1"}]},
           {"resourceType": "Patient", "id": "b", "identifier": [{"system": uuid, "value": "u-2"},
                                                                 {"system": mrn, "value": "MRN-2"}]},
           _obs(1, "a", "8867-4", "2024-01-01T07:00:00Z", **hr), _obs(2, "b", "8867-4", "2024-01-01T07:00:00Z", **hr)]
    path = _ndjson(tmp_path / "x.ndjson", res)
    first = read_fhir(path, dictionary=d2, site="s", label_code=None, patient_id="identifier").ingest(d2)
    assert first.patient_ids == ("u-1", "u-2")
    by_mrn = read_fhir(path, dictionary=d2, site="s", label_code=None, patient_id="identifier",
                       identifier_system=mrn).ingest(d2)
    assert by_mrn.patient_ids == ("MRN-1", "MRN-2")
    res[1]["identifier"] = res[1]["identifier"][:1]
    with pytest.raises(SchemaError, match=r"1 Patient\(s\) carry no identifier of system .*y.ndjson line 2") as err:
        read_fhir(_ndjson(tmp_path / "y.ndjson", res), dictionary=d2, site="s", label_code=None,
                  patient_id="identifier", identifier_system=mrn)
    assert "u-2" not in str(err.value)


def test_gzipped_bulk_files_other_files_and_resource_types_are_read_or_counted(tmp_path):
    """A bulk export's Observation.ndjson.gz was ignored in a folder (only .ndjson/.json were read):
    the export's observations were silently missing, or the folder 'held no file'."""
    import gzip

    folder = tmp_path / "bulk"
    folder.mkdir()
    hr = [_obs(i, "p1", "8867-4", f"2024-01-0{i + 1}T08:00:00Z", valueQuantity={"value": 70 + i, "code": "/min"})
          for i in range(2)]
    with gzip.open(folder / "Observation.ndjson.gz", "wt") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in hr))
    _ndjson(folder / "Patient.ndjson", [{"resourceType": "Patient", "id": "p1"}])
    _ndjson(folder / "Claim.ndjson", [{"resourceType": "Claim", "id": "c1"}, {"resourceType": "Claim", "id": "c2"}])
    (folder / "manifest.txt").write_text("not FHIR")
    ex = read_fhir(folder, dictionary=D, site="s", label_code=None)
    assert ex.ingest(D).value.tolist() == [70.0, 71.0]
    assert "other resources skipped (Claim 2): 2" in ex.report.notes
    assert "files in the folder not read (not .json, .ndjson or .ndjson.gz): 1" in ex.report.notes
    (folder / "Observation.ndjson.gz").write_bytes(b"\x1f\x8b\x08truncated")
    with pytest.raises(SchemaError, match=r"Observation.ndjson.gz is not a complete gzip file"):
        read_fhir(folder, dictionary=D, site="s", label_code=None)


def test_dates_without_a_time_are_read_at_midnight_and_counted_and_a_month_is_excluded(tmp_path):
    """A date-only effectiveDateTime reads at 00:00 UTC of its day (as OMOP reads a date), counted;
    '2024-01' or '2024' was read as the 1st of the month / year, silently: now excluded and counted."""
    res = [{"resourceType": "Patient", "id": "p1"},
           _obs(1, "p1", "8867-4", "2024-01-02T08:00:00Z", valueQuantity={"value": 70, "code": "/min"}),
           _obs(2, "p1", "8867-4", "2024-01-02", valueQuantity={"value": 80, "code": "/min"}),
           _obs(3, "p1", "8867-4", "2024-01", valueQuantity={"value": 150, "code": "/min"}),
           _obs(4, "p1", "8867-4", "2023", valueQuantity={"value": 160, "code": "/min"})]
    ex = read_fhir(_ndjson(tmp_path / "x.ndjson", res), dictionary=D, site="s", label_code=None)
    t = ex.ingest(D)
    assert t.value.tolist() == [70.0]            # one snapshot: the timed 08:00 value is the day's last
    notes = "\n".join(ex.report.notes)
    assert "dated to the day only, read at 00:00 UTC of that day: 1" in notes
    assert "dated to a month or year only (excluded: no day to place them in): 2" in notes


def test_file_names_that_may_name_a_patient_are_not_shown_and_ndjson_lines_may_be_bundles(tmp_path):
    """Synthea writes a Bundle a patient named Given_Family_<uuid>.json: that name was in every
    message and report line about its resources. A Bundle on an NDJSON line was one skipped
    'Bundle' (its Observations silently lost)."""
    folder = tmp_path / "fhir"
    folder.mkdir()
    bad = _obs(1, "p1", "8867-4", "2024-01-01T08:00:00Z", valueQuantity={"value": "70", "code": "/min"})
    bundle = {"resourceType": "Bundle", "type": "collection",
              "entry": [{"resource": {"resourceType": "Patient", "id": "p1"}}, {"resource": bad}]}
    (folder / "Zqxcanary12_Doe34_2fa15bc7-8866-461a-9000-f739e425860a.json").write_text(json.dumps(bundle))
    (folder / "hospitalInformation1671.json").write_text(json.dumps({"resourceType": "Bundle", "entry": []}))
    with pytest.raises(SchemaError) as err:
        read_fhir(folder, dictionary=D, site="s", label_code=None)
    assert "file 1 of 2 (by name) entry 2" in str(err.value) and "Zqxcanary" not in str(err.value)
    (folder / "Smith.json").write_text(json.dumps({"resourceType": "Bundle", "entry": []}))  # a word, no type
    with pytest.raises(SchemaError) as err:
        read_fhir(folder, dictionary=D, site="s", label_code=None)
    assert "file 2 of 3 (by name) entry 2" in str(err.value)
    bad["valueQuantity"]["value"] = 70
    _ndjson(tmp_path / "b.ndjson", [bundle])
    assert read_fhir(tmp_path / "b.ndjson", dictionary=D, site="s", label_code=None).ingest(D).value.tolist() == [70.0]


def test_a_ucum_unit_by_the_ucum_oid_is_read_by_its_code(tmp_path):
    """C-CDA conversions name UCUM by its OID: the code ('[degF]') was ignored for the display text
    ('degrees Fahrenheit'), an unknown unit."""
    temp = _obs(1, "p1", "8310-5", "2024-01-01T07:00:00Z", valueQuantity={
        "value": 98.6, "unit": "degrees Fahrenheit", "system": "urn:oid:2.16.840.1.113883.6.8", "code": "[degF]"})
    ex = read_fhir(_ndjson(tmp_path / "x.ndjson", [{"resourceType": "Patient", "id": "p1"}, temp]), dictionary=D,
                   site="s", label_code=None)
    assert ex.ingest(D).value.tolist() == pytest.approx([37.0])


def test_readings_share_one_string_a_subject_code_and_unit():
    # measured on a 20 000-patient bulk export (800 000 Observations): peak RSS 1139 -> 966 MB when each reading
    # stops holding its own copy of the subject reference, code and unit (parsed anew from every JSON line)
    from collections import Counter

    from clinograph.sdk.ingest import fhir_models as fm
    from clinograph.sdk.ingest.fhir import DEFAULT_SYSTEMS, _read_observation

    out: list = []
    for n in (1, 2):
        doc = json.loads(json.dumps({"resourceType": "Observation", "id": f"o{n}", "status": "final",
                                     "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4"}]},
                                     "subject": {"reference": "Patient/p1"}, "effectiveDateTime": "2024-01-01",
                                     "valueQuantity": {"value": 70 + n, "unit": "/min"}}))
        o = fm.Observation.model_validate(doc)
        _read_observation(o, f"line {n}", subject="".join(["Patient/", "p1"]), names=DEFAULT_SYSTEMS, feature_of={},
                          label_code=None, out=out, counts=Counter(), codings={})
    (subject1, _, key1, _, unit1, *_), (subject2, _, key2, _, unit2, *_) = out
    assert subject1 is subject2 and key1 is key2 and unit1 is unit2


def test_an_index_encounter_is_time_zero_and_closes_the_window(tmp_path):
    # before: FHIR had no index time: every Observation was read (one after the prediction time too, a leak), and
    # time counted from the first one, so FHIR's snapshots and ages differed from OMOP's and MEDS' of one cohort
    from clinograph.sdk.ingest.sources import FhirIndex
    from ehr_helpers import extended_dictionary

    d = extended_dictionary()

    def obs(n, pid, when, value):
        return {"resourceType": "Observation", "id": f"o{n}", "status": "final", "subject": {"reference": f"Patient/{pid}"},
                "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4"}]}, "effectiveDateTime": when,
                "valueQuantity": {"value": value, "unit": "/min", "system": "http://unitsofmeasure.org", "code": "/min"}}

    def enc(pid, kind, start):
        return {"resourceType": "Encounter", "id": f"e{pid}{kind}", "status": "finished", "class": {"code": kind},
                "subject": {"reference": f"Patient/{pid}"}, "period": {"start": start}}

    lines = [{"resourceType": "Patient", "id": p, "birthDate": "1950-03-04"} for p in ("a", "b")] + [
        enc("a", "AMB", "2024-01-01T00:00:00Z"), enc("a", "IMP", "2024-01-03T12:00:00Z"),
        enc("b", "AMB", "2024-01-03T12:00:00Z"),                            # no inpatient stay: not in the cohort
        obs(1, "a", "2024-01-01T06:00:00Z", 60), obs(2, "a", "2024-01-03T10:00:00Z", 70),
        obs(3, "a", "2024-01-03T13:00:00Z", 150), obs(4, "b", "2024-01-03T10:00:00Z", 80)]
    (tmp_path / "x.ndjson").write_text("\n".join(json.dumps(r) for r in lines))
    ex = read_fhir(tmp_path / "x.ndjson", dictionary=d, site="s", label_code=None, age="age",
                   index=FhirIndex(encounter_classes=("IMP",), lookback_hours=24.0))
    t = ex.ingest(d)
    assert t.patient_ids == ("a",) and sorted(t.value.tolist()) == [70.0, pytest.approx(73.83, abs=0.01)]
    assert ex.report.excluded["after the index time"] == 1 and ex.report.excluded["before the lookback"] == 1
    assert ex.report.excluded["patients without an index Encounter"] == 1
    lines[3] = {k: v for k, v in lines[3].items() if k != "status"}  # the index Encounter: R4 requires a status
    (tmp_path / "x.ndjson").write_text("\n".join(json.dumps(r) for r in lines))
    with pytest.raises(SchemaError, match=r"Encounter at x.ndjson line 4 does not validate \(fields: .*status"):
        read_fhir(tmp_path / "x.ndjson", dictionary=d, site="s", label_code=None, validate="full",
                  index=FhirIndex(encounter_classes=("IMP",), lookback_hours=24.0))
