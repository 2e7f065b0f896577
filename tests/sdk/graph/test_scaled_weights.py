"""The graph's value-weighted edges carry the dictionary's scaling: transform, then centre/half-width."""

import numpy as np
import pandas as pd
import torch
from clinograph.sdk.federation.scaling import rescale
from clinograph.sdk.graph import OF_PATIENT, build_graph
from clinograph.sdk.ingest import ingest
from clinograph.sdk.ontology import Feature, FeatureDictionary, FeatureKind, SiteSchema

D = FeatureDictionary(name="g", version=1, features=(
    Feature(id="crp", name="CRP", kind=FeatureKind.NUMERIC, reference_low=1, reference_high=100, transform="log"),
    Feature(id="hr", name="HR", kind=FeatureKind.NUMERIC, reference_low=60, reference_high=100)))


def _table():
    df = pd.DataFrame({"pid": ["a", "b", "c"], "y": [0, 1, 0], "crp": [1.0, 10.0, 100.0], "hr": [60.0, 80.0, 120.0]})
    return ingest(df, schema=SiteSchema(site="h1", patient_id="pid", label="y"), dictionary=D)


def test_edge_weights_are_log_scaled_values():
    g = build_graph(_table(), k_similar=0)
    w = g[OF_PATIENT].edge_weight
    crp = g["feature"].feature_index[g[OF_PATIENT].edge_index[0]] == D.node_index()["crp"]
    torch.testing.assert_close(w[crp], torch.tensor([-1.0, 0.0, 1.0]))  # log10 spacing, range 1-100
    torch.testing.assert_close(w[~crp], torch.tensor([-1.0, 0.0, 2.0]))


def test_rescaled_table_builds_edges_with_the_derived_statistics():
    t = _table()
    derived = FeatureDictionary.model_validate({**D.model_dump(), "features": [
        {**D.features[0].model_dump(), "scale_center": 0.0, "scale_half_width": float(np.log(100.0))},
        D.features[1].model_dump()]})
    g = build_graph(rescale(t, derived), k_similar=0)
    crp = g["feature"].feature_index[g[OF_PATIENT].edge_index[0]] == D.node_index()["crp"]
    torch.testing.assert_close(g[OF_PATIENT].edge_weight[crp], torch.tensor([0.0, 0.5, 1.0]))
    np.testing.assert_array_equal(rescale(t, derived).value, t.value)  # canonical values untouched
