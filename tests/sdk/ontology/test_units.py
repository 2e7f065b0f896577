import pytest
from clinograph.sdk.ontology.dictionary import Feature, FeatureDictionary
from clinograph.sdk.ontology.units import (
    conversion,
    is_known_unit,
    normalise_unit,
    same_unit,
    ucum_to_pint,
)

from clinograph.core.errors import UnitError


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


@pytest.mark.parametrize(("src", "dst", "value", "expected"), [
    ("[degF]", "Cel", 98.6, 37.0),          # UCUM temperature atoms
    ("Cel", "degC", 37.0, 37.0),
    ("mm[Hg]", "kPa", 40.0, 5.333),
    ("cm[H2O]", "mm[Hg]", 10.0, 7.356),
    ("10*3/uL", "/uL", 4.5, 4500.0),        # powers of ten
    ("10^9/L", "10*3/uL", 4.5, 4.5),
    ("cells/mm3", "cells/uL", 250.0, 250.0),
    ("{cells}/uL", "cells/mm3", 250.0, 250.0),  # annotations are dimensionless
    ("mm", "cm", 25.0, 2.5),
    ("mg/L", "mg/dL", 50.0, 5.0),
    ("mo", "a", 18.0, 1.5),                 # months <-> years
    ("/min", "{beats}/min", 72.0, 72.0),
    ("%", "1", 45.0, 0.45),
    ("m2", "cm2", 1.0, 1e4),                # exponents
    ("mL/min/kg", "L/h/kg", 1.0, 0.06),
    ("dyn.s/cm5", "dyn.s.cm-5", 1000.0, 1000.0),
])
def test_ucum_strings_convert_through_pint(src, dst, value, expected):
    scale, offset = conversion(feature="f", analyte=None, source=src, target=dst)
    assert value * scale + offset == pytest.approx(expected, rel=1e-3)


def test_ucum_syntax_translation_is_syntax_only():
    assert ucum_to_pint("10*3/uL") == "(10**3)/uL"
    assert ucum_to_pint("/min") == "1/min"
    assert ucum_to_pint("cm3") == "cm**3"
    assert ucum_to_pint("s-1") == "s**-1"
    assert ucum_to_pint("mm[Hg]") == "mmHg"
    assert ucum_to_pint("kg.m-2") == "kg*m**-2"
    assert ucum_to_pint("{cells}/uL") == "1/uL"


def test_same_unit_sees_through_spellings():
    assert same_unit("cells/mm3", "cells/µL")
    assert same_unit("mg/dl", "mg/dL")
    assert same_unit("10*3/uL", "10^3/uL")
    assert not same_unit("mg/L", "mg/dL")
    assert is_known_unit("mmol/L") and not is_known_unit("not a unit")


def test_unit_spellings_are_normalised():
    assert normalise_unit("MG/DL") == "mg/dL"
    assert normalise_unit("°F") == "degF"
    assert normalise_unit("µmol/L") == "umol/L"
    # exports in capitals and the ordinal sign typed for the degree sign (before: unknown units)
    assert [normalise_unit(u) for u in ("KG", "Kg", "CM", "KCAL", "LBS", "ºF", "ºC", "y")] == \
        ["kg", "kg", "cm", "kcal", "lb", "degF", "degC", "a"]
    assert conversion(feature="w", analyte=None, source="LBS", target="kg")[0] == pytest.approx(0.45359237)


def test_mass_to_molar_needs_a_molar_mass():
    with pytest.raises(UnitError, match=r"Feature 'mystery'.*mass and the other a molar.*set `molar_mass`"):
        conversion(feature="mystery", analyte=None, source="mg/dL", target="mmol/L")


def test_molar_mass_from_the_dictionary_wins():
    feat = Feature(id="lactate", name="Lactate", kind="numeric", unit="mmol/L", molar_mass=90.08,
                   reference_low=0.5, reference_high=2.2)
    scale, _ = conversion(feature=feat.id, analyte=None, source="mg/dL", target=feat.unit,
                          molar_mass=feat.molar_mass)
    assert 90.08 * scale == pytest.approx(10.0)


