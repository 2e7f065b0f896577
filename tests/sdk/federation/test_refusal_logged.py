"""A hospital keeps its signed refusal of a plan and refuses a later plan whose audit proof shows
the server left it out of the log (SECURITY.md, "Audited artefacts"). Before: a server could
drop a hospital's ``hospital_refused`` entry and still write a log that verifies; the hospital
kept no copy and checked nothing.

Real parts: the SDK's HospitalClient with its state directory (the anchor), the in-process
transport's :func:`answer` (which seals the refusal), a real signed AuditTrail on the server
side whose entries the plans prove (secure/audit/consistency.py). The hostile server is the one
that does not write the entry."""

from __future__ import annotations

import json

import pytest
from clinograph.sdk.config import ReleaseSection
from clinograph.sdk.federation.anchor import FILENAME
from clinograph.sdk.federation.client import HospitalClient
from clinograph.sdk.federation.member import FederationMember, MemberCandidate
from clinograph.secure.audit import AuditTrail
from clinograph.secure.masking.params import masked_plan_options
from clinograph.secure.messages import RoundPlan
from clinograph.secure.refusals import REFUSAL_PART, HospitalRefusal
from clinograph.secure.runtime.transport import answer
from clinograph.secure.state import state_digest
from clinograph.secure.wire import open_envelope, parse_envelope, seal
from test_plan_downgrade import ME, SERVER, CountingTask

from clinograph.core.spec import ModuleKind

N = 5  # participants: the default masked threshold is 4; a plan with t = 3 is refused (test_plan_downgrade)


def _trail(tmp_path, *, enrol: bool = True) -> AuditTrail:
    """The server's audit trail; ``enrol``: its manifest names this hospital's key (as a run's does), so the
    refusal envelopes it stores are recorded as validly signed."""
    trail = AuditTrail(tmp_path / "audit", identity=SERVER)
    if enrol:
        trail.record("manifest", {"federation_id": "fed", "server": {"name": SERVER.name,
                                                                      "public_key": SERVER.public.b64()},
                                  "hospitals": {ME.name: ME.public.b64()}, "dictionary_hash": "d" * 64,
                                  "secure_mode": "masked", "strategy": "fedavg", "dp_policy": None,
                                  "spec_digest": "0" * 64, "insecure_options": [], "environment": "development"})
    return trail


def _hospital(state_dir, *, member: bool = False) -> HospitalClient | FederationMember:
    """The SDK's hospital: one client, or the participant of a run of candidate models around it."""
    def build(federation_id: str, rounds: int | None) -> HospitalClient:
        return HospitalClient(task=CountingTask(), identity=ME, server=SERVER.public, peers={},
                              dictionary_hash="d" * 64, federation_id=federation_id, release=ReleaseSection(),
                              state_dir=state_dir)

    if not member:
        return build("fed", None)
    return FederationMember(identity=ME, server=SERVER.public, federation_id="fed",
                            candidates=[MemberCandidate(name="model", overrides="{}", build=build)])


def _plan(hospital: HospitalClient, trail: AuditTrail, round_: int, *, threshold: int = 4,
          proof_from: int | None = None) -> bytes:
    task, head = hospital.task, trail.head
    proof = {} if proof_from is None else {"audit.proof_from": proof_from,
                                           "audit.proof": trail.segment(proof_from).decode("ascii")}
    plan = RoundPlan(federation_id="fed", round=round_, participants=("h00", *(f"h{i:02d}" for i in range(1, N))),
                     spec=task.modules.spec(version=1), dictionary_hash="d" * 64, secure_mode="masked",
                     strategy="fedavg", min_clients=2, local_epochs=1,
                     global_state_digest=state_digest(task.modules.state(ModuleKind.SHARED)),
                     options={**masked_plan_options(n_clients=N, threshold=threshold, clip=1.0), "weight.max": 1.0,
                              "audit.seq": head.seq, "audit.head": head.hash, **proof})
    return seal(plan, SERVER)


def _send(hospital: HospitalClient, plan: bytes, round_: int) -> dict[str, bytes]:
    parts, why, _ = answer(hospital, hospital.name, "plan", {"data": plan}, round_=round_)
    assert parts is not None, why
    return parts


def _refusal(parts: dict[str, bytes]) -> HospitalRefusal:
    return open_envelope(parse_envelope(parts[REFUSAL_PART]), sender=ME.public, model=HospitalRefusal)


