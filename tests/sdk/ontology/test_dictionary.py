import pytest
from clinograph.sdk.datasets.alarm import load_dictionary
from clinograph.sdk.ontology import Feature, FeatureDictionary, FeatureKind

from clinograph.core.errors import ConfigError


def test_indices_are_fixed_and_hash_is_stable():
    d = load_dictionary()
    assert d.node_index()["heart_rate"] == 0
    assert d.digest() == load_dictionary().digest()
    changed = d.model_copy(update={"version": d.version + 1})
    assert changed.digest() != d.digest()


def test_standardisation_uses_the_public_reference_range():
    f = load_dictionary().get("heart_rate")
    assert f.standardise(60.0) == pytest.approx(-1.0)
    assert f.standardise(100.0) == pytest.approx(1.0)
    assert f.standardise(80.0) == pytest.approx(0.0)


def test_nearest_suggests_by_alias_and_name():
    d = load_dictionary()
    assert "heart_rate" in d.nearest("hart rate")
    assert "paco2" in d.nearest("artco2")
    with pytest.raises(KeyError, match=r"nearest: \["):
        d.get("sodium")


def test_categorical_features_expand_to_level_nodes():
    d = FeatureDictionary(name="t", version=1, features=(
        Feature(id="sex", name="Sex", kind=FeatureKind.CATEGORICAL, levels=("f", "m")),
        Feature(id="hr", name="HR", kind=FeatureKind.NUMERIC, reference_low=60, reference_high=100)))
    assert d.node_ids() == ["sex=f", "sex=m", "hr"]


def test_numeric_feature_without_reference_range_is_refused():
    with pytest.raises(ConfigError, match="reference_low and reference_high"):
        Feature(id="na", name="Sodium", kind=FeatureKind.NUMERIC)


def test_bad_dictionary_file_names_the_key(tmp_path):
    p = tmp_path / "d.toml"
    p.write_text('name = "x"\nversion = 1\n[[features]]\nid = "hr"\nname = "HR"\nkind = "numeric"\ncolour = "red"\n')
    with pytest.raises(ConfigError, match=r"features\.0\.colour"):
        FeatureDictionary.from_toml(p)


def test_schema_check_uses_the_dictionarys_molar_mass():
    """A mass unit onto a molar canonical unit converts when the dictionary gives the molar mass."""
    from clinograph.sdk.ontology import ColumnMap, SiteSchema

    d = FeatureDictionary(name="t", version=1, features=(
        Feature(id="lac", name="Lactate", kind=FeatureKind.NUMERIC, unit="mmol/L", molar_mass=90.08,
                reference_low=0.5, reference_high=2.0),))
    SiteSchema(site="s", patient_id="pid", label="y", columns={"Lac": ColumnMap(feature="lac", unit="mg/dL")}
               ).check_against(d)  # raises a SchemaError without the molar mass


def _one_feature_dictionary(tmp_path, **kw):
    lines = ['name = "d"', "version = 1", "[[features]]", 'id = "hr"', 'name = "HR"', 'kind = "numeric"',
             *(f"{k} = {v!r}".replace("'", '"') for k, v in {"unit": "/min", "reference_low": 60.0,
                                                             "reference_high": 100.0, **kw}.items())]
    p = tmp_path / "d.toml"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize(("kw", "message"), [
    ({"unit": "blorp"}, "feature 'hr': unit 'blorp' is not a unit pint reads; write it in UCUM"),
    ({"physical_min": 0.0, "physical_max": 50.0},
     "feature 'hr': the reference range 60 to 100 is not inside the physical limits 0 to 50; fix one of them"),
    ({"reference_low": 100.0, "reference_high": 60.0}, "feature 'hr': reference_low must be < reference_high"),
])
def test_a_bad_feature_is_one_problem_with_its_fix(tmp_path, kw, message):
    # before: an unreadable canonical unit and a reference range outside the physical limits were accepted,
    # and any bad only feature added a second "Tuple should have at least 1 item" problem
    with pytest.raises(ConfigError) as err:
        FeatureDictionary.from_toml(_one_feature_dictionary(tmp_path, **kw))
    assert f"(1 problem(s)):\n  - features.0: {message}" in str(err.value)


def test_every_problem_of_a_feature_is_named_at_once(tmp_path):
    # before: a feature's first problem only (fix the range, reload, then learn that the unit is unreadable)
    with pytest.raises(ConfigError) as err:
        FeatureDictionary.from_toml(_one_feature_dictionary(tmp_path, unit="blorp", reference_low=80.0,
                                                            reference_high=40.0, physical_min=5.0, physical_max=1.0))
    text = str(err.value)
    for problem in ("reference_low must be < reference_high", "physical_min must be < physical_max",
                    "unit 'blorp' is not a unit pint reads"):
        assert problem in text


def test_levels_that_cannot_name_a_model_row_are_refused_with_a_name_that_can():
    # CHILD's oxygen bands '<5', '5-12', '12+' and X-ray 'Asy/Patchy': before, the dictionary loaded
    # and `clinograph check` passed, then the federation failed building the model ("invalid
    # settings: name: String should match pattern ..."), naming neither the feature nor the level
    from clinograph.core.spec import ModuleKind, ModuleSpec

    with pytest.raises(ConfigError) as err:
        Feature(id="o2", name="O2 band", kind=FeatureKind.CATEGORICAL, levels=("<5", "5-12", "12+", "Asy/Patchy"))
    text = str(err.value)
    assert "feature 'o2': levels ['<5', 'Asy/Patchy']" in text and "'lt5', 'Asy_Patchy'" in text
    ok = Feature(id="o2", name="O2 band", kind=FeatureKind.CATEGORICAL, levels=("lt5", "5-12", "12+", "I.a", "x_y"))
    for nid in ok.node_ids():  # every accepted level names its embedding row
        ModuleSpec(name=f"feature_embedding/{nid}", shape=(1,), kind=ModuleKind.SHARED)
