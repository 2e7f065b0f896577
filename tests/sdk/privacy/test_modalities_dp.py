"""Patient-level DP for the modality model (sdk/privacy/modalities.py): the one engine's
per-patient gradients of the waveform encoder and the modality relations equal a per-patient
loop; a hospital trains under local DP with its ledger; a masked FedSGD federation of modality
hospitals runs under distributed DP with every round accepted and every noise check passed."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.datasets import timeseries as ts
from clinograph.sdk.federation.modality_task import ModalityNSFLTask, build_modality_task
from clinograph.sdk.federation.simulate import simulate
from clinograph.sdk.graph.star import star_batch
from clinograph.sdk.model.modalities import ModalityNSFL, modal_stars
from clinograph.sdk.model.nsfl import NSFLConfig
from clinograph.sdk.privacy.modalities import modal_engine, modal_objective, modal_rows
from clinograph.sdk.privacy.per_patient import star_probe
from sdk_helpers import timeseries_sites

from clinograph.core.errors import ConfigError
from clinograph.core.identity import Identity

PICK = (0, 2, 4)  # with the PPG waveform, vital-sign series only, static only


@pytest.fixture(scope="module")
def sites():
    return timeseries_sites(tuple(replace(ts.MODALITY_GAP_HOSPITALS[i], n_patients=30) for i in PICK), seed=2)


def test_per_patient_gradients_of_the_modality_model_equal_a_per_patient_loop(sites):
    d, out = sites
    t, signals = out[0]
    model = ModalityNSFL(len(d.node_ids()), NSFLConfig(hidden=8, init_seed=3), modalities=("waveform",)).double()
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    stars = modal_stars(star_batch(t, k_similar=0), ("waveform",), signals)
    idx = torch.arange(8)
    rows = modal_rows(stars, idx)
    rows = (rows[0], rows[1].double(), rows[2], rows[3].double(), rows[4].clone())
    rows[4][1] = False  # a patient without the waveform
    y = stars.labels[idx].double()
    fi, x, m = star_probe(model.n_features)
    engine = modal_engine(model, probe=(fi, x.double(), m))
    grads, _ = engine.per_sample(*rows, labels=y)
    reference = copy.deepcopy(model)
    ref = list(reference.parameters())
    encoder = {id(p) for p in model.encoders.parameters()}
    for i in range(len(y)):
        reference.zero_grad(set_to_none=True)
        modal_objective(reference, [r[i:i + 1] for r in rows], y[i:i + 1]).backward()
        for j, p in enumerate(engine.params):
            k = [id(q) for q in model.parameters()].index(id(p))
            want = ref[k].grad if ref[k].grad is not None else torch.zeros_like(p)
            got = grads[j][i] if grads[j] is not None else torch.zeros_like(p)
            assert (got - want).abs().max().item() <= 1e-9 * (1 + want.abs().max().item())
            if id(p) in encoder and i == 1:  # δ = 0: the encoder gets exactly nothing from this patient
                assert got.abs().max().item() == 0.0
    moved = [grads[j][0].abs().max().item() for j, p in enumerate(engine.params) if id(p) in encoder]
    assert max(moved) > 0  # a patient with the waveform moves the encoder (the check can fail)


def _config(tmp_path, selection: bool = False, **privacy) -> SimulationConfig:
    return SimulationConfig.model_validate({
        "selection": {"enabled": selection, "candidates": []},
        "federation": {"rounds": 2, "secure_mode": "masked", "local_epochs": 1, "min_clients": 3, "strategy": "fedsgd"},
        "model": {"hidden": 8, "modalities": ["waveform"]}, "graph": {"k_similar": 0},
        "privacy": {"enabled": True, "epsilon_budget": 50.0, "noise_multiplier": 1.0, "clip_norm": 1.0,
                    "state_dir": str(tmp_path / "state"), **privacy},
        "dictionary": str(ts.DICTIONARY_PATH), "output": str(tmp_path / "out")})


def test_a_modality_hospital_trains_under_local_dp_with_its_ledger(sites, tmp_path):
    d, out = sites
    t, signals = out[0]
    cfg = _config(tmp_path, batch_size=8).hospital_config()
    task = build_modality_task(t, dictionary=d, config=cfg, signals=signals, identity=Identity.generate(t.site))
    assert len(task.trainer.dataset.tensors) == 6  # star (3), signal, flag, label: one row a patient
    before = task.modules.get("modality/waveform/encoder").copy()
    result = task.train(round_=0, epochs=1, plan_options={})
    assert result.ledger is not None and 0 < result.ledger.epsilon < 50
    assert not np.allclose(before, task.modules.get("modality/waveform/encoder"))
    assert np.isfinite(task.predict()).all()


def test_distributed_dp_for_modalities_needs_the_signals(sites, tmp_path):
    from clinograph.sdk.federation.build import build_task

    d, out = sites
    t, _ = out[0]
    cfg = _config(tmp_path, mode="distributed", sample_rate=1.0, min_honest=2).hospital_config()
    with pytest.raises(ConfigError, match="needs the hospital's signals"):
        build_task(t, dictionary=d, config=cfg, identity=Identity.generate(t.site))


def test_a_modality_federation_runs_under_distributed_dp_with_private_selection(sites, tmp_path):
    d, out = sites
    signals = {t.site: s for t, s in out}
    cfg = _config(tmp_path, selection=True, mode="distributed", sample_rate=1.0, min_honest=2)

    def task(table, hconf):
        built = build_modality_task(table, dictionary=d, config=hconf, signals=signals[table.site],
                                    state_dir=tmp_path / "state" / table.site, identity=Identity.generate(table.site))
        assert isinstance(built, ModalityNSFLTask) and "modality/waveform/encoder" in built.trainer.columns.modules
        return built

    simulate([t for t, _ in out], d, cfg, audit_dir=tmp_path / "audit", task_factory=task)
    entries = [json.loads(x) for x in (tmp_path / "audit" / "audit.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in entries]
    assert "hospital_refused" not in kinds and "update_rejected" not in kinds and "round_aborted" not in kinds
    checks = [e["payload"] for e in entries if e["kind"] == "noise_check"]
    assert len(checks) == 3 and all(c["passed"] and c["contributors"] == 3 for c in checks)
