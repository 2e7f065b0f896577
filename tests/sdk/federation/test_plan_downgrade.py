"""A server's plan that weakens the masking below what a hospital agreed to is refused before the
hospital trains (helper hadv3's adversarial pass): a lower masked threshold t than its own rule
(``[release] masked_threshold``, unset: the default t for the round's size), or a sparser
neighbour graph than the protocol fixes. The refusal is a ClinographError, which the transport
turns into the hospital's signed refusal (audited as ``hospital_refused``)."""

from __future__ import annotations

import pytest
import torch
from clinograph.sdk.config import ReleaseSection
from clinograph.sdk.federation.client import HospitalClient
from clinograph.sdk.model.modules import ModuleMap
from clinograph.sdk.training.trainer import TrainOutcome
from clinograph.secure.masking.params import masked_defaults, masked_plan_options
from clinograph.secure.messages import RoundPlan
from clinograph.secure.state import state_digest
from clinograph.secure.wire import seal

from clinograph.core.errors import ConfigError, ProtocolError
from clinograph.core.identity import Identity
from clinograph.core.spec import ModuleKind

SERVER = Identity.generate("server")
ME = Identity.generate("h00")


class CountingTask:
    """One shared linear module; counts the rounds it trained (a refused plan trains none)."""

    name = "toy"

    def __init__(self):
        self.modules = ModuleMap()
        self.modules.add_submodule("head", ModuleKind.SHARED, torch.nn.Linear(2, 1))
        self.trained = 0

    num_samples = 8

    def train(self, *, round_, epochs, plan_options):
        self.trained += 1
        return TrainOutcome(loss=0.0, used_similar_to=False)

    def trained_modules(self, outcome):
        return self.modules.names(ModuleKind.SHARED)


def _hospital(release: ReleaseSection) -> HospitalClient:
    task = CountingTask()
    return HospitalClient(task=task, identity=ME, server=SERVER.public, peers={}, dictionary_hash="d" * 64,
                          federation_id="fed", release=release)


def _plan(hospital: HospitalClient, n: int, *, threshold: int, round_: int = 0, secure_mode: str = "masked",
          **options) -> bytes:
    people = ("h00", *(f"h{i:02d}" for i in range(1, n)))
    task = hospital.task
    plan = RoundPlan(federation_id="fed", round=round_, participants=people, spec=task.modules.spec(version=1),
                     dictionary_hash="d" * 64, secure_mode=secure_mode, strategy="fedavg", min_clients=2, local_epochs=1,
                     global_state_digest=state_digest(task.modules.state(ModuleKind.SHARED)),
                     options={**masked_plan_options(n_clients=n, threshold=threshold, clip=1.0), "weight.max": 1.0,
                              **options})
    return seal(plan, SERVER)


def test_a_threshold_below_the_hospitals_rule_is_refused_before_training():
    # before: the hospital accepted any t in ((k+1)/2, k+1], so a server could lower t from the default 4 to 3 at
    # n = 5 (one colluding neighbour fewer reveals an update) without any hospital's consent
    assert masked_defaults(5).threshold == 4
    default = _hospital(ReleaseSection())
    with pytest.raises(ProtocolError, match=r"masked.threshold t = 3 is below this hospital's rule \(unset "
                                            r"\[release\] masked_threshold: the default t = 4 for 5 participants\)"):
        default.on_plan(_plan(default, 5, threshold=3))
    assert default.task.trained == 0
    default.on_plan(_plan(default, 5, threshold=4, round_=1))  # the default itself is accepted
    assert default.task.trained == 1
    agreed = _hospital(ReleaseSection(masked_threshold=3))  # a hospital that agreed to t = 3
    agreed.on_plan(_plan(agreed, 5, threshold=3))
    assert agreed.task.trained == 1
    strict = _hospital(ReleaseSection(masked_threshold=5))
    with pytest.raises(ProtocolError, match=r"below this hospital's rule \(\[release\] masked_threshold = 5\)"):
        strict.on_plan(_plan(strict, 5, threshold=4))
    assert strict.task.trained == 0


