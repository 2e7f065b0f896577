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
from typing import TYPE_CHECKING

import numpy as np
import torch

from clinograph.core.errors import ConfigError
from clinograph.core.identity import Identity

from ..config import HospitalConfig
from ..ingest.table import PatientTable
from ..model.modalities import (
    ModalityNSFL,
    add_modality_modules,
    modal_stars,
    modality_module_names,
)
from ..ontology.dictionary import FeatureDictionary
from ..training.personal import personal_module_map
from .nsfl_task import NSFLTask
from .split import Split, hospital_split

if TYPE_CHECKING:
    from .task import Task

def check_modality_config(table: PatientTable, config: HospitalConfig,
                          signals: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """ConfigError naming every setting the modality model cannot take (local and distributed DP are fine)."""
    mods = tuple(config.model.modalities)
    problems = []
    if not mods:
        problems.append("[model] modalities is empty: list the federation's modalities, e.g. ['waveform']")
    if config.model.temporal != "none":
        problems.append("[model] temporal with modalities: the modality model runs on the latest star only; "
                        "set temporal = 'none'")
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


class ModalityNSFLTask(NSFLTask):
    """NS-FL with modality nodes. ``signals``: modality -> (signal [n_patients, L], has
    [n_patients] bool) for the modalities this hospital records, in ``table.patient_ids`` order.
    Under local DP the trainer is :class:`~clinograph.sdk.privacy.modalities.ModalDPTrainer`
    (one row a patient: its star and its signals)."""

    name = "nsfl"

    def __init__(self, table: PatientTable, *, dictionary: FeatureDictionary, config: HospitalConfig, split: Split,
                 signals: Mapping[str, tuple[np.ndarray, np.ndarray]], state_dir: Path | None = None,
                 signer: Identity | None = None):
        check_modality_config(table, config, signals)
        if config.privacy.enabled and config.privacy.mode == "distributed":
            raise ConfigError(f"Hospital {table.site!r}: ModalityNSFLTask trains without DP or with local DP; "
                              "build_modality_task builds the distributed-DP task.")
        super().__init__(table, dictionary=dictionary, config=config, split=split, state_dir=state_dir, signer=signer)
        mods = tuple(config.model.modalities)
        node_ids = dictionary.node_ids()
        torch.manual_seed(config.model.init_seed)
        self.model = ModalityNSFL(len(node_ids), config.model, modalities=mods)
        self.modules = add_modality_modules(personal_module_map(self.model, node_ids,
                                                                personal=config.personal.modules), self.model)
        #: modality -> whether any of this hospital's patients has it
        self.has_modality = {m: bool(np.asarray(signals[m][1]).any()) if m in signals else False for m in mods}
        stars = modal_stars(self.trainer.stars, mods, signals)
        self.trainer.stars = stars
        if config.privacy.enabled:  # local DP: one row a patient is its star and its signals
            from ..privacy import dp_trainer_factory
            from ..privacy.modalities import ModalDPTrainer

            root = Path(config.privacy.state_dir) / table.site if config.privacy.state_dir else Path(state_dir)  # type: ignore[arg-type]
            self.trainer = dp_trainer_factory(table=table, train_idx=split.train, config=config, site=table.site,
                                              state_dir=root, signer=signer, trainer_cls=ModalDPTrainer, stars=stars)

    def trained_modules(self, outcome) -> list[str]:  # noqa: ANN001 - a TrainOutcome
        absent = {n for m, has in self.has_modality.items() if not has for n in modality_module_names(m)}
        return [n for n in super().trained_modules(outcome) if n not in absent]


def build_modality_task(table: PatientTable, *, dictionary: FeatureDictionary, config: HospitalConfig,
                        signals: Mapping[str, tuple[np.ndarray, np.ndarray]], state_dir: Path | None = None,
                        identity: Identity | None = None) -> ModalityNSFLTask | Task:
    """The hospital's modality task, with the split rule every task uses (pass it to
    :func:`~clinograph.sdk.federation.build.build_hospital` as ``task=``). Under local DP:
    ``state_dir`` (or ``[privacy] state_dir``) for the ledger and ``identity`` to sign it; under
    ``mode = "distributed"`` the distributed-DP task (:class:`.dp_task.DistributedDPTask`) over
    the same rows."""
    split = hospital_split(table.labels, site=table.site, test_fraction=config.split.test_fraction,
                           validation_fraction=config.split.validation_fraction, seed=config.split.seed)
    if config.privacy.enabled and config.privacy.mode == "distributed":  # one DP-SGD step a round
        from .dp_task import build_distributed_task

        check_modality_config(table, config, signals)
        return build_distributed_task(table, dictionary=dictionary, config=config, split=split, state_dir=state_dir,
                                      identity=identity, signals=signals)
    return ModalityNSFLTask(table, dictionary=dictionary, config=config, split=split, signals=signals,
                            state_dir=state_dir, signer=identity)
