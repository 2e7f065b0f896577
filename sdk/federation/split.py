"""How a hospital's patients are split into train, validation and test.

The rule depends on the hospital's own name, its labels and a seed -- never on its position in
a config or on which transport runs it -- so the same hospital gets the same split in
``clinograph simulate``, the demo, the Flower ServerApp and an integrator's own code.
Stratified: the class balance is kept in every part.

Public API (``clinograph.split_patients``, ``clinograph.hospital_split``, ``clinograph.Split``):
a baseline or study that wants the exact patients the federation trained, validated and tested
on calls :func:`split_patients` with the ingested table and the same config (for a
:class:`~clinograph.sdk.config.SimulationConfig`, ``[federation] seed`` moves the split unless
``[split] seed`` is set: the one-seed rule in docs/quickstart.md).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from clinograph.core.arguments import checked_arguments
from clinograph.core.errors import ConfigError

if TYPE_CHECKING:
    from ..config import HospitalConfig
    from ..ingest.table import PatientTable


@dataclass(frozen=True, repr=False)
class Split:
    """Sorted patient indices of each part (validation may be empty)."""

    train: np.ndarray
    validation: np.ndarray
    test: np.ndarray

    def __repr__(self) -> str:
        return f"Split(train={len(self.train)}, validation={len(self.validation)}, test={len(self.test)})"


def stratified_split(labels: np.ndarray, *, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices with the class balance kept in both."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for cls in np.unique(labels):
        idx = np.flatnonzero(labels == cls)
        rng.shuffle(idx)
        k = int(round(len(idx) * test_fraction))
        test.append(idx[:k])
        train.append(idx[k:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def split_seed(site: str, seed: int) -> int:
    """A 63-bit seed from the hospital's name and the configured seed."""
    return int.from_bytes(hashlib.sha256(f"clinograph/split/{site}/{seed}".encode()).digest()[:8], "big") >> 1


@checked_arguments
def hospital_split(labels: np.ndarray, *, site: str, test_fraction: float, validation_fraction: float,
                   seed: int) -> Split:
    """The split of hospital ``site`` (see the module docstring).

    Raises:
        ConfigError: a part would be empty.
    """
    labels = np.asarray(labels)
    base = split_seed(site, seed)
    train, test = stratified_split(labels, test_fraction=test_fraction, seed=base)
    val = np.zeros(0, dtype=np.int64)
    if validation_fraction > 0:
        fit_pos, val_pos = stratified_split(labels[train], test_fraction=validation_fraction, seed=base + 1)
        train, val = train[fit_pos], train[val_pos]
    if len(train) == 0 or len(test) == 0 or (validation_fraction > 0 and len(val) == 0):
        parts = 3 if validation_fraction > 0 else 2
        fix = ("lower [split] fractions" if len(labels) >= 2 * parts else
               f"with so few patients, leave this hospital out of the federation (or join its patients to another "
               f"site's table); a split needs at least {parts} patients, one a part, and a hospital of under "
               f"{2 * parts} is mostly too small to train or test on")
        raise ConfigError(f"Hospital {site!r}: {len(labels)} patients give an empty part in the split "
                          f"(train {len(train)}, validation {len(val)}, test {len(test)}); {fix}.")
    return Split(train=train, validation=val, test=test)


@checked_arguments
def split_patients(table: PatientTable, *, config: HospitalConfig) -> Split:
    """The train / validation / test split the federation uses for ``table``'s hospital: the same
    call :func:`clinograph.sdk.federation.build.build_task` makes, so a baseline scored on
    ``split.test`` is scored on the patients every federated model was tested on.

    Args:
        table: one hospital's ingested table (its ``site`` and labels decide the split).
        config: a :class:`~clinograph.sdk.config.HospitalConfig` or ``SimulationConfig``; its
            ``[split]`` fractions and seed are used.

    Returns:
        Sorted patient indices (rows of ``table``) of each part; ``validation`` is empty when
        ``[split] validation_fraction = 0``.

    Raises:
        ConfigError: a part would be empty, or ``table`` is not an ingested PatientTable.
    """
    from ..ingest.table import PatientTable

    if not isinstance(table, PatientTable):
        raise ConfigError(f"split_patients needs the hospital's ingested table (cg.ingest(...)'s PatientTable: its site "
                          f"and labels decide the split), got a {type(table).__name__}.")
    s = config.split
    return hospital_split(table.labels, site=table.site, test_fraction=s.test_fraction,
                          validation_fraction=s.validation_fraction, seed=s.seed)
