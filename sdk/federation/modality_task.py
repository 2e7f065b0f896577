"""NS-FL with modality nodes at one hospital (sdk/model/modalities.py): the hospital's extra
signals (e.g. a PPG waveform) enter its patients' graphs; modalities it lacks are neither
trained nor sent.

Built by :func:`build_modality_task` (the table plus the hospital's signals, which a
:class:`~clinograph.sdk.ingest.table.PatientTable` does not carry); everything else --
rounds, selection, calibration, the client and the one runtime -- is :class:`NSFLTask`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from clinograph.core.errors import ConfigError
from clinograph.core.identity import Identity

from ..config import HospitalConfig
from ..ingest.table import PatientTable
from ..model.modalities import (
    ModalityNSFL,
    ModalStarBatch,
    add_modality_modules,
    modality_module_names,
)
from ..ontology.dictionary import FeatureDictionary
from ..training.personal import personal_module_map
from .nsfl_task import NSFLTask
from .split import Split, hospital_split

#: the signal an absent modality is given (its δ is 0, so its value never matters)
_ABSENT_LENGTH = 8


class ModalityNSFLTask(NSFLTask):
    """NS-FL with modality nodes. ``signals``: modality -> (signal [n_patients, L], has
    [n_patients] bool) for the modalities this hospital records, in ``table.patient_ids`` order."""

    name = "nsfl"

    def __init__(self, table: PatientTable, *, dictionary: FeatureDictionary, config: HospitalConfig, split: Split,
                 signals: Mapping[str, tuple[np.ndarray, np.ndarray]], state_dir: Path | None = None,
                 signer: Identity | None = None):
        mods = tuple(config.model.modalities)
        problems = []
        if not mods:
            problems.append("[model] modalities is empty: list the federation's modalities, e.g. ['waveform']")
        if config.model.temporal != "none":
            problems.append("[model] temporal with modalities: the modality model runs on the latest star only; "
                            "set temporal = 'none'")
        if config.privacy.enabled:
            problems.append("[privacy] enabled with modalities: the DP trainer takes stars without signals; disable "
                            "[privacy] or drop the modalities")
        if config.graph.k_similar:
            problems.append("[graph] k_similar > 0 with modalities: similar_to is not built with modality nodes; set "
                            "k_similar = 0")
        if config.release.metrics == "quality":
            problems.append("[release] metrics = 'quality' with modalities is not supported; use 'none' or 'validation'")
        unknown = sorted(set(signals) - set(mods))
        if unknown:
            problems.append(f"signals for {unknown}, which are not in [model] modalities {list(mods)}")
        for m, (sig, has) in signals.items():
            if len(sig) != table.n_patients or len(has) != table.n_patients:
                problems.append(f"modality {m!r}: {len(sig)} signals / {len(has)} flags for {table.n_patients} "
                                "patients; give one row a patient in table.patient_ids order")
        if problems:
            raise ConfigError(f"Hospital {table.site!r} cannot build its modality model: " + "; ".join(problems) + ".")
        super().__init__(table, dictionary=dictionary, config=config, split=split, state_dir=state_dir, signer=signer)
        node_ids = dictionary.node_ids()
        torch.manual_seed(config.model.init_seed)
        self.model = ModalityNSFL(len(node_ids), config.model, modalities=mods)
        self.modules = add_modality_modules(personal_module_map(self.model, node_ids,
                                                                personal=config.personal.modules), self.model)
        #: modality -> whether any of this hospital's patients has it
        self.has_modality = {m: bool(np.asarray(signals[m][1]).any()) if m in signals else False for m in mods}
        sigs, flags = [], []
        for m in mods:
            if m in signals:
                sigs.append(torch.as_tensor(np.asarray(signals[m][0], np.float32)))
                flags.append(torch.as_tensor(np.asarray(signals[m][1], bool)))
            else:
                sigs.append(torch.zeros(table.n_patients, _ABSENT_LENGTH))
                flags.append(torch.zeros(table.n_patients, dtype=torch.bool))
        s = self.trainer.stars
        self.trainer.stars = ModalStarBatch(s.feature_index, s.values, s.mask, s.labels, signals=tuple(sigs),
                                            has=tuple(flags))

    def trained_modules(self, outcome) -> list[str]:  # noqa: ANN001 - a TrainOutcome
        absent = {n for m, has in self.has_modality.items() if not has for n in modality_module_names(m)}
        return [n for n in super().trained_modules(outcome) if n not in absent]


def build_modality_task(table: PatientTable, *, dictionary: FeatureDictionary, config: HospitalConfig,
                        signals: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> ModalityNSFLTask:
    """The hospital's modality task, with the split rule every task uses (pass it to
    :func:`~clinograph.sdk.federation.build.build_hospital` as ``task=``)."""
    split = hospital_split(table.labels, site=table.site, test_fraction=config.split.test_fraction,
                           validation_fraction=config.split.validation_fraction, seed=config.split.seed)
    return ModalityNSFLTask(table, dictionary=dictionary, config=config, split=split, signals=signals)
