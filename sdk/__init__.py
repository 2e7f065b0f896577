"""Everything that runs inside a hospital: ontology mapping, ingestion, graph building,
models, local training, DP, update packaging, explanations."""
