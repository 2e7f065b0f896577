"""Unit conversion onto a feature's canonical unit, through pint.

The conversions themselves are pint's (a kept library): nothing here is a table of factors.
What this module adds is *reading* the unit strings hospitals and exchange formats write:

* **UCUM**, as FHIR ``Quantity.code`` and OMOP ``unit_source_value`` carry it, is translated
  to a pint expression by :func:`ucum_to_pint`, a small translation of UCUM's *syntax*:

  - ``.`` is multiplication and ``/`` division, left to right (``mL/min/kg``); a leading
    ``/`` is a reciprocal (``/min``);
  - a signed integer after an atom is its exponent (``cm3``, ``m2``, ``s-1``,
    ``[in_i]2``); ``10*3`` and ``10^3`` are powers of ten (``10*3/uL``);
  - annotations in braces are dimensionless and dropped (``{cells}/uL`` is ``/uL``;
    ``{beats}/min`` is ``/min``);
  - the atoms whose UCUM symbol differs from pint's are renamed (:data:`UCUM_ATOMS`:
    ``Cel`` -> ``degC``, ``[degF]`` -> ``degF``, ``mm[Hg]`` -> ``mmHg``, ``cm[H2O]`` ->
    ``cmH2O``, ``mo`` -> ``month``, ``wk`` -> ``week``, ``[iU]`` -> ``IU``, ...); any other
    bracketed (UCUM "special") atom is refused by name. UCUM prefixes (``m``, ``u``, ``n``,
    ``d``, ``k``, ...) and most atoms (``g``, ``L``, ``mol``, ``Pa``, ``min``, ``h``, ``d``,
    ``a``, ``%``) are spelled the same in pint.

* **Local spellings** (``mg/dl``, ``MG/DL``, ``°C``, ``bpm``, ``mm Hg``, ``µmol/L``) are
  normalised by :func:`normalise_unit` before that.

Counts: ``cell`` is defined as a count (dimensionless), so ``cells/mm3`` == ``cells/uL`` ==
``10*3/uL`` / 1000. Mass <-> molar concentrations (``mg/dL`` <-> ``mmol/L``) need the
analyte's molar mass, which the feature dictionary declares per feature
(``molar_mass`` in g/mol); pint's ``chemistry`` context does the conversion with it.

Conversions stay affine (``canonical = value * scale + offset``), which covers temperature
scales. A unit that cannot be read, or a pair with no conversion, raises :class:`UnitError`
naming the feature, the unit, what it is (its dimension) and the fix.
"""

from __future__ import annotations

import functools
import math
import re
from tokenize import TokenError  # pint's tokenizer raises it for unbalanced brackets

from clinograph.core.errors import UnitError

# Local (non-UCUM) spellings -> one canonical spelling; keys compare lower-cased. These are
# spellings, not conversions: the canonical spelling is then read by pint.
_ALIASES = {
    "mg/dl": "mg/dL", "mmol/l": "mmol/L", "umol/l": "umol/L", "µmol/l": "umol/L", "μmol/l": "umol/L",
    "g/dl": "g/dL", "g/l": "g/L", "mg/l": "mg/L", "degc": "degC", "°c": "degC", "c": "degC", "celsius": "degC",
    "cel": "degC", "degf": "degF", "°f": "degF", "f": "degF", "fahrenheit": "degF", "[degf]": "degF",
    "kpa": "kPa", "mmhg": "mmHg", "mm hg": "mmHg", "mm[hg]": "mmHg", "cmh2o": "cmH2O", "cm h2o": "cmH2O",
    "cm[h2o]": "cmH2O", "bpm": "/min", "/min": "/min", "beats/min": "/min", "1/min": "/min", "{beats}/min": "/min",
    "%": "%", "percent": "%", "fraction": "1", "1": "1", "l/min": "L/min", "ml": "mL", "ml/min": "mL/min",
    "dyn.s/cm5": "dyn.s/cm5", "meq/l": "meq/L", "meq/dl": "meq/dL", "": "1",
    # upper-case exports (KG, CM, KCAL) and the ordinal sign for the degree sign (ºF, a common keyboard slip)
    "kg": "kg", "g": "g", "mg": "mg", "cm": "cm", "mm": "mm", "lb": "lb", "lbs": "lb", "kcal": "kcal", "kj": "kJ",
    "ºf": "degF", "ºc": "degC", "y": "a",
    # cell counts as US lab systems print them (MIMIC's valueuom, OMOP unit_source_value): K = thousand,
    # M = million there (a kelvin per microliter means nothing); x10^9/L as printed on reports
    "k/ul": "10*3/uL", "k/mcl": "10*3/uL", "k/mm3": "10*3/uL", "m/ul": "10*6/uL", "m/mcl": "10*6/uL",
    "x10^9/l": "10*9/L", "x10e9/l": "10*9/L", "x10^3/ul": "10*3/uL", "x10e3/ul": "10*3/uL",
    "x10^12/l": "10*12/L", "x10e12/l": "10*12/L", "#/ul": "/uL",
}

