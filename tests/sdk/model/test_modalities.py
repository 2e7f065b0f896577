"""Missing modalities: a hospital without a modality has zero gradient for its encoder and sends nothing for it."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.datasets import timeseries as ts
from clinograph.sdk.federation.build import build_hospital, initial_model, initial_model_for
from clinograph.sdk.federation.modality_task import build_modality_task
from clinograph.sdk.federation.simulate import SimulatedFederation
from clinograph.sdk.ingest import ingest
from clinograph.sdk.model.modalities import ModalityNSFL, modality_module_names
from clinograph.sdk.training import bce
from clinograph.secure.audit import AuditTrail
from clinograph.secure.messages import ClientUpdate
from clinograph.secure.policy import InsecureOptionWarning
from clinograph.secure.runtime import InProcessTransport, build_server
from clinograph.secure.wire import load_payload, parse_envelope

from clinograph.core.errors import ConfigError
from clinograph.core.identity import Identity

# one hospital with the PPG waveform, one with vital-sign series only, one with static variables only
PICK = (0, 2, 4)


@pytest.fixture(scope="module")
def sites():
    hospitals = tuple(replace(ts.MODALITY_GAP_HOSPITALS[i], n_patients=40) for i in PICK)
    d = ts.load_dictionary()
    out = []
    for s in ts.make_timeseries_sites(seed=2, hospitals=hospitals):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = ingest(s.table, schema=s.schema, dictionary=d)
        w, has = ts.waveform_matrix(s, t.patient_ids)
        out.append((t, {"waveform": (w, has)} if has.any() else {}))
    return out


def config(secure_mode: str = "insecure_plaintext") -> SimulationConfig:
    return SimulationConfig.model_validate({
        "federation": {"id": "modalities", "rounds": 1, "secure_mode": secure_mode, "strategy": "fedsgd",
                       "server_lr": 1.0, "min_clients": 3, "local_epochs": 1, "seed": 0},
        "model": {"hidden": 8, "modalities": ["waveform"]}, "graph": {"k_similar": 0},
        "dictionary": str(ts.DICTIONARY_PATH)})


def test_without_the_modality_the_encoder_and_its_relations_have_exactly_zero_gradient(sites):
    (full, sig_full), (vitals, _) = sites[0], sites[1]
    cfg = config().hospital_config()
    n = len(full.dictionary.node_ids())
    for table, signals, expect in ((vitals, {}, False), (full, sig_full, True)):
        task = build_modality_task(table, dictionary=table.dictionary, config=cfg, signals=signals)
        model, stars = task.model, task.trainer.stars
        assert isinstance(model, ModalityNSFL) and model.n_features == n
        model.zero_grad(set_to_none=True)
        bce(model.forward_batch(stars), stars.labels).backward()
        params = [p for m in (model.encoders, model.l1_of_modality, model.l2_of_modality) for p in m.parameters()]
        nonzero = sum(int(torch.count_nonzero(p.grad)) for p in params)
        assert (nonzero > 0) == expect, table.site
    # the modality changes predictions where present (it is used), and only there
    task = build_modality_task(full, dictionary=full.dictionary, config=cfg, signals=sig_full)
    with torch.no_grad():
        with_w = task.model.forward_batch(task.trainer.stars)
        without = task.model.forward_star(full_stars := task.trainer.stars.feature_index, task.trainer.stars.values,
                                          task.trainer.stars.mask)
    assert full_stars.shape[0] == full.n_patients and not torch.allclose(with_w, without)


def _federation(sites, cfg: SimulationConfig, tmp_path) -> SimulatedFederation:
    hconf = cfg.hospital_config()
    tasks = [build_modality_task(t, dictionary=t.dictionary, config=hconf, signals=s) for t, s in sites]
    server_id = Identity.generate("server")
    ids = {t.site: Identity.generate(t.site) for t, _ in sites}
    publics = {n: i.public for n, i in ids.items()}
    hospitals = {t.site: build_hospital(t, dictionary=t.dictionary, config=hconf, identity=ids[t.site],
                                        server=server_id.public, peers=publics, federation_id=cfg.federation.id,
                                        task=task) for (t, _), task in zip(sites, tasks, strict=True)}
    d = sites[0][0].dictionary
    initial = initial_model(tasks[0], dictionary=d)
    assert initial.spec.digest() == initial_model_for(hconf, dictionary=d).spec.digest()  # `clinograph model init`
    audit = AuditTrail(tmp_path / "audit", identity=server_id)
    server = build_server(federation=cfg.federation, identity=server_id, enrolled=publics, initial=initial,
                          audit=audit, dp_policy=None)
    return SimulatedFederation(server=server, hospitals=hospitals, transport=InProcessTransport(hospitals),
                               audit=audit, audit_dir=tmp_path / "audit", dictionary=d)


def test_a_hospital_without_the_modality_sends_nothing_for_it_on_the_wire(sites, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureOptionWarning)
        sim = _federation(sites, config(), tmp_path)
        before = {k: v.copy() for k, v in sim.server.state.items()}
        sim.run_round()
    sim.audit.close()
    sent = {}
    for name, h in sim.hospitals.items():
        for data in h.outgoing:
            env = parse_envelope(data)
            if env.kind == "client_update":
                sent[name] = {t.name for t in load_payload(env, ClientUpdate).modules}
    full, vitals, static = (t.site for t, _ in sites)
    for module in modality_module_names("waveform"):
        assert module in sent[full]
        assert module not in sent[vitals] and module not in sent[static]
        assert not np.array_equal(sim.server.state[module], before[module])  # aggregated from the one sender
    for name in sent:
        assert "head/task" in sent[name] and "gnn/layer1/of_patient" in sent[name]


def test_modalities_refuse_what_they_cannot_do(sites):
    t, s = sites[0]
    cfg = config().hospital_config()
    with pytest.raises(ConfigError, match="not in \\[model\\] modalities"):
        build_modality_task(t, dictionary=t.dictionary, config=cfg, signals={"ecg": s["waveform"]})
    with pytest.raises(ConfigError, match="k_similar"):
        build_modality_task(t, dictionary=t.dictionary, signals=s,
                            config=cfg.model_copy(update={"graph": cfg.graph.model_copy(update={"k_similar": 3})}))
