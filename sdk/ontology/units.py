"""Unit conversion onto a feature's canonical unit.

Conversions are affine (``canonical = value * scale + offset``) and, for molar <-> mass
concentrations, analyte-specific (the molar mass differs). A unit string that is not known,
or a pair with no conversion, raises :class:`UnitError` naming the feature and the fix.
"""

from __future__ import annotations

from clinograph.secure.errors import UnitError

# Canonical spelling of unit strings people write.
_ALIASES = {
    "mg/dl": "mg/dL", "mmol/l": "mmol/L", "umol/l": "umol/L", "µmol/l": "umol/L", "μmol/l": "umol/L",
    "g/dl": "g/dL", "g/l": "g/L", "degc": "degC", "°c": "degC", "c": "degC", "celsius": "degC",
    "degf": "degF", "°f": "degF", "f": "degF", "fahrenheit": "degF", "kpa": "kPa", "mmhg": "mmHg",
    "mm hg": "mmHg", "cmh2o": "cmH2O", "bpm": "/min", "/min": "/min", "beats/min": "/min",
    "%": "%", "percent": "%", "fraction": "1", "1": "1", "l/min": "L/min", "ml": "mL",
    "dyn.s/cm5": "dyn.s/cm5", "ml/min": "mL/min", "": "1",
}

# Generic (analyte-independent) affine conversions: (from, to) -> (scale, offset).
_GENERIC: dict[tuple[str, str], tuple[float, float]] = {
    ("degF", "degC"): (5.0 / 9.0, -32.0 * 5.0 / 9.0),
    ("degC", "degF"): (9.0 / 5.0, 32.0),
    ("kPa", "mmHg"): (7.50062, 0.0),
    ("mmHg", "kPa"): (1.0 / 7.50062, 0.0),
    ("g/dL", "g/L"): (10.0, 0.0),
    ("g/L", "g/dL"): (0.1, 0.0),
    ("%", "1"): (0.01, 0.0),
    ("1", "%"): (100.0, 0.0),
    ("mL/min", "L/min"): (0.001, 0.0),
    ("L/min", "mL/min"): (1000.0, 0.0),
}

# Analyte-specific factors: mg/dL -> mmol/L multiply by 10 / molar mass (g/mol).
MOLAR_MASS = {"glucose": 180.156, "urea": 60.06, "bun": 28.014, "cholesterol": 386.65, "calcium": 40.078}
# Creatinine is reported in umol/L outside the US: 1 mg/dL = 88.42 umol/L.
_SPECIFIC: dict[tuple[str, str, str], tuple[float, float]] = {
    ("creatinine", "mg/dL", "umol/L"): (88.42, 0.0),
    ("creatinine", "umol/L", "mg/dL"): (1.0 / 88.42, 0.0),
    ("creatinine", "mg/dL", "mmol/L"): (0.08842, 0.0),
    ("creatinine", "mmol/L", "mg/dL"): (1.0 / 0.08842, 0.0),
}
for _analyte, _mm in MOLAR_MASS.items():
    _SPECIFIC[(_analyte, "mg/dL", "mmol/L")] = (10.0 / _mm, 0.0)
    _SPECIFIC[(_analyte, "mmol/L", "mg/dL")] = (_mm / 10.0, 0.0)

KNOWN_UNITS = sorted(set(_ALIASES.values()) | {"mL", "L/min", "mmol/L", "umol/L", "mg/dL", "cmH2O", "dyn.s/cm5"})


def normalise_unit(unit: str) -> str:
    """The canonical spelling of ``unit``; unknown strings are returned stripped, unchanged."""
    u = unit.strip()
    return _ALIASES.get(u.lower(), u)


def conversion(*, feature: str, analyte: str | None, source: str, target: str) -> tuple[float, float]:
    """(scale, offset) with ``target = source * scale + offset`` for ``feature``.

    Raises:
        UnitError: the unit is unknown or cannot be converted for this analyte.
    """
    s, t = normalise_unit(source), normalise_unit(target)
    if s == t:
        return 1.0, 0.0
    if analyte is not None and (analyte, s, t) in _SPECIFIC:
        return _SPECIFIC[(analyte, s, t)]
    if (s, t) in _GENERIC:
        return _GENERIC[(s, t)]
    hint = ""
    if {s, t} <= {"mg/dL", "mmol/L", "umol/L"} and analyte is None:
        hint = " Mass/molar conversions need the analyte: set `analyte` for this feature in the dictionary."
    raise UnitError(
        f"Feature {feature!r}: cannot convert unit {source!r} to the dictionary's canonical unit {target!r}."
        f"{hint} Use one of the convertible units or convert the column before ingestion.",
        title="Unit error",
    )