#: UCUM atoms whose symbol is not pint's (the whole table of renamings; see the module docstring).
UCUM_ATOMS = {
    "Cel": "degC", "[degF]": "degF", "[degC]": "degC", "mm[Hg]": "mmHg", "cm[H2O]": "cmH2O", "[mmHg]": "mmHg",
    "mo": "month", "mo_j": "month", "a_j": "year", "wk": "week", "[iU]": "IU", "[IU]": "IU",
    "[in_i]": "inch", "[ft_i]": "foot", "[lb_av]": "pound", "[oz_av]": "ounce", "[ppm]": "ppm",
    "[ppb]": "ppb", "[pi]": "pi", "[mi_i]": "mile", "[yd_i]": "yard", "[gal_us]": "gallon",
}

#: Molar masses (g/mol) used when a dictionary names a feature's ``analyte`` but declares no
#: ``molar_mass`` (physical constants, not conversions; the dictionary's value wins).
STANDARD_MOLAR_MASS = {"glucose": 180.156, "urea": 60.06, "bun": 28.014, "cholesterol": 386.65,
                       "calcium": 40.078, "creatinine": 113.12}
#: Charge numbers of the ions labs report in equivalents (mEq/L), by analyte name: what a feature's
#: ``valence`` defaults to (see :func:`conversion`).
STANDARD_VALENCE = {"sodium": 1, "potassium": 1, "chloride": 1, "bicarbonate": 1, "hco3": 1, "lithium": 1,
                    "calcium": 2, "magnesium": 2}

#: Units shown in messages as examples of what is read (any pint or UCUM unit is).
EXAMPLE_UNITS = ("/min", "%", "mmHg", "kPa", "mg/dL", "mmol/L", "umol/L", "g/L", "degC", "[degF]", "10*3/uL", "mm")

_TERM_SPLIT = re.compile(r"([./()])")
_POW10 = re.compile(r"^10[*^]([+-]?\d+)$")
_ATOM_EXP = re.compile(r"^(?P<atom>.*?)(?P<exp>[+-]?\d+)?$")
_ANNOTATION = re.compile(r"\{[^{}]*\}")


def normalise_unit(unit: str) -> str:
    """The canonical spelling of ``unit``; unknown strings are returned stripped, unchanged."""
    u = unit.strip()
    return _ALIASES.get(u.lower(), u)


