"""Per-feature transforms (log / log1p / logit) declared in the dictionary, applied before scaling."""

import math

import numpy as np
import pandas as pd
import pytest
from clinograph.sdk.datasets.alarm import load_dictionary
from clinograph.sdk.ingest import ingest
from clinograph.sdk.ontology import Feature, FeatureDictionary, FeatureKind, SiteSchema
from clinograph.sdk.ontology.dictionary import Transform

from clinograph.core.errors import ConfigError, SchemaError


def _dictionary() -> FeatureDictionary:
    return FeatureDictionary(name="t", version=1, features=(
        Feature(id="crp", name="CRP", kind=FeatureKind.NUMERIC, unit="mg/L", reference_low=1, reference_high=10,
                transform="log", physical_min=0),
        Feature(id="lactate", name="Lactate", kind=FeatureKind.NUMERIC, unit="mmol/L", reference_low=0.5,
                reference_high=2.0, transform="log1p"),
        Feature(id="spo2", name="SpO2", kind=FeatureKind.NUMERIC, reference_low=0.9, reference_high=0.99,
                transform="logit", physical_min=0, physical_max=1),
        Feature(id="hr", name="HR", kind=FeatureKind.NUMERIC, reference_low=60, reference_high=100)))


def test_log_transform_maps_the_transformed_reference_range_to_unit_interval():
    crp = _dictionary().get("crp")
    assert crp.standardise(1.0) == pytest.approx(-1.0)
    assert crp.standardise(10.0) == pytest.approx(1.0)
    assert crp.standardise(math.sqrt(10.0)) == pytest.approx(0.0)  # geometric midpoint
    spo2 = _dictionary().get("spo2")
    assert spo2.standardise(0.9) == pytest.approx(-1.0) and spo2.standardise(0.99) == pytest.approx(1.0)
    assert _dictionary().get("lactate").standardise(2.0) == pytest.approx(1.0)


def test_scale_statistics_replace_the_reference_range_when_set():
    f = _dictionary().get("crp").model_copy(update={"scale_center": 0.0, "scale_half_width": 2.0})
    assert f.standardise(math.e ** 2) == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="both scale_center and scale_half_width"):
        Feature(id="x", name="X", kind=FeatureKind.NUMERIC, reference_low=1, reference_high=2, scale_center=1.0)


def test_transform_needs_a_reference_range_inside_its_domain():
    with pytest.raises(ConfigError, match="transform = 'log' needs values > 0"):
        Feature(id="crp", name="CRP", kind=FeatureKind.NUMERIC, reference_low=0, reference_high=5, transform="log")
    with pytest.raises(ConfigError, match="numeric features only"):
        Feature(id="sex", name="Sex", kind=FeatureKind.BINARY, transform="log")


def test_digest_of_a_dictionary_without_transforms_is_unchanged():
    import hashlib
    import json

    d = load_dictionary()
    dump = d.model_dump(mode="json")  # the rule before transforms existed: new fields absent
    for f in dump["features"]:
        for key in ("omop_concept_id", "molar_mass", "valence"):
            if f.get(key) is None:
                f.pop(key, None)
        for key in ("transform", "scale_center", "scale_half_width"):
            f.pop(key)
    old = hashlib.sha256(json.dumps(dump, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert d.digest() == old
    logged = d.model_copy(update={"features": (d.features[0].model_copy(update={"transform": Transform.LOG}),
                                               *d.features[1:])})
    assert logged.digest() != old


def test_values_outside_the_domain_are_one_error_naming_every_column_and_row():
    df = pd.DataFrame({"pid": [f"p{i}" for i in range(6)], "y": [0, 1, 0, 1, 0, 1],
                       "crp": [2.0, 0.0, 5.0, 0.0, 3.0, 4.0],            # log of 0: rows 2 and 4
                       "spo2": [0.95, 0.97, 1.0, 0.93, 0.96, 0.0],       # logit of 1 and 0: rows 3 and 6
                       "hr": [70, 80, 90, 100, 60, 75]})
    with pytest.raises(SchemaError) as err:
        ingest(df, schema=SiteSchema(site="h1", patient_id="pid", label="y"), dictionary=_dictionary())
    text = str(err.value)
    assert "Column 'crp' (crp): rows 2, 4: outside the domain of transform = 'log'" in text
    assert "Column 'spo2' (spo2): rows 3, 6: outside the domain of transform = 'logit'" in text
    assert "0.0" not in text.replace("0.99", "")  # no cell values in the message


def test_ingested_values_are_transformed_before_scaling():
    df = pd.DataFrame({"pid": ["a", "b", "c"], "y": [0, 1, 0], "crp": [1.0, 10.0, 100.0], "hr": [60, 80, 100]})
    t = ingest(df, schema=SiteSchema(site="h1", patient_id="pid", label="y"), dictionary=_dictionary())
    dense, observed = t.dense()
    col = t.dictionary.node_index()["crp"]
    np.testing.assert_allclose(dense[:, col], [-1.0, 1.0, 3.0])
    assert np.isfinite(dense[observed]).all()
