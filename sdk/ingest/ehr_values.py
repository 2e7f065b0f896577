"""Units and censored values of EHR events: each row's unit to the dictionary's, never silently.

What the OMOP, MEDS and FHIR readers share after codes are mapped (:func:`to_long`):

* **Units, row by row.** Each numeric row carries its own unit (OMOP ``unit_concept_id`` or
  ``unit_source_value``, MEDS ``unit`` column or ``CODE//unit``, FHIR ``valueQuantity.code``)
  and is converted with pint to the feature's canonical unit, so a feature recorded in mg/dL on
  some rows and mmol/L on others is read as one. A row *without* a unit takes the unit its source
  file declares for that feature (``units = { glucose = "mg/dL" }``); without a declaration it
  is refused: never the dictionary's unit by assumption (a kPa blood pressure is not mmHg).
* **Censored values** (``<0.5``, ``>200``: OMOP ``operator_concept_id`` or a text-only value,
  FHIR ``valueQuantity.comparator``) are read as the source file's ``censored`` policy says:
  ``"bound"`` (the bound), ``"half_bound"`` (half the bound below a detection limit, ``<``/``<=``;
  the bound above one, ``>``/``>=``) or ``"refuse"``/unset (an error naming them). They are
  counted in the report either way.

Every problem of a source is collected and raised at once (:class:`UnitError`), naming the source
table or file, the feature, how many rows and which records (ids or lines, never values), and
the fix.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd

from clinograph.core.errors import SchemaError, UnitError

from ..ontology.dictionary import FeatureDictionary, FeatureKind
from ..ontology.units import EXAMPLE_UNITS, conversion, is_known_unit, normalise_unit

CensorPolicy = Literal["refuse", "bound", "half_bound"]
CENSOR_OPS = ("<", "<=", ">", ">=")
MAX_RECORDS_SHOWN = 3


def records_text(where: pd.Series) -> str:
    """``"e.g. measurement_id 12, measurement_id 40 (and 7 more)"``: record references, never values."""
    refs = [str(w) for w in where.dropna().unique()[:MAX_RECORDS_SHOWN]]
    more = len(where) - len(refs)
    if not refs:
        return ""
    return f" (e.g. {', '.join(refs)}{f' and {more} more' if more > 0 else ''})"


def records_at(ev: pd.DataFrame, idx: np.ndarray) -> pd.Series:
    """The source records of rows ``idx`` (positions) of ``ev``: its ``where`` column, or its ``where_prefix``
    and ``where_row`` (``"data/0.parquet row "``, 12; a row < 0: the prefix alone) -- a reader's references
    kept as a shared string and a number a row, made text only for the rows shown in a message or kept."""
    if "where_prefix" not in ev.columns:
        return ev["where"].iloc[idx]
    if "where" in ev.columns or ev["where_row"].dtype.kind not in "iu":
        raise ValueError("events give their records as where, or as where_prefix + an integer where_row, not both")
    prefix, row = ev["where_prefix"].to_numpy()[idx], ev["where_row"].to_numpy()[idx]
    return pd.Series([p if r < 0 else f"{p}{r}" for p, r in zip(prefix, row, strict=True)], dtype=object)


def _clean(units: pd.Series) -> pd.Series:
    """Unit cells as stripped text, None where empty or missing (vectorised)."""
    cells = units.astype(object).where(units.notna(), None)
    spelled = {u: (u.strip() or None) if isinstance(u, str) else None for u in pd.unique(cells.dropna())}
    return cells.map(spelled).astype(object).where(cells.notna(), None)


def resolve_values(ev: pd.DataFrame, *, dictionary: FeatureDictionary, source: str, units: dict[str, str],
                   censored: CensorPolicy | None, setting: str,
                   problems: list[str] | None = None) -> tuple[pd.DataFrame, list[str]]:
    """``ev`` (mapped events with ``feature``, ``value``, ``unit``, ``where`` (:func:`records_at`), ``censor``) with numeric
    values in canonical units (written into ``ev``, returned); and report lines. ``setting``: where the user declares ``units`` and
    ``censored`` (``"[omop] in the source file"``), for messages; ``problems``: the reader's own.

    Raises:
        UnitError: every feature with unit-less rows, unknown or inconvertible units, or censored
            values without a declared policy -- all at once.
    """
    problems = list(problems or [])
    notes: list[str] = []
    value = pd.to_numeric(ev["value"], errors="coerce").to_numpy(dtype=float).copy()
    numeric_rows = np.zeros(len(ev), dtype=bool)
    unit_out = np.array([None] * len(ev), dtype=object)
    unit = _clean(ev["unit"])
    censor = ev["censor"].astype(object).where(ev["censor"].notna(), None) if "censor" in ev else \
        pd.Series([None] * len(ev), index=ev.index, dtype=object)
    censored_rows = censor.isin(CENSOR_OPS).to_numpy()
    feats = {f.id: f for f in dictionary.features}
    declared_used: dict[str, int] = {}
    converted: dict[str, list[str]] = {}
    by_feature = pd.Series(np.arange(len(ev)), index=ev.index).groupby(ev["feature"].to_numpy())
    for fid, pos in by_feature:
        feat = feats[str(fid)]
        pos = pos.to_numpy()
        if feat.kind != FeatureKind.NUMERIC:
            continue
        u = unit.iloc[pos]
        has_value = ~np.isnan(value[pos])
        no_unit = u.isna().to_numpy() & has_value
        if no_unit.any():
            if fid in units:
                u = u.mask(pd.Series(no_unit, index=u.index), units[str(fid)])
                declared_used[str(fid)] = int(no_unit.sum())
            else:
                problems.append(
                    f"{source}: feature {fid!r}: {int(no_unit.sum())} value(s) carry no unit"
                    f"{records_text(records_at(ev, pos[no_unit]))}. Clinograph does not assume the dictionary's "
                    f"unit ({feat.unit!r}). Give the unit in the source, or declare it: units = {{ {fid} = "
                    f"\"{feat.unit}\" }} under {setting}.")
                continue
        cens = censored_rows[pos] & has_value
        if cens.any():
            if censored in (None, "refuse"):
                problems.append(
                    f"{source}: feature {fid!r}: {int(cens.sum())} censored value(s) (<, <=, >, >= a limit)"
                    f"{records_text(records_at(ev, pos[cens]))}. Declare how to read them: censored = \"bound\" "
                    f"or \"half_bound\" under {setting} (or remove those rows).")
                continue
            below = cens & censor.iloc[pos].isin(("<", "<=")).to_numpy()
            if censored == "half_bound":
                value[pos[below]] = value[pos[below]] / 2.0
            how = "half the bound below a limit" if censored == "half_bound" else "their bound"
            notes.append(f"censored values of {fid!r} read as {how}: {int(cens.sum())}")
        spelled = {x: normalise_unit(x) for x in u.dropna().unique()}
        un = u.map(spelled).to_numpy(dtype=object)
        unknown = sorted(t for t in set(spelled.values()) if not is_known_unit(t))
        if unknown:  # unit text that is no unit may be anything a cell holds: counted, not shown
            rows = np.isin(un, unknown)
            problems.append(f"{source}: feature {fid!r}: {len(unknown)} unit string(s) are not known units (not "
                            f"shown: cell contents){records_text(records_at(ev, pos[rows]))}. Write units in "
                            f"UCUM (e.g. {', '.join(EXAMPLE_UNITS[:5])}), or map the unit in the source.")
        for text in sorted(set(spelled.values()) - set(unknown)):
            rows = un == text
            try:
                scale, offset = conversion(feature=feat.id, analyte=feat.analyte, source=text, target=feat.unit,
                                           molar_mass=feat.molar_mass, valence=feat.valence)
            except UnitError as exc:
                problems.extend(f"{source}: {p}{records_text(records_at(ev, pos[rows]))}" for p in exc.problems)
                continue
            value[pos[rows]] = value[pos[rows]] * scale + offset
            if (scale, offset) != (1.0, 0.0):
                converted.setdefault(str(fid), []).append(text)
        unit_out[pos] = feat.unit
        numeric_rows[pos] = True
    if problems:
        raise UnitError(list(dict.fromkeys(problems)), title=f"{source}: values cannot be read without a decision")
    notes.extend(f"values of {fid!r} without a unit, read in the declared {units[fid]!r}: {n}"
                 for fid, n in sorted(declared_used.items()))
    notes.extend(f"{fid!r} converted row by row from {', '.join(us)}" for fid, us in sorted(converted.items()))
    if pd.api.types.is_numeric_dtype(ev["value"]):
        out_value = np.where(numeric_rows, value, pd.to_numeric(ev["value"]).to_numpy(dtype=float))
    else:  # level codes (sex) next to numbers: keep the codes, the numbers converted
        out_value = ev["value"].to_numpy(dtype=object).copy()
        out_value[numeric_rows] = value[numeric_rows]
    ev["value"], ev["unit"] = out_value, unit_out  # in place: ev is the caller's own copy
    return ev, notes


def declared_features(*, section: str, person_section: str, age: str | None, sex, conditions: tuple[str, ...],  # noqa: ANN001
                      units: dict[str, str], dictionary: FeatureDictionary) -> None:
    """The features a source file names (``age``, ``sex``, condition features, ``units`` keys) are
    dictionary features of the right kind, and the sex codes are the feature's codes.

    Raises:
        SchemaError: every bad declaration at once (a typo is never silently unused).
    """
    problems = []
    want: list[tuple[str, str, tuple[FeatureKind, ...]]] = []
    if age:
        want.append((f"{person_section} age", age, (FeatureKind.NUMERIC,)))
    if sex is not None:
        want.append((f"{person_section} sex", sex.feature, (FeatureKind.BINARY, FeatureKind.CATEGORICAL)))
    want += [("[omop.conditions] features", f, (FeatureKind.BINARY,)) for f in conditions]
    want += [(f"{section} units", f, (FeatureKind.NUMERIC,)) for f in units]
    for key, fid, kinds in want:
        if fid not in dictionary:
            problems.append(f"{key}: {fid!r} is not a feature of the dictionary {dictionary.name} (nearest: "
                            f"{dictionary.nearest(fid)}). Name a dictionary feature.")
            continue
        feat = dictionary.get(fid)
        if feat.kind not in kinds:
            problems.append(f"{key}: {fid!r} is {feat.kind.value}; expected {' or '.join(k.value for k in kinds)}. "
                            "Name a feature of that kind.")
        elif key.startswith("[omop.conditions]") and feat.omop_concept_id is None:
            problems.append(f"{key}: {fid!r} has no omop_concept_id in the dictionary. Add the condition's "
                            "standard concept id to the feature (omop_concept_id = ...).")
    if sex is not None and sex.feature in dictionary:
        feat = dictionary.get(sex.feature)
        allowed = set(feat.levels) if feat.kind == FeatureKind.CATEGORICAL else {"1", "0"}
        bad = [c for c in (sex.male, sex.female) if c not in allowed]
        if bad:
            problems.append(f"{person_section} sex: male/female must be {sorted(allowed)} for {sex.feature!r} "
                            f"({len(bad)} are not). Use the feature's level codes (or 1/0 for a binary feature).")
    if problems:
        raise SchemaError(problems, title=f"The {section} section does not fit the dictionary")