@pytest.mark.parametrize("member", [False, True], ids=["client", "member"])
def test_a_later_plan_must_prove_the_server_logged_the_hospitals_refusal(tmp_path, member):
    trail = _trail(tmp_path)
    trail.record("test_event", {"round": 0})
    hospital = _hospital(tmp_path / "h00", member=member)
    assert REFUSAL_PART not in _send(hospital, _plan(hospital, trail, 0), 0)  # round 0 trained, its plan anchored
    anchored = trail.head.seq

    trail.record("test_event", {"round": 1})
    refused = _send(hospital, _plan(hospital, trail, 1, threshold=3, proof_from=anchored), 1)
    assert "below this hospital's rule" in _refusal(refused).reason and hospital.task.trained == 1
    kept = json.loads((tmp_path / "h00" / FILENAME).read_text())["anchors"]
    (record,) = kept.values()
    assert [(r["round"], r["logged_at"]) for r in record["refusals"]] == [(1, None)]  # the hospital's own copy
    digest = parse_envelope(refused[REFUSAL_PART]).digest()
    assert record["refusals"][0]["digest"] == digest

    # a server that leaves the refusal out of its log: the next plan's proof shows it, and the hospital refuses
    trail.record("test_event", {"round": 1, "note": "no hospital_refused entry"})
    omitted = _send(hospital, _plan(hospital, trail, 2, proof_from=anchored), 2)
    assert _refusal(omitted).error == "RefusalOmitted"
    assert f"does not hold the refusal(s) this hospital signed of the plan of round(s) 1 (refusal digest(s) " \
           f"{digest[:16]}" in _refusal(omitted).reason
    assert hospital.task.trained == 1  # nothing trained for that server
    # so long as the log holds neither, every later plan is refused, naming both
    again = _send(hospital, _plan(hospital, trail, 3, proof_from=anchored), 3)
    assert "round(s) 1, 2 " in _refusal(again).reason and hospital.task.trained == 1

    # once the log holds the hospital's signed statement that the entry is missing (a server that lost it in a
    # crash logs that refusal like any other), the hospital follows the server again
    _log(trail, again)
    assert REFUSAL_PART not in _send(hospital, _plan(hospital, trail, 4, proof_from=anchored), 4)
    assert hospital.task.trained == 2
    (record,) = json.loads((tmp_path / "h00" / FILENAME).read_text())["anchors"].values()
    assert [r["logged_at"] for r in record["refusals"]] == [trail.head.seq] * 3
    assert record["refusals"][2]["discloses"] == [digest, parse_envelope(omitted[REFUSAL_PART]).digest()]
    trail.close()


def _refused_in_round_1(tmp_path, *, enrol: bool = True):
    """A trail, a hospital that took round 0, the anchor it holds, and its refusal of round 1's plan."""
    trail = _trail(tmp_path, enrol=enrol)
    trail.record("test_event", {"round": 0})
    hospital = _hospital(tmp_path / "h00")
    _send(hospital, _plan(hospital, trail, 0), 0)
    anchored = trail.head.seq
    return trail, hospital, anchored, _send(hospital, _plan(hospital, trail, 1, threshold=3, proof_from=anchored), 1)


def test_a_refusal_the_server_logged_settles_it(tmp_path):
    trail, hospital, anchored, refused = _refused_in_round_1(tmp_path)
    _log(trail, refused)  # as the round loop writes it (secure/runtime/participation.py)
    assert REFUSAL_PART not in _send(hospital, _plan(hospital, trail, 2, proof_from=anchored), 2)
    assert hospital.task.trained == 2
    trail.close()


def _log(trail: AuditTrail, reply: dict[str, bytes]) -> None:
    stored = trail.store_envelope(reply[REFUSAL_PART], kind="hospital_refusal", sender="h00")
    trail.record("hospital_refused", {"round": 1, "stage": "plan", "client": "h00", "reason": "refused",
                                      "signed": True, "final": False, "refusal_sha256": stored})


def test_a_refusal_of_a_plan_that_did_not_extend_the_anchored_history_is_not_held_against_later_plans(tmp_path):
    """A plan from a rolled-back or forked server is refused by the anchor itself; its refusal goes
    to that server's log, not the one the hospital follows, so it is not kept as owed."""
    trail = _trail(tmp_path)
    trail.record("test_event", {"round": 0})
    hospital = _hospital(tmp_path / "h00")
    _send(hospital, _plan(hospital, trail, 0), 0)
    anchored = trail.head.seq
    trail.record("test_event", {"round": 1})
    forked = _send(hospital, _plan(hospital, trail, 1), 1)  # a later head without its proof
    assert _refusal(forked).error == "RollbackDetected"
    (record,) = json.loads((tmp_path / "h00" / FILENAME).read_text())["anchors"].values()
    assert record.get("refusals", []) == []
    assert REFUSAL_PART not in _send(hospital, _plan(hospital, trail, 1, proof_from=anchored), 1)
    trail.close()


@pytest.mark.parametrize("records", ['"x"', '[{"round": "1", "digest": "ab"}]',
                                     '[{"round": 1, "digest": "' + "a" * 64 + '", "discloses": [1]}]'])
