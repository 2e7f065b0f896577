"""PatientTable: a hospital's validated observations in canonical units, ready for the graph.

Holds local patient identifiers only in memory, for the hospital's own joins; reprs show
counts, never values or identifiers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..ontology.dictionary import FeatureDictionary


@dataclass(frozen=True)
class IngestReport:
    """What ingestion did: rows read, rows and columns dropped by an explicit policy, units converted.

    ``encoding``: how the file was decoded (``utf-8``, ``utf-16``, ``latin-1``, ``parquet``; None
    for a DataFrame given directly; ``cp1252`` for Windows Excel). ``duplicate_observations_dropped``: long-table rows that
    repeat an observation exactly (same patient, time, feature and value; conflicting repeats
    are an error). ``labelled``: False only for a schema declared ``unlabeled`` (labels are -1).
    ``declared_missing_cells``: cells that were one of the schema's ``[policy] missing_values``.
    """

    rows_read: int
    patients: int
    observations: int
    dropped_patients_missing_label: int = 0
    ignored_columns: tuple[str, ...] = ()
    converted_columns: dict[str, str] = field(default_factory=dict)
    features_present: tuple[str, ...] = ()
    encoding: str | None = None
    duplicate_observations_dropped: int = 0
    labelled: bool = True
    #: cells read as missing because they are one of the site schema's [policy] missing_values
    declared_missing_cells: int = 0
    #: the same cells by column name (a long table: its value column, or whichever column held them)
    declared_missing_by_column: dict[str, int] = field(default_factory=dict)
    #: wide tables: site schema [columns] absent from the table (their features are missing for every patient)
    absent_columns: tuple[str, ...] = ()
    #: wide tables: mapped columns without a value in any row (not measured here, or every cell one of the
    #: declared missing values): their features are missing for every patient, as for an absent column
    empty_columns: tuple[str, ...] = ()
    #: column (a long table: feature code) -> why its values look like another unit (:mod:`.plausibility`),
    #: or why a [survival] time column's look like Excel serial dates (:mod:`.survival`)
    far_from_reference: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, repr=False)
class SurvivalTarget:
    """A time-to-event label per patient: follow-up ``time`` in days (float, ≥ 0) and ``event``
    (1 observed, 0 censored at ``time``). Shapes: time[n_patients], event[n_patients]."""

    time: np.ndarray
    event: np.ndarray

    def subset(self, patients: np.ndarray) -> SurvivalTarget:
        """The targets of the given patient indices."""
        return SurvivalTarget(time=self.time[patients], event=self.event[patients])

    def __repr__(self) -> str:
        return f"SurvivalTarget(patients={len(self.time)}, events={int(np.sum(self.event))})"


@dataclass(frozen=True, repr=False)
class PatientTable:
    """Long-form observations over dictionary feature nodes.

    Shapes:
        patient[n_obs], node[n_obs], value[n_obs] (canonical unit), std_value[n_obs]
        (public-range standardised), time[n_obs] (snapshot index, 0 for wide tables),
        labels[n_patients] in {0, 1} (all -1 if the site schema is declared unlabeled).
    """

    dictionary: FeatureDictionary
    site: str
    patient_ids: tuple[str, ...]
    patient: np.ndarray
    node: np.ndarray
    value: np.ndarray
    std_value: np.ndarray
    time: np.ndarray
    labels: np.ndarray
    report: IngestReport
    #: time-to-event label when the site schema declares [survival] (labels are then the events)
    survival: SurvivalTarget | None = None

    @property
    def n_patients(self) -> int:
        """Number of patients."""
        return len(self.patient_ids)

    @property
    def n_snapshots(self) -> int:
        """Number of time snapshots (1 for a wide table)."""
        return int(self.time.max()) + 1 if self.time.size else 1

    def observed_nodes(self) -> np.ndarray:
        """Sorted feature-node indices this hospital observes (its F_k, Theorem 1)."""
        return np.unique(self.node)

    def subset(self, patients: np.ndarray) -> PatientTable:
        """The table restricted to the given patient indices (renumbered 0..k-1)."""
        patients = np.asarray(patients, dtype=np.int64)
        remap = -np.ones(self.n_patients, dtype=np.int64)
        remap[patients] = np.arange(len(patients))
        keep = remap[self.patient] >= 0
        return PatientTable(
            dictionary=self.dictionary, site=self.site,
            patient_ids=tuple(self.patient_ids[i] for i in patients),
            patient=remap[self.patient[keep]], node=self.node[keep], value=self.value[keep],
            std_value=self.std_value[keep], time=self.time[keep], labels=self.labels[patients],
            report=self.report, survival=None if self.survival is None else self.survival.subset(patients),
        )

    def restrict_features(self, nodes: np.ndarray) -> PatientTable:
        """The table with only the observations of the given feature-node indices (every patient
        kept, in order; a patient with none of them keeps an empty star)."""
        keep = np.isin(self.node, np.asarray(nodes, dtype=np.int64))
        return PatientTable(
            dictionary=self.dictionary, site=self.site, patient_ids=self.patient_ids, patient=self.patient[keep],
            node=self.node[keep], value=self.value[keep], std_value=self.std_value[keep], time=self.time[keep],
            labels=self.labels, report=self.report, survival=self.survival,
        )

    def dense(self, snapshot: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(values [n_patients, n_nodes] standardised with NaN for missing, observed mask).

        For time series the last observation at or before ``snapshot`` is used (all times if None).
        """
        n_nodes = len(self.dictionary.node_ids())
        out = np.full((self.n_patients, n_nodes), np.nan)
        sel = np.ones(self.patient.shape, dtype=bool) if snapshot is None else self.time <= snapshot
        order = np.argsort(self.time[sel], kind="stable")
        out[self.patient[sel][order], self.node[sel][order]] = self.std_value[sel][order]
        return out, ~np.isnan(out)

    def __repr__(self) -> str:
        return (f"PatientTable(site={self.site!r}, patients={self.n_patients}, observations={self.patient.size}, "
                f"snapshots={self.n_snapshots})")
