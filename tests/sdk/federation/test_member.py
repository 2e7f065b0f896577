"""A hospital across a whole run: it trains only candidates its own config lists, for the run's
planned rounds, and keeps the candidate the server's signed choice names."""

import pytest
from clinograph.sdk.config import HospitalConfig
from clinograph.sdk.federation.member import (
    FederationMember,
    MemberCandidate,
    canonical,
    with_horizon,
)
from clinograph.secure.runtime.models import RunChosen, RunStart, overrides_digest, run_id
from clinograph.secure.wire import seal

from clinograph.core.errors import PrivacyError, ProtocolError
from clinograph.core.identity import Identity

SERVER, HOSPITAL = Identity.generate("server"), Identity.generate("h1")


class _Built:
    def __init__(self, fid, rounds):
        self.federation_id, self.rounds = fid, rounds


def _member(names=("wide", "shape")):
    cands = [MemberCandidate(name=n, overrides=canonical({"model": {"n": i}}), build=_Built) for i, n in enumerate(names)]
    return FederationMember(identity=HOSPITAL, server=SERVER.public, federation_id="fed", candidates=cands), cands


def _start(cand, *, count=2, index=0, rounds=7, signer=SERVER, federation="fed", name=None):
    msg = RunStart(federation_id=federation, run_id=run_id(federation, name or cand.name, count=count),
                   candidate=name or cand.name, overrides_sha256=overrides_digest(cand.overrides), index=index,
                   count=count, rounds=rounds)
    return {"data": seal(msg, signer)}


def test_run_start_builds_the_named_candidate_for_the_planned_rounds_and_run_chosen_keeps_it():
    m, cands = _member()
    assert m.on_setup("run/start", _start(cands[1], index=1)) == {"ok": b"1"}
    assert m.active.federation_id == "fed-shape" and m.active.rounds == 7
    chosen = seal(RunChosen(federation_id="fed", run_id="fed-shape", candidate="shape"), SERVER)
    m.on_setup("run/chosen", {"data": chosen})
    assert m.chosen == "shape" and m.client is m.clients["shape"]


def test_a_candidate_the_hospital_did_not_configure_is_refused():
    m, cands = _member()
    other = MemberCandidate(name="shape", overrides=canonical({"model": {"deep": False}}), build=_Built)
    with pytest.raises(ProtocolError, match=r"Candidate 'shape' has other overrides than the one this hospital's "
                                             r"config lists \(wide, shape\)"):
        m.on_setup("run/start", _start(other))
    with pytest.raises(ProtocolError, match=r"Candidate 'gnn' is not one this hospital's config lists"):
        m.on_setup("run/start", _start(cands[0], name="gnn"))
    with pytest.raises(ProtocolError, match=r"names run .* of 3 candidate\(s\); this hospital's config lists 2"):
        m.on_setup("run/start", _start(cands[0], count=3))
    with pytest.raises(ProtocolError, match=r"run/start for federation 'other'"):
        m.on_setup("run/start", _start(cands[0], federation="other"))
    with pytest.raises(Exception, match="signature|Signature"):
        m.on_setup("run/start", _start(cands[0], signer=Identity.generate("server")))
    assert m.clients == {}  # nothing was built for a refused start


def test_a_choice_of_a_candidate_not_trained_is_refused():
    m, cands = _member()
    chosen = seal(RunChosen(federation_id="fed", run_id="fed-shape", candidate="shape"), SERVER)
    with pytest.raises(ProtocolError, match="which this hospital did not train"):
        m.on_setup("run/chosen", {"data": chosen})


def test_the_dp_horizon_comes_from_the_plan_or_the_hospital_refuses():
    dp = HospitalConfig.model_validate({"privacy": {"enabled": True}, "graph": {"k_similar": 0}})
    assert with_horizon(dp, 12).privacy.planned_rounds == 12  # calibrated for the run's rounds
    mine = HospitalConfig.model_validate({"privacy": {"enabled": True, "planned_rounds": 5}, "graph": {"k_similar": 0}})
    assert with_horizon(mine, 5).privacy.planned_rounds == 5 and with_horizon(mine, 3).privacy.planned_rounds == 5
    with pytest.raises(PrivacyError, match=r"The server plans 8 training rounds; this hospital's \[privacy\] "
                                           r"planned_rounds = 5 .* run out by round 5"):
        with_horizon(mine, 8)
    plain = HospitalConfig()
    assert with_horizon(plain, 8) is plain and with_horizon(dp, None) is dp


def test_a_run_whose_hospitals_refuse_its_length_ends_naming_them(tmp_path):
    from clinograph.sdk.config import SimulationConfig
    from clinograph.sdk.federation.simulate import simulate
    from sdk_helpers import small_tables

    tables = small_tables()
    cfg = SimulationConfig.model_validate({
        "federation": {"rounds": 3, "secure_mode": "masked", "min_clients": 2, "local_epochs": 1},
        "model": {"hidden": 8}, "graph": {"k_similar": 0},
        "privacy": {"enabled": True, "planned_rounds": 2, "noise_multiplier": 1.0, "state_dir": str(tmp_path / "s")},
        "output": str(tmp_path / "out")})
    with pytest.raises(ProtocolError, match=r"Only 0 hospital\(s\) accepted the run of candidate 'model'.*"
                                            r"The server plans 3 training rounds; this hospital's \[privacy\] "
                                            r"planned_rounds = 2"):
        simulate(tables, tables[0].dictionary, cfg, audit_dir=tmp_path / "audit")


@pytest.mark.parametrize("hostile", ["[]", "[" * 100_000 + "]" * 100_000])
def test_a_hostile_position_file_is_an_integrity_error_not_a_traceback(tmp_path, hostile):
    """Adversarial rerun of issue 31: the kept run position as a JSON list gave an AttributeError,
    deeply nested a RecursionError, at the restarted hospital's start-up."""
    from clinograph.core.errors import IntegrityError

    cands = [MemberCandidate(name="wide", overrides=canonical({}), build=_Built)]
    (tmp_path / "position.json").write_text(hostile)
    with pytest.raises(IntegrityError, match="is not this hospital's run position"):
        FederationMember(identity=HOSPITAL, server=SERVER.public, federation_id="fed", candidates=cands,
                         position=tmp_path / "position.json", run_key="run-1")
