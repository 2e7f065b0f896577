"""The few OMOP standard concepts the OMOP reader interprets itself: units, operators, gender.

``UNIT_CONCEPTS`` maps standard concepts of the OMOP vocabulary's ``UCUM`` vocabulary (domain
``Unit``, as an ETL writes them to ``unit_concept_id``) to their UCUM codes -- the concept's
``concept_code`` in Athena. Only well-known ids are listed; a site adds its own in the source file
(``unit_concepts = { 9876543 = "kPa" }``), and an id found in neither is refused by name, never
guessed. ``0`` ("No matching concept") is no unit.

``OPERATOR_CONCEPTS``: the ``Meas Value Operator`` concepts of ``measurement.operator_concept_id``
(``<0.5`` is value 0.5 with operator ``<``). ``GENDER_CONCEPTS``: ``person.gender_concept_id``.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

#: OMOP unit concept id -> UCUM code (Athena: vocabulary_id = 'UCUM', concept_code). Every id but
#: 8784 and 8511 was checked against the concept names OHDSI's DataQualityDashboard lists beside
#: its unit ids (``inst/csv/OMOP_CDMv5.*_Concept_Level.csv``: unitConceptId, unitConceptName, and
#: the plausible unit ids of body temperature, weight and height: 9289 is the one of body
#: temperature that is not 586323 "degree Celsius"); 8784 ("cells per microliter") and 8511
#: ("week") agree with ETLs' use but had no name to check against here.
UNIT_CONCEPTS: dict[int, str] = {
    8554: "%", 8541: "/min", 8483: "{counts}/min", 8876: "mm[Hg]", 8753: "mmol/L", 8840: "mg/dL",
    8749: "umol/L", 8713: "g/dL", 8636: "g/L", 8751: "mg/L", 8837: "ug/dL", 8748: "ug/L", 8842: "ng/mL",
    8859: "ug/mL", 8861: "mg/mL", 8817: "ng/dL", 8845: "pg/mL", 8820: "pg/dL", 8736: "nmol/L",
    8729: "pmol/L", 8725: "ng/L", 9557: "meq/L", 9579: "mmol/mol", 8645: "U/L", 8923: "[IU]/L",
    8985: "[IU]/mL", 8763: "U/mL", 44777578: "mU/L", 8784: "{cells}/uL", 8647: "/uL", 8785: "/mm3",
    9254: "/L", 8848: "10*3/uL", 8961: "10*3/mm3", 9436: "10*3/mL", 9435: "10*3/L", 9444: "10*9/L",
    8815: "10*6/uL", 8816: "10*6/mL", 8583: "fL", 8587: "mL", 8519: "L", 44777604: "L/L", 8795: "mL/min",
    8698: "L/min", 8862: "mosm/kg", 9591: "mosm/L", 8723: "mg/g", 8588: "mm", 8582: "cm", 9546: "m",
    9327: "[in_i]", 8617: "m2", 9531: "kg/m2", 8752: "mm/h", 9593: "ms", 8555: "s", 8511: "wk",
    8576: "mg", 8504: "g", 9529: "kg", 8739: "[lb_av]", 586323: "Cel", 9289: "[degF]",
}
#: Meas Value Operator concepts (as two independent ETLs map them -- one that maps '<' and '>' the
#: other way round was found too, and disagrees with both)
OPERATOR_CONCEPTS: dict[int, str] = {4171756: "<", 4171754: "<=", 4172703: "=", 4172704: ">", 4171755: ">="}
MALE, FEMALE = 8507, 8532
GENDER_CONCEPTS = {MALE: "male", FEMALE: "female"}

_CENSORED_TEXT = re.compile(r"^\s*(<=|>=|<|>|=)?\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


def parse_value_text(text: object) -> tuple[float | None, str | None]:
    """(number, operator) of a text-only value: ``"<0.5"`` -> (0.5, ``"<"``), ``"12"`` -> (12.0, None);
    (None, None) when it is not a number with an optional comparison."""
    if not isinstance(text, str):
        return None, None
    m = _CENSORED_TEXT.match(text)
    if m is None:
        return None, None
    op = m.group(1)
    return float(m.group(2)), (None if op in (None, "=") else op)


def censoring_in_text(value: np.ndarray, text: pd.Series, op: np.ndarray) -> tuple[int, int]:
    """Mark in ``op`` (in place) the rows that carry a number *and* a text value with a limit
    (``value_as_number`` 0.5 beside ``value_source_value`` "<0.5", MEDS ``numeric_value`` beside
    ``text_value``) but no operator: censored, not exact. Returns (rows marked, rows whose number
    differs from the text's bound -- an ETL's substitute, kept as the number and counted)."""
    rows = np.flatnonzero(~np.isnan(value) & text.notna().to_numpy() & pd.isna(op))
    if len(rows):  # only text with a limit sign is parsed (MEDS ETLs copy every value to text_value)
        lead = text.iloc[rows].astype(str).str.lstrip().str[:1]
        rows = rows[lead.isin(("<", ">")).to_numpy()]
    marked = substituted = 0
    for i in rows:
        number, text_op = parse_value_text(text.iat[i])
        if number is None or text_op is None:
            continue
        if np.isclose(number, value[i]):
            op[i], marked = text_op, marked + 1
        else:
            substituted += 1
    return marked, substituted