def _split_terms(text: str) -> list[str]:
    """Operators (``.``, ``/``, parentheses) and terms, with brackets kept whole."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if depth == 0 and _TERM_SPLIT.fullmatch(ch):
            out.extend([cur, ch])
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return out


def _term(term: str, *, whole: str) -> str:
    term = _ANNOTATION.sub("", term).strip()
    if not term:
        return "1"
    if m := _POW10.match(term):
        return f"(10**{int(m.group(1))})"
    if term.isdigit():
        return term
    if "]" in term:
        cut = term.rindex("]") + 1
        atom, exp = term[:cut], term[cut:]
        if exp and not re.fullmatch(r"[+-]?\d+", exp):
            raise ValueError(f"unit {whole!r}: {term!r} is not a UCUM atom with an integer exponent")
    else:
        m = _ATOM_EXP.match(term)
        if m is None:  # a line break or other character no unit has ('see\nnote' in a numeric cell)
            raise ValueError(f"unit {whole!r}: {term!r} is not a unit term")
        atom, exp = m.group("atom"), m.group("exp") or ""
        if not atom:
            return term
    if atom in UCUM_ATOMS:
        atom = UCUM_ATOMS[atom]
    elif "[" in atom or "]" in atom:
        raise ValueError(f"unit {whole!r}: the UCUM special unit {atom!r} has no conversion here "
                         f"(read: {', '.join(sorted(UCUM_ATOMS))})")
    return f"{atom}**{int(exp)}" if exp else atom


def ucum_to_pint(unit: str) -> str:
    """A pint expression for a UCUM (or local) unit string; see the module docstring.

    Raises:
        ValueError: the string uses a UCUM special unit that has no conversion here.
    """
    text = normalise_unit(unit)
    if text == "1":
        return "1"
    try:
        float(text)
    except ValueError:
        pass
    else:
        raise ValueError(f"unit {unit!r} is a number, not a unit")
    if text == "%":
        return "percent"
    parts = _split_terms(text.replace(" ", ""))
    out = []
    for i, p in enumerate(parts):
        if p in ("/", "(", ")"):
            out.append(p)
        elif p == ".":
            out.append("*")
        elif p == "" and i + 1 < len(parts) and parts[i + 1] == "/":
            out.append("1")  # a leading "/" is a reciprocal
        elif p:
            out.append(_term(p, whole=unit))
    return "".join(out)


#: Units pint lacks, each its own kind (no conversion is invented between them and others):
#: cells are counts; international units, equivalents and osmoles are their own dimensions.
_DEFINITIONS = ("cell = count", "international_unit = [international_unit] = IU",
                "equivalent = [equivalent] = eq", "osmole = [osmole] = osm")


@functools.cache
def registry():  # -> pint.UnitRegistry
    """The one pint registry (created on first use), with :data:`_DEFINITIONS` added."""
    import pint

    ureg = pint.UnitRegistry(autoconvert_offset_to_baseunit=False)
    for definition in _DEFINITIONS:
        ureg.define(definition)
    return ureg


@functools.cache
def parse_unit(unit: str):  # -> pint.Quantity
    """The pint quantity one ``unit`` stands for (``10*3/uL`` -> 1000 / microliter).

    Raises:
        ValueError: the string is not a unit pint reads after the UCUM translation.
    """
    import pint

    ureg = registry()
    expr = ucum_to_pint(unit)  # ValueError names a UCUM special unit
    try:
        q = ureg.parse_expression(expr)
    except (pint.errors.PintError, AttributeError, TypeError, SyntaxError, TokenError, IndexError,
            AssertionError, ArithmeticError) as exc:  # pint asserts on some symbols ("☃") and divides by
        # zero on a range ("0-5" is 0 to the power -5): a bad unit, not a bug of ours
        raise ValueError(f"unit {unit!r} is not a unit pint reads ({type(exc).__name__})") from None
    q = q if isinstance(q, ureg.Quantity) else ureg.Quantity(q)
    try:  # an integer power beyond a float ('9³⁹⁹') overflows here
        finite = isinstance(q.magnitude, int | float) and math.isfinite(q.magnitude)
    except OverflowError:
        finite = False
    if not (finite and q.magnitude > 0):
        raise ValueError(f"unit {unit!r} does not read as a positive finite multiple of a unit")
    return q


def is_known_unit(unit: str) -> bool:
    """True if ``unit`` reads as a unit (UCUM, pint or a local spelling)."""
    try:
        parse_unit(unit)
    except ValueError:
        return False
    return True


def same_unit(a: str, b: str) -> bool:
    """True if ``a`` and ``b`` are the same unit (``cells/mm3`` and ``10*3/uL`` / 1000, ...)."""
    if normalise_unit(a) == normalise_unit(b):
        return True
    try:
        return _affine(parse_unit(a), parse_unit(b), None) == (1.0, 0.0)
    except ValueError:
        return False


def _affine(src, tgt, molar_mass: float | None) -> tuple[float, float]:
    """(scale, offset) taking a number in ``src`` to a number in ``tgt``; ValueError if none."""
    import pint

    ureg = registry()
    ctx = ()
    kw = {}
    if src.dimensionality != tgt.dimensionality and molar_mass is not None:
        ctx, kw = ("chemistry",), {"mw": ureg.Quantity(molar_mass, "g/mol")}

    def to(x: float) -> float:
        q = ureg.Quantity(x * src.magnitude, src.units)
        return float(q.to(tgt.units, *ctx, **kw).magnitude / tgt.magnitude)

    try:
        zero, one = to(0.0), to(1.0)
    except (pint.errors.PintError, ArithmeticError) as exc:
        raise ValueError(type(exc).__name__) from None
    return _sig(one - zero), _sig(zero)


def _as_moles(q, valence: int | None):
    """``q`` with its equivalents counted as moles of an ion of charge ``valence`` (1 mol = z eq):
    ``meq/L`` -> ``mmol/L`` / z. Unchanged without a valence or without equivalents."""
    power = dict(q.dimensionality).get("[equivalent]", 0)
    if not valence or not power:
        return q
    return q / registry().Quantity(valence, "eq/mol") ** power


def _sig(x: float) -> float:
    """``x`` to 12 significant digits: pint's float round-off (1.0000000000000002) is not a conversion."""
    return float(f"{x:.12g}")


