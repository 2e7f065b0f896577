"""The shared ontology: feature dictionary, site schemas, units."""

from .dictionary import Feature, FeatureDictionary, FeatureKind
from .schema import ColumnMap, SiteSchema

__all__ = ["ColumnMap", "Feature", "FeatureDictionary", "FeatureKind", "SiteSchema"]
