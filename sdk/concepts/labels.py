"""A hospital's concept labels from its own table, through its site schema.

The schema names the concept columns (``concepts = ["PULMEMBOLUS", ...]``, like ``label``);
ingestion keeps them out of the features, and :func:`concept_labels` reads them for the
patients ingestion kept, in the table's patient order. States are coded by a public state list
per concept (the federation's, so every hospital codes them alike); an empty cell is a
missing label (``-1``). Errors name columns and counts, never cell values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from clinograph.core.errors import SchemaError

from ..ingest.table import PatientTable
from ..ontology.schema import SiteSchema


def concept_labels(df: pd.DataFrame, *, schema: SiteSchema, table: PatientTable,
                   states: Mapping[str, Sequence[str]]) -> dict[str, torch.Tensor]:
    """Concept -> LongTensor ``(n_patients,)`` of state indices (``-1``: no label), for every
    concept column the schema names.

    Raises:
        SchemaError: every problem at once (a named column absent, a concept without a state
            list, cells outside the state list).
    """
    problems: list[str] = []
    columns = tuple(schema.concepts or ())
    for c in columns:
        if c not in df.columns:
            problems.append(f"Concept column {c!r} named in the site schema is not in the table. Fix `concepts`.")
        elif c not in states:
            problems.append(f"Concept {c!r} has no state list in the federation; add it or drop it from `concepts`.")
    if problems:
        raise SchemaError(problems, title=f"Concept labels of site {schema.site!r}")
    ids = df[schema.patient_id].astype(str).to_numpy()
    row_of = {pid: i for i, pid in enumerate(ids)}
    rows = np.array([row_of[p] for p in table.patient_ids], dtype=np.int64)
    out: dict[str, torch.Tensor] = {}
    for c in columns:
        code = {str(s): i for i, s in enumerate(states[c])}
        raw = df[c].iloc[rows]
        empty = raw.isna().to_numpy()
        text = raw.astype(str).to_numpy()
        bad = [~e and t not in code for e, t in zip(empty, text, strict=True)]
        if any(bad):
            problems.append(f"Concept column {c!r}: {int(sum(bad))} cell(s) outside its {len(code)} states. "
                            "Recode them or leave them empty (missing).")
            continue
        out[c] = torch.tensor([-1 if e else code[t] for e, t in zip(empty, text, strict=True)], dtype=torch.long)
    if problems:
        raise SchemaError(problems, title=f"Concept labels of site {schema.site!r}")
    return out
