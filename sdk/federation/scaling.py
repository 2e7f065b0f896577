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
   range fall into the first or last bin), capped at :data:`MAX_BIN_COUNT`.
3. **Secure sum.** One set-up sum of the run (:mod:`clinograph.secure.runtime.setup`; the
   hospital's share: :mod:`.setup`) sums the histograms through the
   federation's secure mode in the shared module :data:`HISTOGRAM_MODULE` (``masked``; or
   ``insecure_plaintext`` by name): the server learns the summed histogram only, never a
   hospital's; every hospital decodes ``Σ_k h_k``.
4. **Quantiles.** At every hospital, from the summed histogram (linear within a bin, so a quantile is exact to
   within one bin width), centre = median and half-width = half the inter-quantile range
   (``iqr``: 25–75 %, ``p05_p95``: 5–95 %), in transformed units. They become the features'
   ``scale_center`` / ``scale_half_width`` in a derived dictionary (a new digest) that every
   hospital trains, predicts and exports with; a feature nobody observes, or whose spread is
   below a bin width, keeps a bin-width floor or its reference range.

The audit trail records a ``scaling_histogram`` entry (the features, their bin edges: start,
stop, count; the quantiles; the secure mode) before the round and a ``scaling_derived`` entry
after it (the derived dictionary's digest, which every hospital derived and returned signed, and
which features were scaled) -- never a hospital's counts. The candidates then run on the derived
digest (the initial models do not depend on the scales: :mod:`.setup`). The same in ``simulate()``
and over Flower.

Under local DP (``[privacy]``) each hospital sends its histogram with each patient's counts
clipped to L2 norm 1 and Gaussian noise added, accounted in its ledger
(:mod:`clinograph.sdk.privacy.counts`). Not under distributed DP, nor CKKS (the audited result
would reveal the sum CKKS hides).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from clinograph.core.errors import ConfigError

from ..ingest.table import PatientTable
from ..ontology.dictionary import Feature, FeatureDictionary, FeatureKind, apply_transform
from .securesum import SecureSumTask

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


def clipped_histograms(table: PatientTable, bins: Bins) -> np.ndarray:
    """:func:`local_histograms` with each patient's own counts scaled to L2 norm ≤ 1, the
    vector a hospital noises under DP (:mod:`clinograph.sdk.privacy.counts`). Stays at the hospital."""
    from ..privacy.counts import clipped_sum

    d = table.dictionary
    index = d.node_index()
    patients, cells = [], []
    for i, fid in enumerate(bins.features):
        rows = table.node == index[fid]
        vals = apply_transform(d.get(fid).transform, table.value[rows])
        ok = np.isfinite(vals)
        pos = np.floor((vals[ok] - bins.start[i]) / bins.width(i)).astype(np.int64)
        patients.append(table.patient[rows][ok])
        cells.append(i * bins.count + np.clip(pos, 0, bins.count - 1))
    flat = clipped_sum(np.concatenate(patients) if patients else np.zeros(0), np.concatenate(cells) if cells
                       else np.zeros(0), cells=len(bins.features) * bins.count)
    return flat.reshape(len(bins.features), bins.count)


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


class HistogramTask(SecureSumTask):
    """One hospital's histogram round: its counts, flattened, through :class:`.securesum.SecureSumTask`."""

    def __init__(self, table: PatientTable, bins: Bins, *, counts: np.ndarray | None = None):
        self.bins = bins
        super().__init__(local_histograms(table, bins) if counts is None else counts, name="scaling_histogram",
                         module=HISTOGRAM_MODULE, cap=MAX_BIN_COUNT)

    def __repr__(self) -> str:
        return f"HistogramTask(features={len(self.bins.features)}, bins={self.bins.count})"

    def summed(self, *, contributors: int) -> np.ndarray:
        """``Σ_k h_k`` decoded from the loaded global module, ``(n_features, count)``; quantiles
        do not depend on the contributor count K."""
        return super().summed(contributors=contributors).reshape(len(self.bins.features), self.bins.count)