def test_a_sparser_neighbour_graph_is_refused_before_training():
    hospital = _hospital(ReleaseSection(masked_threshold=2))  # even a hospital that accepts t = 2
    with pytest.raises(ConfigError, match=r"masked.neighbours = 2 is invalid for 10 participants: it must be 4 "):
        hospital.on_plan(_plan(hospital, 10, threshold=4, **{"masked.neighbours": 2, "masked.threshold": 2}))
    assert hospital.task.trained == 0


def test_a_plan_under_a_secure_mode_the_hospital_did_not_list_is_refused_before_training():
    """hadv3 found it: a hospital accepted any non-plaintext mode, so a server could switch a masked federation
    to single-key ckks (where the server with one colluding hospital decrypts every update) without consent."""
    for mode in ("ckks", "ckks_threshold"):
        default = _hospital(ReleaseSection())
        with pytest.raises(ProtocolError, match=rf"the server plans secure_mode '{mode}'; this hospital joins rounds "
                                                r"only under 'masked' \(\[release\] secure_modes\)"):
            default.on_plan(_plan(default, 5, threshold=4, secure_mode=mode))
        assert default.task.trained == 0
    both = _hospital(ReleaseSection(secure_modes=("masked", "ckks")))
    both.on_plan(_plan(both, 5, threshold=4))
    assert both.task.trained == 1
    with pytest.raises(ProtocolError, match=r"only under 'masked', 'ckks' \("):
        both.on_plan(_plan(both, 5, threshold=4, round_=1, secure_mode="ckks_threshold"))
    assert both.task.trained == 1


@pytest.mark.parametrize(("modes", "message"), [
    (("masked", "insecure_plaintext"), "not a secure mode: .* insecure_accept_plaintext = true"),
    (("masked", "ckks2"), r"Unknown secure mode 'ckks2'\. Registered: "),
    ((), "at least 1 item")])
def test_secure_modes_lists_registered_secure_modes_only(modes, message):
    from clinograph.core.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        ReleaseSection(secure_modes=modes)


def test_published_weights_that_make_the_sum_one_hospitals_update_are_refused():
    """Before, a plan could fix weight/h00 = 1 and every other weight at 1e-12: the masked sum the server
    learns was then h00's update, without any colluding hospital (found by probing HospitalClient)."""
    isolating = {"weight/h00": 1.0, **{f"weight/h{i:02d}": 1e-12 for i in range(1, 5)}}
    default = _hospital(ReleaseSection())
    with pytest.raises(ProtocolError, match=r"its update would be 100\.0% of the sum the server learns \(this "
                                            r"hospital's rule: at most 90%, \[release\] max_weight_share\)"):
        default.on_plan(_plan(default, 5, threshold=4, **isolating))
    assert default.task.trained == 0
    equal = {f"weight/h{i:02d}": 0.2 for i in range(5)}  # dq_weighted's first round: equal weights
    default.on_plan(_plan(default, 5, threshold=4, round_=1, **equal))
    assert default.task.trained == 1
    agreed = _hospital(ReleaseSection(max_weight_share=1.0))
    agreed.on_plan(_plan(agreed, 5, threshold=4, **isolating))
    assert agreed.task.trained == 1
    for bad in ("1.0", True, -1.0):  # a ValueError from float() before: not a signed refusal
        with pytest.raises(ProtocolError, match="weight/h00 is not a non-negative number"):
            default.on_plan(_plan(default, 5, threshold=4, round_=2, **{**equal, "weight/h00": bad}))



def test_a_plan_without_the_model_a_hospital_lacks_is_refused_naming_the_catch_up():
    """A plan whose model the hospital does not hold (it missed rounds and the plan came without the
    current model: a ckks server, or another model) is refused before training; the error no longer
    says 'Fetch the current global model before joining' (nothing offers that): it names the catch-up
    the server makes (tests/sdk/federation/test_federation.py, the hospital that missed a round)."""
    hospital = _hospital(ReleaseSection())
    plan = _plan(hospital, 3, threshold=2)  # names the model the hospital was built with ...
    hospital._global = {k: v + 1.0 for k, v in hospital._global.items()}  # ... it holds another (missed a round)
    with pytest.raises(ProtocolError) as refused:
        hospital.on_plan(plan)
    said = str(refused.value)
    assert "does not match the plan's (missed a round?)" in said and "Fetch the current global model" not in said
    assert "sends the current model with the plan to a hospital that missed rounds" in said
    assert hospital.task.trained == 0
