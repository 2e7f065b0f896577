"""Survival under patient-level local DP (sdk/privacy/survival.py): the hazard likelihood is
one term a patient, so per-patient gradients of the survival head (star engine and Opacus hooks)
equal a per-patient loop for every trainable parameter, including the baseline hazard β; a DP
round through the NS-FL task records ε in the hospital's ledger."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from clinograph.sdk.config import HospitalConfig, SimulationConfig
from clinograph.sdk.federation.nsfl_task import NSFLTask
from clinograph.sdk.federation.split import hospital_split
from clinograph.sdk.graph.star import star_batch
from clinograph.sdk.model.heads import SurvivalNSFLModel
from clinograph.sdk.model.nsfl import NSFLConfig
from clinograph.sdk.privacy import unused_star_parameters
from clinograph.sdk.privacy.per_patient import PerPatientClipper, star_probe
from clinograph.sdk.privacy.survival import (
    HazardClipper,
    hazard_loss_sum,
)
from clinograph.sdk.training.survival import interval_targets
from sdk_helpers import SURVIVAL_TARGET, lung_survival

from clinograph.core.identity import Identity

pytest.importorskip("lifelines")

TARGET = SURVIVAL_TARGET
lung = lung_survival


def _model_and_batch(n: int = 9):
    d, tables = lung()
    t = tables[0]
    model = SurvivalNSFLModel(len(d.node_ids()), NSFLConfig(hidden=8, init_seed=5), intervals=5).double()
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():  # off the symmetric init, so no gradient is trivially equal
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    for name, p in model.named_parameters():
        if name in unused_star_parameters(model):
            p.requires_grad_(False)
    stars = star_batch(t, k_similar=0)
    ev = t.survival.event
    rows = torch.as_tensor(np.sort(np.r_[np.flatnonzero(ev == 1)[:5], np.flatnonzero(ev == 0)[:n - 5]]))
    fi, x, m = stars.feature_index[rows], stars.values[rows].double(), stars.mask[rows].clone()
    m[0] = False  # a patient with no observed feature
    breaks = np.array([3, 6, 12, 24, 36]) * 30.44
    s, e = interval_targets(t.survival.time[rows.numpy()], ev[rows.numpy()], breaks)
    assert (e.sum(1) == 0).any() and (e.sum(1) == 1).any()  # censored and observed patients both
    return model, (fi, x, m), torch.as_tensor(np.concatenate([s, e], axis=1))


def _loop(model, inputs, y, trainable):
    out = []
    for i in range(len(y)):
        model.zero_grad(set_to_none=True)
        hazard_loss_sum(model(*(a[i:i + 1] for a in inputs)), y[i:i + 1]).backward()
        out.append({n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in trainable})
    return out


def test_star_engine_per_patient_gradients_of_the_hazard_loss_match_a_loop():
    model, inputs, y = _model_and_batch()
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert "hazard_baseline.bias" in dict(trainable)
    fi, x, m = star_probe(model.n_features)
    clipper = HazardClipper(model, probe=(fi, x.double(), m))  # the construction-time self-check passes
    grads, _ = clipper.per_sample(*inputs, labels=y)
    names = {id(p): n for n, p in trainable}
    expected = _loop(model, inputs, y, trainable)
    for p, g in zip(clipper.params, grads, strict=True):
        name = names[id(p)]
        for i in range(len(y)):
            got = g[i] if g is not None else torch.zeros_like(p)
            err = (got - expected[i][name]).abs().max().item()
            assert err <= 1e-8, f"{name}, patient {i}: per-patient gradient off by {err:.2e}"
    # the clipped sum is Σ_i g_i min(1, C/‖g_i‖) over the same per-patient gradients
    flat = torch.stack([torch.cat([expected[i][names[id(p)]].reshape(-1) for p in clipper.params])
                        for i in range(len(y))])
    factor = (0.5 / (flat.norm(dim=1) + 1e-6)).clamp(max=1.0)
    torch.testing.assert_close(clipper.clipped_sum(*inputs, labels=y, clip_norm=0.5).summed, factor @ flat)


def test_loop_comparison_can_fail_on_a_coupled_loss():
    """Negative control: a loss that couples patients (a batch-mean baseline, as Cox's risk sets
    do) gives per-patient gradients that differ from the loop, so the tests above can fail."""
    model, inputs, y = _model_and_batch()

    def coupled(mo, inp, labels):
        logits = mo(*inp)
        return hazard_loss_sum(logits - logits.mean(0, keepdim=True), labels)

    clipper = PerPatientClipper(model, objective=coupled)
    got, _ = clipper.per_sample(*inputs, labels=y)
    i = next(j for j, p in enumerate(clipper.params) if p is model.hazard_baseline.bias)
    want = _loop(model, inputs, y, [("b", model.hazard_baseline.bias)])[2]["b"]
    assert (got[i][2] - want).abs().max().item() > 1e-3


@pytest.mark.parametrize("clipping", ["flat", "adaptive"])
def test_dp_round_on_a_survival_target_records_epsilon(tmp_path, clipping):
    d, tables = lung()
    t = tables[0]
    conf = SimulationConfig.model_validate({
        "federation": {"rounds": 2, "min_clients": 2}, "model": {"hidden": 8}, "graph": {"k_similar": 0},
        "training": {"lr": 0.02}, "target": TARGET,
        "privacy": {"enabled": True, "noise_multiplier": 1.0, "batch_size": 16, "epsilon_budget": 50.0,
                    "clipping": clipping, "state_dir": str(tmp_path)}}).hospital_config()
    split = hospital_split(t.labels, site=t.site, test_fraction=0.3, validation_fraction=0.2, seed=0)
    task = NSFLTask(t, dictionary=d, config=conf, split=split, state_dir=tmp_path, signer=Identity.generate(t.site))
    before = {k: v.clone() for k, v in task.model.state_dict().items()}
    out = task.train(round_=0, epochs=1, plan_options={})
    e = out.ledger
    assert e.steps == task.trainer.planned_steps(1) and e.noise_multiplier == 1.0
    assert e.epsilon == pytest.approx(task.trainer.ledger.epsilon()) and 0 < e.epsilon < 50
    assert np.isfinite(out.loss) and out.loss > 0
    assert not torch.equal(before["hazard_baseline.bias"], task.model.state_dict()["hazard_baseline.bias"])
    m = task.evaluate("test")
    assert 0 <= m["cindex"] <= 1 and m["known"] <= m["n"]


def test_ew_is_refused_for_survival_and_local_and_distributed_dp_are_accepted():
    HospitalConfig(target=TARGET, privacy={"enabled": True, "mode": "distributed"})  # tests/sdk/privacy/test_distributed_tasks.py
    with pytest.raises(ValueError, match="grad_sample_mode = 'ew'"):
        HospitalConfig(target=TARGET, privacy={"enabled": True, "grad_sample_mode": "ew"})
    HospitalConfig(target=TARGET, privacy={"enabled": True})  # local DP: accepted
