import numpy as np
import torch
from clinograph.sdk.graph import (
    HAS_FEATURE,
    OF_PATIENT,
    SIMILAR_TO,
    build_graph,
    build_snapshots,
    knn_similarity,
    star_batch,
)
from sdk_helpers import small_tables
from sklearn.neighbors import NearestNeighbors


def test_typed_graph_has_the_ontology_relations():
    t = small_tables()[0]
    g = build_graph(t, k_similar=4)
    assert set(g.node_types) == {"patient", "feature"}
    assert set(g.edge_types) == {HAS_FEATURE, OF_PATIENT, SIMILAR_TO}
    assert g["patient"].num_nodes == t.n_patients
    # feature nodes carry dictionary indices, so every hospital indexes the embedding table alike
    assert torch.equal(g["feature"].feature_index, torch.as_tensor(t.observed_nodes()))
    assert g[HAS_FEATURE].edge_index.shape[1] == t.patient.size
    assert torch.equal(g[OF_PATIENT].edge_index, g[HAS_FEATURE].edge_index.flip(0))
    assert torch.allclose(g[HAS_FEATURE].edge_weight, torch.tensor(t.std_value, dtype=torch.float32))
    ei = g[SIMILAR_TO].edge_index
    assert (torch.bincount(ei[1], minlength=t.n_patients) == 4).all()
    assert not (ei[0] == ei[1]).any()


def test_knn_matches_sklearn_on_fully_observed_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 6))
    ei, w = knn_similarity(x, np.ones_like(x, dtype=bool), k=3)
    nn_ = NearestNeighbors(n_neighbors=4).fit(x)
    _, idx = nn_.kneighbors(x)
    for p in range(50):
        mine = set(ei[0][ei[1] == p].tolist())
        assert mine == set(idx[p, 1:].tolist())
    assert ((w > 0) & (w <= 1)).all()


def test_knn_in_row_blocks_equals_a_pairwise_loop_with_missing_values():
    """Masked distances (mean squared difference over co-observed features) from a plain loop;
    the blocked ranking must give the same neighbours and weights at any block size."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(37, 5))
    obs = rng.random((37, 5)) < 0.6
    obs[5] = False
    obs[5, 0] = True  # shares only feature 0 with some patients
    ref = {}
    for p in range(37):
        d = []
        for q in range(37):
            both = obs[p] & obs[q]
            if q != p and both.any():
                d.append((float(np.mean((x[p, both] - x[q, both]) ** 2)), q))
        ref[p] = sorted(d)[:4]
    for block in (8 * 4 * 37, 8 * 4 * 37 * 5, 1 << 27):  # 1 row, 5 rows, everything at once
        ei, w = knn_similarity(x, obs, k=4, block_bytes=block)
        for p in range(37):
            got = sorted(zip((1 / w[ei[1] == p] - 1).tolist(), ei[0][ei[1] == p].tolist(), strict=True))
            assert [q for _, q in got] == [q for _, q in ref[p]], (block, p)
            assert np.allclose([d for d, _ in got], [d for d, _ in ref[p]], atol=1e-5)


def test_patients_sharing_no_feature_are_never_neighbours():
    x = np.array([[1.0, np.nan], [np.nan, 2.0], [1.1, np.nan]])
    ei, _ = knn_similarity(np.nan_to_num(x), ~np.isnan(x), k=2)
    pairs = set(zip(ei[0].tolist(), ei[1].tolist(), strict=True))
    assert (1, 0) not in pairs and (0, 1) not in pairs and (2, 0) in pairs


def test_wide_table_is_one_snapshot_and_star_batch_matches_table():
    t = small_tables()[2]
    assert len(build_snapshots(t, k_similar=0)) == 1
    sb = star_batch(t, k_similar=3)
    assert int(sb.mask.sum()) == t.patient.size
    assert sb.neighbours.shape == (t.n_patients, 3)
