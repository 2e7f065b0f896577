import pytest
from clinograph.sdk.ontology.units import conversion, normalise_unit
from clinograph.secure.errors import UnitError


@pytest.mark.parametrize(("analyte", "src", "dst", "value", "expected"), [
    ("glucose", "mg/dL", "mmol/L", 180.156, 10.0),
    ("glucose", "mmol/L", "mg/dL", 5.0, 90.078),
    ("creatinine", "mg/dL", "umol/L", 1.0, 88.42),
    ("urea", "mg/dL", "mmol/L", 60.06, 10.0),
    (None, "degF", "degC", 98.6, 37.0),
    (None, "degC", "degF", 37.0, 98.6),
    (None, "kPa", "mmHg", 5.3, 39.753),
    (None, "mmHg", "kPa", 40.0, 5.333),
    (None, "g/dL", "g/L", 14.0, 140.0),
    (None, "g/L", "g/dL", 140.0, 14.0),
])
def test_known_conversions(analyte, src, dst, value, expected):
    scale, offset = conversion(feature="f", analyte=analyte, source=src, target=dst)
    assert value * scale + offset == pytest.approx(expected, rel=1e-3)


def test_unit_spellings_are_normalised():
    assert normalise_unit("MG/DL") == "mg/dL"
    assert normalise_unit("°F") == "degF"
    assert normalise_unit("µmol/L") == "umol/L"


def test_mass_to_molar_needs_an_analyte():
    with pytest.raises(UnitError, match="need the analyte"):
        conversion(feature="mystery", analyte=None, source="mg/dL", target="mmol/L")


def test_unknown_unit_names_the_feature_and_the_fix():
    with pytest.raises(UnitError, match=r"Feature 'heart_rate': cannot convert unit 'furlongs'.*canonical unit '/min'"):
        conversion(feature="heart_rate", analyte=None, source="furlongs", target="/min")
