"""A hospital's ModelSelection applies the server's noise-aware rule (selection_step): on the
same releases both keep the same round and stop at the same time; a restart keeps the state."""

from __future__ import annotations

import random

import torch
from clinograph.sdk.training.selection import ModelSelection
from clinograph.secure.runtime.selection import SelectionRule, SelectionStatus, SelectionTracker


def test_hospital_and_server_decide_the_same_on_the_same_releases():
    rng = random.Random(3)
    for case in range(200):
        noise = rng.choice([0.0, 0.05, 0.4])
        patience = rng.choice([0, 3, 5])
        hospital = ModelSelection(patience=patience, min_delta=1e-4)
        server = SelectionTracker(SelectionRule(patience=patience, min_delta=1e-4))
        for r in range(rng.randint(1, 26)):
            loss = 0.7 - 0.01 * r + noise * rng.gauss(0, 1) + (0.8 if rng.random() < 0.1 else 0.0)
            hospital.offer(round_=r, state={"w": torch.full((2,), float(r))})
            hospital.observe(loss, noise)
            server.observe({"a": SelectionStatus(federation_id="fed", round=r, client="a", scored=r, loss=loss,
                                                 noise=noise or None)})
            assert (hospital.best_round, hospital.should_stop) == (server.best_round, server.should_stop), case
            assert hospital.best_state["w"][0].item() == hospital.best_round  # the kept round's own model
            if server.should_stop:
                break


def test_a_restart_keeps_the_noises_and_the_reference():
    s = ModelSelection(patience=5, min_delta=1e-4)
    for r, loss in enumerate([1.0, 0.8, 1.1, 2.9]):
        s.offer(round_=r, state={"w": torch.zeros(1)})
        s.observe(loss, 0.5)
    meta, tensors = s.record()
    t = ModelSelection(patience=5, min_delta=1e-4)
    t.take_back(meta, tensors)
    assert (t.noises, t.low_loss, t.low_noise, t.best_round, t.should_stop) == ([0.5] * 4, 0.8, 0.5, 2, False)
    t.offer(round_=4, state={"w": torch.ones(1)})
    t.observe(2.3, 0.5)  # worse than the reference 0.8 beyond the noise (not than the kept round's 1.1)
    assert t.best_round == 2
