"""The NS-FL graph encoder (patient embedding h_p^(2)) drives the F-CMs concept modules."""

from clinograph.sdk.concepts.encoders import EmbeddingAdapter
from clinograph.sdk.concepts.graph import ConceptGraph
from clinograph.sdk.concepts.model import ConceptModel, fcm_loss
from clinograph.sdk.graph import star_batch
from clinograph.sdk.model import NSFLConfig, NSFLModel
from sdk_helpers import small_tables


def test_nsfl_embedding_feeds_a_concept_model_and_trains_end_to_end():
    t = small_tables()[0]
    sb = star_batch(t)
    nsfl = NSFLModel(len(t.dictionary.node_ids()), NSFLConfig(hidden=8))
    enc = EmbeddingAdapter(nsfl, 8, embed=lambda m, b: m.embed_star(*b))
    g = ConceptGraph.from_edges(nodes=["hypoxia", "shunt"], edges=[("hypoxia", "shunt")], task="shunt",
                                cards={"hypoxia": 2, "shunt": 2})
    model = ConceptModel(kind="cgm", encoder=enc, graph=g, z_dim=8)
    batch = (sb.feature_index[:32], sb.values[:32], sb.mask[:32])
    out = model(batch)
    assert {k: tuple(v.shape) for k, v in out.logits.items()} == {"hypoxia": (32, 2), "shunt": (32, 2)}
    labels = {"shunt": sb.labels[:32].long(), "hypoxia": (sb.values[:32, 0] > 0).long()}
    loss = fcm_loss(out, labels, supervised={"hypoxia", "shunt"}, has_task=True, task="shunt")
    loss.backward()
    assert nsfl.embedding.weight.grad is not None and nsfl.embedding.weight.grad.abs().sum() > 0
    assert nsfl.head.weight.grad is None  # the NS-FL task head is bypassed; concepts decide
