"""Federated robust scaling: quantiles of every numeric feature from securely summed histograms.

A set-up phase before training, run by the one round loop
(:func:`clinograph.secure.runtime.run_rounds`) like the DAG vote of
:mod:`clinograph.sdk.concepts.federation`, never by a loop of its own:

1. **Public bins.** For each numeric dictionary feature, ``bins`` equal-width bins over its
   *plausible range* in transformed units (after the dictionary's ``transform``): the
   transformed reference range's centre ± ``span`` half-widths (the model clips standardised
   values at ``value_clip`` = 5, so nothing beyond ±5 half-widths matters), cut to the
   transformed physical limits. The edges depend on the dictionary alone.
2. **Local histograms.** Each hospital counts its observations per bin (values beyond the
   range fall into the first or last bin) and writes ``c · counts`` and ``c`` as the weighted
   update of one shared module, :data:`HISTOGRAM_MODULE` (``c`` a public scale keeping every
   value inside the masked mode's fixed-point range). Its aggregation weight is 1 at every
   hospital, so the weight reveals nothing.
3. **Secure sum.** The round runs under the federation's secure mode (``masked``; or
   ``insecure_plaintext`` by name), with FedSGD at server learning rate 1: the global module
   moves by ``c · (Σ_k h_k, K) / K`` (K contributors, weight 1 each). The server learns the
   summed histogram only, never a hospital's; every hospital decodes ``Σ_k h_k`` from the
   signed global model and the round's public contributor count.
4. **Quantiles.** From the summed histogram (linear within a bin, so a quantile is exact to
   within one bin width), centre = median and half-width = half the inter-quantile range
   (``iqr``: 25–75 %, ``p05_p95``: 5–95 %), in transformed units. They become the features'
   ``scale_center`` / ``scale_half_width`` in a derived dictionary (a new digest) that every
   hospital trains, predicts and exports with; a feature nobody observes, or whose spread is
   below a bin width, keeps a bin-width floor or its reference range.

The audit trail records a ``scaling_histogram`` entry: the features, their bin edges (start,
stop, count), the quantiles, and the derived dictionary's digest -- never a hospital's counts.

What it does not do: differential privacy (the summed histogram is exact; under ``[privacy]``
the phase is refused), CKKS (the hospitals would decrypt the sum; not wired yet), or deployments
over Flower (simulation only for now).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from clinograph.secure.audit import AuditTrail
from clinograph.secure.errors import ConfigError, ProtocolError
from clinograph.secure.identity import Identity, PublicIdentity
from clinograph.secure.runtime import InProcessTransport, build_server, run_rounds
from clinograph.secure.runtime.build import InitialModel
from clinograph.secure.runtime.config import FederationSection
from clinograph.secure.spec import ModuleKind
from torch import nn

from ..config import ReleaseSection, ScalingSection
from ..ingest.table import PatientTable
from ..model.modules import ModuleMap, Piece
from ..ontology.dictionary import Feature, FeatureDictionary, FeatureKind, apply_transform
from ..training.trainer import TrainOutcome
from .client import HospitalClient

#: the shared module that carries the histograms (and the public scale) through the secure mode
HISTOGRAM_MODULE = "scaling/histogram"
#: public cap on one hospital's count in one bin (larger counts are capped): sets the scale c
MAX_BIN_COUNT = 1_000_000
QUANTILES = {"iqr": (0.25, 0.5, 0.75), "p05_p95": (0.05, 0.5, 0.95)}


@dataclass(frozen=True)
class Bins:
    """The public bins of every numeric feature: ``features[i]`` has edges
    ``linspace(start[i], stop[i], count + 1)`` in transformed units."""

    features: tuple[str, ...]
    start: tuple[float, ...]
    stop: tuple[float, ...]
    count: int

    def edges(self, i: int) -> np.ndarray:
        """Bin edges of feature ``i`` (``count + 1`` values)."""
        return np.linspace(self.start[i], self.stop[i], self.count + 1)

    def width(self, i: int) -> float:
        """Bin width of feature ``i`` (transformed units)."""
        return (self.stop[i] - self.start[i]) / self.count

    @property
    def length(self) -> int:
        """Length of the histogram module: every feature's bins, then the scale slot."""
        return len(self.features) * self.count + 1


def plausible_range(feature: Feature, *, span: float) -> tuple[float, float]:
    """The feature's plausible range in transformed units: reference centre ± ``span``
    reference half-widths, cut to the transformed physical limits where those are finite."""
    lo_t, hi_t = apply_transform(feature.transform, np.array([feature.reference_low, feature.reference_high]))
    mid, half = (lo_t + hi_t) / 2.0, (hi_t - lo_t) / 2.0
    start, stop = mid - span * half, mid + span * half
    with np.errstate(divide="ignore"):
        for bound, side in ((feature.physical_min, "lo"), (feature.physical_max, "hi")):
            if bound is None:
                continue
            t = float(apply_transform(feature.transform, np.array([bound]))[0])
            if np.isfinite(t) and side == "lo" and t > start and t < stop:
                start = t
            if np.isfinite(t) and side == "hi" and t < stop and t > start:
                stop = t
    return float(start), float(stop)


