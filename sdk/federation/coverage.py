"""``[model] features = "shared"``: the features every hospital observes, found without revealing
which hospital observes what.

Why: a model over the *union* of the hospitals' features learns each weight where the feature
is present; at a hospital that lacks a block of features (no lipid panel, no blood gases) the
weights of the features it has were fitted beside the missing ones, so its risks are off. A
model over the features every hospital has -- what FedAvg on "manually aligned features" does
(NS-FL paper, Section 5) -- avoids that at the price of the unshared features. Which is better
depends on the table, so the SDK offers both as candidates and lets the federated validation
loss choose (:mod:`.candidates`); measured in docs/model_quality.md ("Issue 15, session 9").

How: one set-up sum of the run (:mod:`clinograph.secure.runtime.setup`; the hospital's share:
:mod:`.setup`) over each hospital's coverage vector
(``v_k[f] = 1`` if hospital k observes feature f in any patient, its F_k of Theorem 1, else 0):
the server and every hospital learn ``Σ_k v_k[f]``, *how many* hospitals observe each feature,
never which ones. The shared set is ``{f : Σ_k v_k[f] = K}`` (K contributors). Every hospital
derives it and returns it signed; the server checks they agree and records a
``feature_coverage`` entry with those counts and the resolved list. Each hospital builds its
``"shared"`` candidates on the list (the model's shapes do not depend on it, so ``clinograph
model init`` writes them from the config as it is). The same in ``simulate()`` and over Flower.

Under local DP each hospital's ``v_k`` is a noisy threshold of its patients' clipped coverage
counts, accounted in its ledger (:mod:`clinograph.sdk.privacy.counts`): exact, a feature observed
in one patient would make ``v_k`` depend on that patient. Refused under distributed DP and under
CKKS (the audited result would reveal the sum CKKS hides).
"""

from __future__ import annotations

import numpy as np

from clinograph.core.errors import ConfigError

from ..ingest.table import PatientTable
from ..ontology.dictionary import FeatureDictionary
from .securesum import SECURE_SUM_MODES

#: the shared module that carries the coverage vectors through the secure mode
COVERAGE_MODULE = "coverage/features"


def local_coverage(table: PatientTable) -> np.ndarray:
    """1 for every dictionary feature node this hospital observes, else 0 (stays at the hospital)."""
    out = np.zeros(len(table.dictionary.node_ids()))
    out[table.observed_nodes()] = 1.0
    return out


def clipped_coverage(table: PatientTable) -> np.ndarray:
    """Per feature node, Σ_i over patients observing it of 1/√(features patient i observes): each
    patient's indicator vector scaled to L2 norm 1, the vector a hospital noises under DP
    (:mod:`clinograph.sdk.privacy.counts`). Stays at the hospital."""
    from ..privacy.counts import clipped_sum

    pairs = np.unique(np.stack([np.asarray(table.patient), np.asarray(table.node)]), axis=1)  # one per patient
    return clipped_sum(pairs[0], pairs[1], cells=len(table.dictionary.node_ids()))


def with_features(config, features: tuple[str, ...]):  # noqa: ANN001, ANN201 - a SimulationConfig
    """``config`` with ``[model] features`` set to the resolved list."""
    return config.model_copy(update={"model": config.model.model_copy(update={"features": tuple(features)})})


def refuse_unresolvable(config) -> None:  # noqa: ANN001 - a SimulationConfig
    """``"shared"`` needs the coverage round, which DP and CKKS do not allow.

    Raises:
        ConfigError: with the fix.
    """
    if config.model.features != "shared":
        return
    if config.privacy.enabled and config.privacy.mode == "distributed":
        raise ConfigError("[model] features = \"shared\" under [privacy] mode = 'distributed': the coverage round is "
                          "released with local noise, accounted in the local-DP ledger (sdk/privacy/counts.py), which "
                          "the distributed-DP trainer does not keep. List the features in [model] features, use \"all\", "
                          "or use mode = 'local'.")
    if config.federation.secure_mode not in SECURE_SUM_MODES:
        raise ConfigError(f"[model] features = \"shared\" needs the coverage round, which runs under secure_mode "
                          f"'masked' (or insecure_plaintext), not {config.federation.secure_mode!r}. List the "
                          "features in [model] features, or use \"all\".")


def check_features(features: object, dictionary: FeatureDictionary) -> None:
    """Refuse a ``[model] features`` list naming ids the dictionary lacks (all named at once),
    and an unresolved ``"shared"`` (the run's coverage sum resolves it).

    Raises:
        ConfigError: with the unknown ids and the fix.
    """
    if features == "shared":
        raise ConfigError("[model] features = \"shared\" is resolved by the run's feature_coverage set-up sum "
                          "(sdk/federation/coverage.py), in a federation run (simulate, or a SuperNode's "
                          "FederationMember); a hospital built on its own needs the list itself: copy `shared` from "
                          "the simulation's feature_coverage audit entry (or a deployment's) into [model] features, or use \"all\".")
    if isinstance(features, tuple):
        known = set(dictionary.node_ids())
        unknown = [f for f in features if f not in known]
        if unknown:
            raise ConfigError(f"[model] features names {len(unknown)} id(s) that feature dictionary "
                              f"{dictionary.name} v{dictionary.version} lacks: {', '.join(map(repr, unknown[:20]))}"
                              f"{' …' if len(unknown) > 20 else ''}. Use the dictionary's feature ids.")


def restrict(table: PatientTable, features: object) -> PatientTable:
    """``table`` keeping only the observations of ``features`` (a tuple of ids); ``"all"`` keeps
    every observation. Checked with :func:`check_features` first."""
    if features == "all":
        return table
    check_features(features, table.dictionary)
    index = table.dictionary.node_index()
    return table.restrict_features(np.array([index[f] for f in features], dtype=np.int64))  # type: ignore[union-attr]