def test_altered_refusal_records_are_an_integrity_error(tmp_path, records):
    trail = _trail(tmp_path)
    trail.record("test_event", {"round": 0})
    hospital = _hospital(tmp_path / "h00")
    _send(hospital, _plan(hospital, trail, 0), 0)
    anchored = trail.head.seq
    path = tmp_path / "h00" / FILENAME
    data = json.loads(path.read_text())
    (key,) = data["anchors"]
    data["anchors"][key]["refusals"] = json.loads(records)
    path.write_text(json.dumps(data))
    trail.record("test_event", {"round": 1})
    reply = _send(_hospital(tmp_path / "h00"), _plan(hospital, trail, 1, proof_from=anchored), 1)
    assert _refusal(reply).error == "IntegrityError" and "malformed refusal records" in _refusal(reply).reason
    trail.close()


@pytest.mark.parametrize("stage", ["stage", "end"])
def test_a_refused_stage_or_round_end_message_must_be_logged_too(tmp_path, stage):
    """Before, only refusals of plans were kept: a server could send a bad stage (or round-end)
    message, drop the hospital's signed refusal of it from the log, and go on with a log that
    verifies."""
    trail = _trail(tmp_path)
    trail.record("test_event", {"round": 0})
    hospital = _hospital(tmp_path / "h00")
    _send(hospital, _plan(hospital, trail, 0), 0)
    anchored = trail.head.seq
    bad = seal(RoundPlan.model_construct(), SERVER) if stage == "end" else b"not an envelope"
    parts, why, _ = answer(hospital, hospital.name, stage, {"data" if stage == "stage" else "model": bad}, round_=0)
    assert parts is not None and REFUSAL_PART in parts, why
    trail.record("test_event", {"round": 0, "note": "no hospital_refused entry"})
    omitted = _send(hospital, _plan(hospital, trail, 1, proof_from=anchored), 1)
    assert _refusal(omitted).error == "RefusalOmitted" and "of the plan of round(s) 0" in _refusal(omitted).reason
    assert hospital.task.trained == 1
    _log(trail, parts)  # both refusals in the log (an honest server logs every refusal it receives)
    _log(trail, omitted)
    assert REFUSAL_PART not in _send(hospital, _plan(hospital, trail, 2, proof_from=anchored), 2)
    assert hospital.task.trained == 2
    trail.close()


@pytest.mark.parametrize("forged", ["digest only", "another client", "unsigned"])
def test_an_entry_that_names_the_refusals_digest_without_logging_the_refusal_does_not_settle_it(tmp_path, forged):
    """hadv5: before, any ``hospital_refused`` entry naming the refusal's digest settled it -- a server could write
    one with words of its own ('network timeout'), under another hospital's name, and never store the signed
    envelope; the hospital followed it and `audit verify` passed. The entry must now follow the stored envelope
    and name this hospital."""
    trail, hospital, anchored, refused = _refused_in_round_1(tmp_path)
    digest = parse_envelope(refused[REFUSAL_PART]).digest()
    if forged != "digest only":
        trail.store_envelope(refused[REFUSAL_PART], kind="hospital_refusal", sender="h00")
    trail.record("hospital_refused", {"round": 1, "stage": "plan", "client": "h01" if forged == "another client" else
                                      "h00", "reason": "network timeout", "signed": forged != "unsigned",
                                      "final": False, "refusal_sha256": digest})
    omitted = _send(hospital, _plan(hospital, trail, 2, proof_from=anchored), 2)
    assert _refusal(omitted).error == "RefusalOmitted" and digest[:16] in _refusal(omitted).reason
    assert hospital.task.trained == 1
    trail.close()


@pytest.mark.parametrize("stored", ["invalid signature", "hospital not enrolled"])
def test_a_refusal_stored_without_a_valid_signature_does_not_settle_it(tmp_path, stored):
    """hadv5's leftover: the hospital took an ``envelope`` entry of its refusal's digest as the refusal logged,
    whatever signature status the entry recorded. A server could store a copy with a broken signature (the
    digest is the payload's, so it is the same) or log it under a manifest without the hospital's key: the log
    then holds, as far as an auditor can tell, a forgery in the hospital's name (``clinograph audit verify``
    reports the ``hospital_refused`` entry naming it), yet the hospital followed the server. Now the copy must
    be recorded ``valid``, as the verifier requires. Seen failing before the fix (both cases trained)."""
    from clinograph.secure.audit.read import payloads
    from clinograph.secure.wire import Envelope

    trail, hospital, anchored, refused = _refused_in_round_1(tmp_path, enrol=stored == "invalid signature")
    if stored == "invalid signature":
        env = parse_envelope(refused[REFUSAL_PART])
        refused = {REFUSAL_PART: Envelope(sender=env.sender, kind=env.kind, payload=env.payload,
                                          signature=bytes([env.signature[0] ^ 1]) + env.signature[1:]).to_bytes()}
    _log(trail, refused)
    trail.checkpoint()
    status = payloads(tmp_path / "audit", "envelope")[-1]["signature"]
    assert status == ("invalid" if stored == "invalid signature" else "unknown_sender")
    omitted = _send(hospital, _plan(hospital, trail, 2, proof_from=anchored), 2)
    assert _refusal(omitted).error == "RefusalOmitted" and "of the plan of round(s) 1" in _refusal(omitted).reason
    assert hospital.task.trained == 1
    trail.close()