def public_bins(dictionary: FeatureDictionary, *, bins: int, span: float) -> Bins:
    """Equal-width bins over every numeric feature's :func:`plausible_range` (from the dictionary alone)."""
    numeric = [f for f in dictionary.features if f.kind == FeatureKind.NUMERIC]
    if not numeric:
        raise ConfigError(f"[scaling] source = 'federated' needs numeric features; dictionary {dictionary.name} "
                          f"v{dictionary.version} has none. Use source = 'dictionary'.")
    ranges = [plausible_range(f, span=span) for f in numeric]
    return Bins(features=tuple(f.id for f in numeric), start=tuple(r[0] for r in ranges),
                stop=tuple(r[1] for r in ranges), count=int(bins))


def local_histograms(table: PatientTable, bins: Bins) -> np.ndarray:
    """This hospital's counts, ``(n_features, count)``: transformed canonical values per bin,
    the values beyond the range in the first or last bin. Stays at the hospital."""
    d = table.dictionary
    index = d.node_index()
    out = np.zeros((len(bins.features), bins.count))
    for i, fid in enumerate(bins.features):
        vals = apply_transform(d.get(fid).transform, table.value[table.node == index[fid]])
        vals = vals[np.isfinite(vals)]
        if vals.size:
            pos = np.floor((vals - bins.start[i]) / bins.width(i)).astype(np.int64)
            out[i] = np.bincount(np.clip(pos, 0, bins.count - 1), minlength=bins.count)
    return out


def quantiles_from_histogram(counts: np.ndarray, edges: np.ndarray, qs: Sequence[float]) -> np.ndarray:
    """Quantiles of the distribution the histogram describes (uniform within a bin): each is
    within one bin width of the data's quantile when no value lies beyond the edges."""
    c = np.asarray(counts, dtype=np.float64)
    total = c.sum()
    if total <= 0:
        raise ValueError("an empty histogram has no quantiles")
    cdf = np.concatenate([[0.0], np.cumsum(c) / total])
    return np.array([float(np.interp(q, cdf, edges)) if q > 0 else float(edges[np.argmax(c > 0)]) for q in qs])


def derive_scaling(dictionary: FeatureDictionary, *, counts: np.ndarray, bins: Bins, quantiles: str,
                   min_count: int = 10) -> tuple[FeatureDictionary, dict[str, dict[str, float]]]:
    """The derived dictionary (``scale_center`` / ``scale_half_width`` set from the summed
    histogram) and, per feature, the statistics used. A feature with fewer than ``min_count``
    observations in the federation keeps its reference range; a spread below one bin width is
    floored at one bin width."""
    qlo, qmid, qhi = QUANTILES[quantiles]
    stats: dict[str, dict[str, float]] = {}
    new = []
    for f in dictionary.features:
        if f.id not in bins.features:
            new.append(f)
            continue
        i = bins.features.index(f.id)
        if counts[i].sum() < min_count:
            new.append(f)
            continue
        lo, mid, hi = quantiles_from_histogram(counts[i], bins.edges(i), (qlo, qmid, qhi))
        half = max((hi - lo) / 2.0, bins.width(i))
        stats[f.id] = {"center": float(mid), "half_width": float(half)}
        new.append(f.model_copy(update={"scale_center": float(mid), "scale_half_width": float(half)}))
    return FeatureDictionary.model_validate({**dictionary.model_dump(), "features": [
        f.model_dump() for f in new]}), stats


def rescale(table: PatientTable, dictionary: FeatureDictionary) -> PatientTable:
    """``table`` with every numeric observation re-standardised under ``dictionary`` (same
    features and order; values in canonical units are unchanged)."""
    if dictionary.node_ids() != table.dictionary.node_ids():
        raise ConfigError("rescale: the derived dictionary has other feature nodes than the table's.")
    std = table.std_value.copy()
    index = dictionary.node_index()
    for f in dictionary.features:
        if f.kind == FeatureKind.NUMERIC:
            sel = table.node == index[f.id]
            std[sel] = f.standardise_array(table.value[sel])
    return replace(table, dictionary=dictionary, std_value=std)