def _dim(q) -> str:
    d = str(q.dimensionality)
    return "dimensionless" if d == "dimensionless" else d


def conversion(*, feature: str, analyte: str | None, source: str, target: str,
               molar_mass: float | None = None, valence: int | None = None) -> tuple[float, float]:
    """(scale, offset) with ``target = source * scale + offset`` for ``feature``.

    ``molar_mass`` (g/mol, from the feature dictionary) allows mass <-> molar concentration.
    Without it, a known ``analyte``'s molar mass (:data:`STANDARD_MOLAR_MASS`) is used.
    ``valence`` (the ion's charge number z) allows equivalents <-> moles, 1 mol = z eq (mEq/L <->
    mmol/L); without it, a known ``analyte``'s (:data:`STANDARD_VALENCE`).

    Raises:
        UnitError: a unit cannot be read, or does not convert to the other (for this analyte).
    """
    if molar_mass is None and analyte is not None:
        molar_mass = STANDARD_MOLAR_MASS.get(analyte.strip().lower())
    if valence is None and analyte is not None:
        valence = STANDARD_VALENCE.get(analyte.strip().lower())
    head = f"Feature {feature!r}: cannot convert unit {source!r} to the dictionary's canonical unit {target!r}"
    if normalise_unit(source) == normalise_unit(target):
        return 1.0, 0.0
    try:
        src = parse_unit(source)
    except ValueError as exc:
        raise UnitError(f"{head}: {exc}. Write it in UCUM (e.g. {', '.join(EXAMPLE_UNITS)}) or convert the "
                        "column before ingestion.", title="Unit error") from None
    try:
        tgt = parse_unit(target)
    except ValueError as exc:
        raise UnitError(f"{head}: the dictionary's unit cannot be read ({exc}). Fix `unit` of {feature!r} in the "
                        "feature dictionary.", title="Unit error") from None
    try:
        return _affine(_as_moles(src, valence), _as_moles(tgt, valence), molar_mass)
    except ValueError:
        pass
    ratio = dict(src.dimensionality / tgt.dimensionality)  # not src / tgt: pint refuses that for degC
    if ratio in ({"[equivalent]": 1, "[substance]": -1}, {"[equivalent]": -1, "[substance]": 1}) and valence is None:
        hint = (f": one counts equivalents and the other moles. Equivalent/molar conversions need the ion's charge "
                f"number: set `valence` for {feature!r} in the feature dictionary (1 for Na+, K+, Cl-, HCO3-; 2 for "
                "Ca2+, Mg2+)")
    elif ratio in ({"[mass]": 1, "[substance]": -1}, {"[mass]": -1, "[substance]": 1}) and molar_mass is None:
        what = f" ({analyte})" if analyte else ""
        hint = (f": one is a mass and the other a molar quantity{what}. Mass/molar conversions need the analyte's "
                f"molar mass: set `molar_mass` (g/mol) for {feature!r} in the feature dictionary")
    else:
        hint = (f": {source!r} is {_dim(src)} but {target!r} is {_dim(tgt)}. Use a unit of the same kind as "
                f"{target!r}, or convert the column before ingestion")
    raise UnitError(f"{head}{hint}.", title="Unit error")
