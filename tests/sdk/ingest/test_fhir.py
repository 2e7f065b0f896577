"""FHIR R4 (fhir.resources R4B models): bundles and NDJSON, LOINC codes and UCUM units, labels, errors."""

from __future__ import annotations

import json

import pytest
from clinograph.sdk.ingest.fhir import read_fhir
from clinograph.sdk.research.ehr_demo import LABEL_CODE, fhir_resources, write_fhir
from clinograph.secure.errors import ConfigError, SchemaError
from ehr_helpers import D, assert_same, demo_hospitals

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
    assert any("other resources skipped: 1" in n for n in ex.report.notes)


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
