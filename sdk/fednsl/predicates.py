"""Symbolic predicates over the ontology, and their fuzzy truth values at one hospital.

The vocabulary is public: it is derived from the feature dictionary alone (its *public*
reference ranges, never local statistics), so every hospital and the server name the same
predicates in the same order:

- numeric feature ``f``: ``f_high``, ``f_low``, ``f_normal`` (against the public range),
  ``f_missing``;
- binary feature ``f``: ``f_present``, ``f_missing``;
- categorical level ``f=v``: ``f=v`` (the level's indicator).

The fuzzy value ``x(r) ∈ [0, 1]`` of a predicate for a patient is the weight of the typed edge
``(patient, has_feature, r)`` in the hospital's knowledge graph (FedNSL eq. 8's ``x(r_kj)``,
"a value within the range [0, 1]"). For a numeric value standardised so that the reference
range is ``[-1, 1]`` (:meth:`Feature.standardise`), ``x(high) = σ((z − 1)/τ)``,
``x(low) = σ((−1 − z)/τ)``, ``x(normal) = 1 − x(high) − x(low)``; a missing value has
``x(missing) = 1`` and 0 for the rest. ``τ`` (:data:`SOFTNESS`) is a preset: how many
half-widths of the range it takes to go from 27 % to 73 % "high".

Shapes:
    fuzzy_values(table) -> (n_patients, n_predicates), float64 in [0, 1]
"""

from __future__ import annotations

import numpy as np

from ..ingest.table import PatientTable
from ..ontology.dictionary import FeatureDictionary, FeatureKind

#: τ: softness of the high/low boundary, in half-widths of the public reference range.
SOFTNESS = 0.25


def predicate_names(dictionary: FeatureDictionary, *, missing: bool = True, normal: bool = True) -> tuple[str, ...]:
    """Every predicate of the vocabulary, in dictionary order (see the module docstring)."""
    out: list[str] = []
    for f in dictionary.features:
        if f.kind == FeatureKind.NUMERIC:
            out += [f"{f.id}_high", f"{f.id}_low"] + ([f"{f.id}_normal"] if normal else [])
        elif f.kind == FeatureKind.BINARY:
            out.append(f"{f.id}_present")
        else:
            out += f.node_ids()
        if missing:
            out.append(f"{f.id}_missing")
    return tuple(out)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -60, 60)))


def fuzzy_values(table: PatientTable, predicates: tuple[str, ...], *, softness: float = SOFTNESS) -> np.ndarray:
    """``x(patient, predicate)``: the has_feature edge weights of this hospital's graph.

    Uses the table's public-range standardised values (``PatientTable.dense``); a predicate of
    a feature the hospital does not collect is 0 (its ``_missing`` is 1).
    """
    dense, _ = table.dense()
    nodes = table.dictionary.node_index()
    cols: dict[str, np.ndarray] = {}
    for f in table.dictionary.features:
        if f.kind == FeatureKind.CATEGORICAL:
            vals = [dense[:, nodes[nid]] for nid in f.node_ids()]
            seen = ~np.all(np.isnan(np.stack(vals, 1)), axis=1)
            for nid, v in zip(f.node_ids(), vals, strict=True):
                cols[nid] = np.nan_to_num(v, nan=0.0).clip(0, 1)
        else:
            z = dense[:, nodes[f.id]]
            seen = ~np.isnan(z)
            zz = np.where(seen, z, 0.0)
            if f.kind == FeatureKind.NUMERIC:
                hi, lo = _sigmoid((zz - 1.0) / softness), _sigmoid((-1.0 - zz) / softness)
                cols[f"{f.id}_high"] = np.where(seen, hi, 0.0)
                cols[f"{f.id}_low"] = np.where(seen, lo, 0.0)
                cols[f"{f.id}_normal"] = np.where(seen, np.clip(1.0 - hi - lo, 0.0, 1.0), 0.0)
            else:
                cols[f"{f.id}_present"] = np.where(seen, (zz >= 0.5).astype(float), 0.0)
        cols[f"{f.id}_missing"] = (~seen).astype(float)
    unknown = [p for p in predicates if p.removeprefix("similar_to:") not in cols]
    if unknown:
        raise KeyError(f"Predicates {unknown[:3]} are not in the vocabulary of dictionary "
                       f"{table.dictionary.name} v{table.dictionary.version}; build the rule space with "
                       "predicate_names(dictionary).")
    return np.stack([cols[p.removeprefix("similar_to:")] for p in predicates], axis=1)