class HistogramTask:
    """One hospital's histogram round (implements :class:`~clinograph.sdk.federation.task.Task`).

    ``train`` writes ``local = global − c · (h, 1)`` so that the client's weighted delta
    ``1 · (global − local)`` is ``c · (h, 1)``; nothing is trained.
    """

    name = "scaling_histogram"

    def __init__(self, table: PatientTable, bins: Bins):
        self.bins = bins
        self._counts = local_histograms(table, bins)
        self._param = nn.Parameter(torch.zeros(bins.length, dtype=torch.float64), requires_grad=False)
        self.modules = ModuleMap()
        self.modules.add(HISTOGRAM_MODULE, ModuleKind.SHARED, [Piece(self._param)])

    def __repr__(self) -> str:
        return f"HistogramTask(features={len(self.bins.features)}, bins={self.bins.count})"

    @property
    def num_samples(self) -> int:
        return 1  # the weight: the same at every hospital, so it reveals nothing

    def train(self, *, round_: int, epochs: int, plan_options: Mapping[str, float | int | str | bool]) -> TrainOutcome:
        from ..training.selection import value_bound

        c = value_bound(plan_options) / MAX_BIN_COUNT
        vec = np.concatenate([np.minimum(self._counts, MAX_BIN_COUNT).ravel(), [1.0]]) * c
        with torch.no_grad():
            self._param.sub_(torch.from_numpy(vec))
        return TrainOutcome(loss=0.0, used_similar_to=False)

    def trained_modules(self, outcome: TrainOutcome) -> list[str]:
        return [HISTOGRAM_MODULE]

    def after_round(self) -> None:
        return None

    def summed(self, *, contributors: int) -> np.ndarray:
        """``Σ_k h_k`` decoded from the loaded global module, ``(n_features, count)``.

        FedSGD publishes the weighted *mean* ``c · (Σ_k h_k, K) / K`` (weights 1), so the ratio
        to the scale slot is ``Σ_k h_k / K``; ``contributors`` = K, the round's contributor count
        (public: the audit trail lists the contributors). Quantiles do not depend on K.
        """
        moved = -self.modules.get(HISTOGRAM_MODULE)
        if not moved[-1] > 0 or contributors < 1:
            raise ProtocolError("The summed histogram carries no scale: no hospital contributed to the round.")
        out = moved[:-1] / moved[-1] * contributors
        return out.reshape(len(self.bins.features), self.bins.count)

    def evaluate(self, split: str) -> dict[str, float]:
        return {}

    def quality(self) -> dict[str, float]:
        raise ConfigError("The scaling histogram round has no quality metrics; use [release] metrics = 'none'.")

    def feature_relevance(self) -> dict[str, float]:
        return {}

    def predict(self) -> np.ndarray:
        raise ConfigError("The scaling histogram round has no model to predict with.")


def federated_scaling(tables: Sequence[PatientTable], dictionary: FeatureDictionary, *, scaling: ScalingSection,
                      federation: FederationSection, server_identity: Identity, identities: Mapping[str, Identity],
                      audit: AuditTrail) -> tuple[FeatureDictionary, list[PatientTable], int]:
    """Run the histogram round and rescale every table.

    Returns the derived dictionary, the rescaled tables (same order) and the number of rounds
    the phase used (the training rounds continue the numbering in the same audit trail).

    Raises:
        ConfigError: CKKS or DP (not supported), or a dictionary without numeric features.
        ProtocolError: hospitals decoded different sums (an inconsistent federation).
    """
    if federation.secure_mode not in ("masked", "insecure_plaintext"):
        raise ConfigError(f"[scaling] source = 'federated' runs under secure_mode 'masked' (or insecure_plaintext); "
                          f"{federation.secure_mode!r} is not wired for it yet. Use 'masked', or "
                          "[scaling] source = 'dictionary'.")
    bins = public_bins(dictionary, bins=scaling.bins, span=scaling.span)
    tasks = {t.site: HistogramTask(t, bins) for t in tables}
    publics: dict[str, PublicIdentity] = {n: i.public for n, i in identities.items()}
    clients = {n: HospitalClient(task=task, identity=identities[n], server=server_identity.public, peers=publics,
                                 dictionary_hash=dictionary.digest(), federation_id=federation.id,
                                 release=ReleaseSection()) for n, task in tasks.items()}
    first = next(iter(tasks.values()))
    initial = InitialModel.create(task=first.name, dictionary_hash=dictionary.digest(),
                                  spec=first.modules.spec(version=0), state=first.modules.state(ModuleKind.SHARED))
    fed = federation.model_copy(update={"rounds": 1, "strategy": "fedsgd", "server_lr": 1.0, "strategy_options": {},
                                        "local_epochs": 1})
    audit.record("scaling_histogram", {
        "features": list(bins.features), "bins": bins.count, "span_half_widths": float(scaling.span),
        "edges": {f: [bins.start[i], bins.stop[i]] for i, f in enumerate(bins.features)},
        "transforms": {f: dictionary.get(f).transform.value for f in bins.features},
        "quantiles": scaling.quantiles, "secure_mode": fed.secure_mode})
    server = build_server(federation=fed, identity=server_identity, enrolled=publics, initial=initial, audit=audit,
                          dp_policy=None)
    outcome = run_rounds(server, InProcessTransport(clients), rounds=1)[-1]
    k = len(outcome.result.contributors)
    sums = {n: t.summed(contributors=k) for n, t in tasks.items()}
    total = next(iter(sums.values()))
    if any(not np.allclose(s, total, atol=1e-6) for s in sums.values()):
        raise ProtocolError("Hospitals decoded different summed histograms; the federation is inconsistent.")
    derived, stats = derive_scaling(dictionary, counts=total, bins=bins, quantiles=scaling.quantiles)
    audit.record("scaling_derived", {"dictionary_digest": derived.digest(), "features_scaled": sorted(stats),
                                     "features_kept_reference": sorted(set(bins.features) - set(stats))})
    return derived, [rescale(t, derived) for t in tables], server.round
