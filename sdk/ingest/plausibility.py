"""A column whose values sit far outside its feature's public reference range: the unit is likely
wrong, though each value is physically possible (Karnofsky written as a fraction, 0.9, under a
``%`` feature; an age in months). Reported, not refused -- a cohort may really be far from the
reference (an ICU's lactate) -- and named by column, never by value (``IngestReport.far_from_reference``;
``clinograph check`` and ``clinograph simulate`` warn)."""

from __future__ import annotations

import numpy as np

from ..ontology.dictionary import Feature, FeatureKind

#: how many times below the reference range's low end (or above its high end) three quarters of the
#: column's values must be: 5 flags a fraction for a percentage (0.9 vs 50), months for years (720 vs 80), metres for
#: centimetres, and leaves a sick cohort's labs at 2-4 times the upper reference alone (and the
#: ALARM demo's minute volume, half of it near zero: disconnected ventilators)
FACTOR = 5.0


def far_from_reference(feat: Feature, values: np.ndarray) -> str | None:
    """What is wrong with ``values`` (canonical units, NaN = missing) of ``feat``, or None."""
    if feat.kind != FeatureKind.NUMERIC or feat.reference_low is None or feat.reference_high is None:
        return None
    v = values[np.isfinite(values)]
    if len(v) < 3 or not feat.reference_low > 0:  # a range from 0 (or below) has no 'far below'
        return None
    q1, q3 = np.percentile(v, [25, 75])  # three quarters beyond: not a cohort with many extreme values
    if q3 < feat.reference_low / FACTOR:
        side = "below"
    elif q1 > feat.reference_high * FACTOR:
        side = "above"
    else:
        return None
    return (f"three quarters of its values lie more than {FACTOR:g} times {side} the reference range of {feat.id!r} "
            f"({feat.reference_low:g} to {feat.reference_high:g} {feat.unit}): check its unit (a fraction for "
            "a percentage, months for years, m for cm) and declare it in the site schema")
