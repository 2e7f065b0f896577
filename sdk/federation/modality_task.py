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

from clinograph.core.errors import ConfigError
from clinograph.core.identity import Identity

from ..config import HospitalConfig
from ..graph.star import star_batch
from ..ingest.table import PatientTable
from ..model.modalities import modal_stars, modality_module_names
from ..ontology.dictionary import FeatureDictionary
from ..training.trainer import GraphTrainer, Trainer
from .nsfl_task import NSFLTask
from .split import Split, hospital_split


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
    One row a patient is its star and its signals, in every ``[privacy]`` mode (local DP:
    :class:`~clinograph.sdk.privacy.modalities.ModalDPTrainer`; distributed DP: the distributed
    trainer around the plain one)."""

    name = "nsfl"

    def __init__(self, table: PatientTable, *, dictionary: FeatureDictionary, config: HospitalConfig, split: Split,
                 signals: Mapping[str, tuple[np.ndarray, np.ndarray]], state_dir: Path | None = None,
                 signer: Identity | None = None):
        check_modality_config(table, config, signals)
        self.signals = signals
        mods = tuple(config.model.modalities)
        #: modality -> whether any of this hospital's patients has it
        self.has_modality = {m: bool(np.asarray(signals[m][1]).any()) if m in signals else False for m in mods}
        super().__init__(table, dictionary=dictionary, config=config, split=split, state_dir=state_dir, signer=signer)

    def _make_trainer(self, *, local: bool, root: Path | None, signer: Identity | None) -> Trainer:
        config, table, mods = self.config, self.table, tuple(self.config.model.modalities)
        if local:  # one DP example is a patient's star and its signals
            from ..privacy import dp_trainer_factory
            from ..privacy.modalities import ModalDPTrainer

            stars = modal_stars(star_batch(table, k_similar=0), mods, self.signals)
            return dp_trainer_factory(table=table, train_idx=self.split.train, config=config, site=table.site,
                                      state_dir=root, signer=signer, trainer_cls=ModalDPTrainer, stars=stars)  # type: ignore[arg-type]
        trainer = GraphTrainer(table, train_idx=self.split.train, k_similar=0, config=config.training)
        trainer.stars = modal_stars(trainer.stars, mods, self.signals)
        return trainer

    def trained_modules(self, outcome) -> list[str]:  # noqa: ANN001 - a TrainOutcome
        if self.privacy_mode == "distributed":  # every hospital noises every released coordinate
            return super().trained_modules(outcome)
        absent = {n for m, has in self.has_modality.items() if not has for n in modality_module_names(m)}
        return [n for n in super().trained_modules(outcome) if n not in absent]


def build_modality_task(table: PatientTable, *, dictionary: FeatureDictionary, config: HospitalConfig,
                        signals: Mapping[str, tuple[np.ndarray, np.ndarray]], state_dir: Path | None = None,
                        identity: Identity | None = None) -> ModalityNSFLTask:
    """The hospital's modality task, with the split rule every task uses (pass it to
    :func:`~clinograph.sdk.federation.build.build_hospital` as ``task=``). Under DP: ``state_dir``
    (or ``[privacy] state_dir``) for the ledger and ``identity`` to sign it."""
    split = hospital_split(table.labels, site=table.site, test_fraction=config.split.test_fraction,
                           validation_fraction=config.split.validation_fraction, seed=config.split.seed)
    return ModalityNSFLTask(table, dictionary=dictionary, config=config, split=split, signals=signals,
                            state_dir=state_dir, signer=identity)
