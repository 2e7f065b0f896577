"""Time-to-event labels on ingestion (site schema [survival]): time units converted to days,
event codes, and clear errors for negative, missing or non-numeric times, events that are not
0/1, and a hospital at which every patient is censored."""

import numpy as np
import pandas as pd
import pytest
from clinograph.sdk.ingest import ingest
from clinograph.sdk.ontology.dictionary import Feature, FeatureDictionary
from clinograph.sdk.ontology.schema import SiteSchema, SurvivalColumns

from clinograph.core.errors import SchemaError

D = FeatureDictionary(name="surv-test", version=1, features=(
    Feature(id="age", name="Age", kind="numeric", unit="years", reference_low=40, reference_high=80),))


def table(**over):
    df = pd.DataFrame({"pid": ["a", "b", "c", "d"], "age": [50.0, 60, 70, 80], "fu": [1.0, 2.0, 0.5, 3.0],
                       "dead": ["yes", "no", "yes", "no"]})
    return df.assign(**over)


def schema(**kw):
    surv = {"time": "fu", "event": "dead", "time_unit": "mo", "event_codes": {"yes": 1, "no": 0}, **kw}
    return SiteSchema(site="h1", patient_id="pid", label=None, survival=SurvivalColumns(**surv))


def test_months_become_days_and_the_event_is_the_label():
    t = ingest(table(), schema=schema(), dictionary=D)
    np.testing.assert_allclose(t.survival.time, [30.4375, 60.875, 15.21875, 91.3125])
    np.testing.assert_array_equal(t.survival.event, [1, 0, 1, 0])
    np.testing.assert_array_equal(t.labels, [1, 0, 1, 0])
    assert t.subset(np.array([3, 0])).survival.time.tolist() == pytest.approx([91.3125, 30.4375])
    assert "fu" not in t.report.ignored_columns and "SurvivalTarget(patients=4, events=2)" == repr(t.survival)


def test_toml_style_schema_and_plain_01_events():
    s = SiteSchema.model_validate({"site": "h2", "patient_id": "pid",
                                   "survival": {"time": "fu", "event": "dead", "time_unit": "a"}})
    t = ingest(table(dead=[1, 0, 0, 1]), schema=s, dictionary=D)
    assert t.survival.time[0] == pytest.approx(365.25)


@pytest.mark.parametrize(("over", "match"), [
    ({"fu": [1.0, -2.0, 0.5, 3.0]}, "row 2: negative follow-up time"),
    ({"fu": [1.0, None, 0.5, 3.0]}, "row 2: no follow-up time"),
    ({"fu": [1.0, "soon", 0.5, 3.0]}, "row 2: not a number"),
    ({"dead": ["yes", "no", "maybe", "no"]}, "row 3: not 0/1"),
    ({"dead": ["no", "no", "no", "no"]}, "every one of the 4 patients is censored"),
    # before: accepted, 1e308 months became an infinite follow-up time
    ({"fu": [1.0, 1e308, 1900.0, 3.0]}, r"rows 2, 3: follow-up longer than 150 years once converted from 'mo'"),
])
def test_bad_time_or_event_is_refused_clearly(over, match):
    with pytest.raises(SchemaError, match=match):
        ingest(table(**over), schema=schema(), dictionary=D)


def test_missing_columns_and_bad_unit_are_named():
    with pytest.raises(SchemaError, match="Time column 'followup' is not in the table"):
        ingest(table(), schema=schema(time="followup"), dictionary=D)
    with pytest.raises(SchemaError, match="time_unit 'parsecs'"):
        ingest(table(), schema=schema(time_unit="parsecs"), dictionary=D)


def test_missing_time_can_be_dropped_by_policy():
    s = SiteSchema.model_validate({**schema().model_dump(), "policy": {"missing_label": "drop"}})
    t = ingest(table(fu=[1.0, None, 0.5, 3.0]), schema=s, dictionary=D)
    assert t.n_patients == 3 and t.report.dropped_patients_missing_label == 1
    np.testing.assert_array_equal(t.survival.event, [1, 1, 0])


def test_survival_input_without_a_survival_section_is_a_schema_error():
    from clinograph.sdk.ingest.survival import survival_input

    plain = SiteSchema(site="h1", patient_id="pid", label="dead")
    with pytest.raises(SchemaError, match=r"no \[survival\] section"):
        survival_input(table(), schema=plain)


def test_a_point_grouped_follow_up_time_in_a_decimal_comma_file_is_refused(tmp_path):
    # before: '1.150' days (German Excel's 1150) in a decimal-comma file was read as 1.15 days, silently
    from clinograph.sdk.ingest import read_table

    (tmp_path / "t.csv").write_text("pid;age;fu;dead\na;50;1.150;yes\nb;60;25,5;no\nc;70;2,5;yes\n")
    with pytest.raises(SchemaError, match=r"Time column 'fu': row 1: numbers with a point that reads both as a "
                                          r"thousands separator"):
        ingest(read_table(tmp_path / "t.csv"), schema=schema(time_unit="d"), dictionary=D)