def test_equivalents_convert_to_moles_by_the_ions_valence():
    # before: 'mEq/L' (US labs' electrolytes) was not a known unit, and 'meq/L' did not convert to mmol/L
    assert conversion(feature="na", analyte="Sodium", source="mEq/L", target="mmol/L") == (1.0, 0.0)
    assert conversion(feature="ca", analyte="calcium", source="mEq/L", target="mmol/L") == (0.5, 0.0)
    assert conversion(feature="ca", analyte="calcium", source="meq/L", target="mg/dL")[0] == pytest.approx(2.0039)
    assert conversion(feature="mg", analyte=None, source="mmol/L", target="meq/L", valence=2) == (2.0, 0.0)
    with pytest.raises(UnitError, match=r"Feature 'x'.*counts equivalents and the other moles.*set `valence`"):
        conversion(feature="x", analyte="glucose", source="mEq/L", target="mmol/L")
    feat = Feature(id="k", name="K", kind="numeric", unit="mmol/L", valence=1, reference_low=3.5, reference_high=5.0)
    assert conversion(feature=feat.id, analyte=None, source="mEq/L", target=feat.unit, valence=feat.valence)[0] == 1.0


def test_new_dictionary_fields_do_not_change_old_digests():
    base = dict(id="hr", name="HR", kind="numeric", unit="/min", reference_low=60, reference_high=100)
    d0 = FeatureDictionary(name="d", version=1, features=(Feature(**base),))
    d1 = FeatureDictionary(name="d", version=1, features=(Feature(**base, omop_concept_id=3027018),))
    assert d0.digest() != d1.digest()
    assert d0.digest() == FeatureDictionary.model_validate(d0.model_dump()).digest()
    assert d1.by_code() == {"OMOP/3027018": d1.features[0]}


def test_a_code_belongs_to_one_feature():
    f = dict(kind="numeric", unit="/min", reference_low=60, reference_high=100, codes={"loinc": "8867-4"})
    with pytest.raises(ValueError, match=r"LOINC/8867-4 -> a, b"):
        FeatureDictionary(name="d", version=1, features=(Feature(id="a", name="A", **f), Feature(id="b", name="B", **f)))


def test_unknown_unit_names_the_feature_and_the_fix():
    with pytest.raises(UnitError, match=r"Feature 'heart_rate': cannot convert unit 'furlongs'.*canonical unit '/min'"):
        conversion(feature="heart_rate", analyte=None, source="furlongs", target="/min")
    with pytest.raises(UnitError, match=r"cannot convert unit 'qwerty'.*not a unit pint reads.*Write it in UCUM"):
        conversion(feature="heart_rate", analyte=None, source="qwerty", target="/min")
    with pytest.raises(UnitError, match=r"UCUM special unit '\[pH\]' has no conversion here"):
        conversion(feature="ph", analyte=None, source="[pH]", target="1")


@pytest.mark.parametrize(("src", "dst"), [("mg/dL", "degC"), ("degC", "mg/dL"), ("degF", "mmol/L"), ("Cel", "/min")])
def test_offset_unit_against_another_kind_is_a_unit_error_not_a_pint_crash(src, dst):
    # pint refuses to divide a quantity by degC (OffsetUnitCalculusError); that used to escape as a traceback
    with pytest.raises(UnitError, match="Use a unit of the same kind"):
        conversion(feature="t", analyte=None, source=src, target=dst)


def test_lab_count_spellings_read_as_thousands_not_kelvin():
    """'K/uL' (MIMIC's valueuom, OMOP unit_source_value) was read by pint as kelvin per microliter:
    a white-cell count in it was refused as a temperature per volume. K/M are thousand/million."""
    assert same_unit("K/uL", "10*3/uL") and same_unit("M/uL", "10*6/uL") and same_unit("x10^9/L", "10*9/L")
    assert conversion(feature="wbc", analyte=None, source="K/uL", target="10*9/L") == pytest.approx((1.0, 0.0))
    assert conversion(feature="rbc", analyte=None, source="x10e12/L", target="10*6/uL") == pytest.approx((1.0, 0.0))


@pytest.mark.parametrize("text", ["0-5", "see\nnote", "9**999", "x\n%"])
def test_text_that_is_no_unit_is_not_a_unit_rather_than_a_crash(text):
    # cells and column names reach is_known_unit (the units-row check, units named in headers): pint
    # divided by zero on a range, the UCUM term regex did not match a line break, a huge power overflowed
    assert not is_known_unit(text)
