"""A small feature dictionary and schema builders for the ingestion tests."""

from __future__ import annotations

from clinograph.sdk.ontology import ColumnMap, Feature, FeatureDictionary, FeatureKind, SiteSchema

CANARY = "ZQXCANARY"

D = FeatureDictionary(name="mini", version=1, features=(
    Feature(id="heart_rate", name="Heart rate", kind=FeatureKind.NUMERIC, unit="/min", aliases=("hr", "pulse"),
            reference_low=60, reference_high=100, physical_min=0, physical_max=350),
    Feature(id="paco2", name="PaCO2", kind=FeatureKind.NUMERIC, unit="mmHg", reference_low=35, reference_high=45,
            physical_min=0, physical_max=300),
    Feature(id="crp", name="C-reactive protein", kind=FeatureKind.NUMERIC, unit="mg/L", reference_low=0,
            reference_high=5),
    Feature(id="sex", name="Sex", kind=FeatureKind.BINARY),
    Feature(id="ward", name="Ward", kind=FeatureKind.CATEGORICAL, levels=("icu", "general", "3")),
))


def wide(**kw) -> SiteSchema:
    base = dict(site="h1", patient_id="pid", label="y")
    base.update(kw)
    return SiteSchema(**base)


def long(**kw) -> SiteSchema:
    base = dict(site="h1", format="long", label="y", long={"patient": "pid", "time": "t", "feature": "code",
                                                           "value": "v", "unit": "unit"})
    base.update(kw)
    return SiteSchema(**base)


__all__ = ["CANARY", "ColumnMap", "D", "long", "wide"]
