"""The round loop audits who did what, by name: participation, signed refusals, the run's end."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transport"))
import flower_helpers as fh  # noqa: E402
from clinograph.secure.audit import verify_audit_dir  # noqa: E402
from clinograph.secure.refusals import HospitalRefusal, check_refusal, seal_refusal  # noqa: E402
from clinograph.secure.runtime import InProcessTransport, run_rounds  # noqa: E402
from clinograph.secure.runtime.loop import RoundAborted  # noqa: E402
from clinograph.secure.transport.flower.keyset import init_keyset  # noqa: E402
from clinograph.secure.wire import parse_envelope  # noqa: E402

from clinograph.core.errors import PrivacyBudgetExceeded, ProtocolError  # noqa: E402

HOSPITALS = ("h1", "h2", "h3")


class BudgetHospital(fh.FakeHospital):
    """Refuses every plan from round ``spent_from`` on: its privacy budget is spent."""

    spent_from = 10**6

    def on_plan(self, plan: bytes):
        from clinograph.secure.messages import RoundPlan
        from clinograph.secure.wire import open_envelope

        p = open_envelope(parse_envelope(plan), sender=self.server, model=RoundPlan)
        if p.round >= self.spent_from:
            raise PrivacyBudgetExceeded(f"{self.name}: round {p.round} would spend ε = 9.1 > budget 8.0")
        return super().on_plan(plan)


@pytest.fixture()
def federation(tmp_path):
    from clinograph.secure.enrolment import load_federation

    from clinograph.core.identity import Identity

    keys = init_keyset(tmp_path / "keys", federation_id="fed-flower", hospitals=list(HOSPITALS),
                       superlink_hosts=["127.0.0.1"], superlink_port=19092)
    fed = load_federation(keys.federation_file)

    def build(kind=fh.FakeHospital, **over):
        hospitals = {}
        for n in HOSPITALS:
            ident = Identity.load(n, keys.hospital_dirs[n] / f"{n}.ed25519.pem")
            h = over.get(n, kind)(identity=ident, server=fed.server_public(), peers=fed.enrolled(),
                                  federation_id=fed.federation_id)
            hospitals[n] = h
        server = fh.make_server(federation=fed, audit_dir=tmp_path / "audit",
                                server_key=keys.superlink_dir / "server.ed25519.pem")
        return server, hospitals

    return build, tmp_path / "audit"


def _entries(audit_dir):
    return [json.loads(x) for x in (audit_dir / "audit.jsonl").read_text().splitlines()]


def test_participation_by_name_with_drops_and_their_actual_wait(federation):
    build, audit_dir = federation
    server, hospitals = build()
    transport = InProcessTransport(hospitals)
    transport.drop_at(0, {"h3": 1})  # answers the plan, silent at stage 1
    events = []
    run_rounds(server, transport, rounds=2, on_event=lambda k, d: events.append((k, dict(d))))
    server.audit.close()
    entries = _entries(audit_dir)
    part = [e["payload"] for e in entries if e["kind"] == "round_participation"]
    assert [p["round"] for p in part] == [0, 1]
    p0 = part[0]
    assert p0["invited"] == list(HOSPITALS) and p0["answered"] == list(HOSPITALS)
    assert p0["dropped"] == {"h3": {"stage": "stage 1", "reason": "silent from exchange 1 ('stage')"}}
    assert p0["refused"] == {} and p0["outcome"] == "aggregated" and p0["secure_mode"] == "masked"
    assert p0["contributed"] == ["h1", "h2"]  # dropped before its masked input: not in the sum
    assert part[1]["dropped"] == {} and part[1]["contributed"] == list(HOSPITALS)
    kinds = [e["kind"] for e in entries]
    assert kinds[-2:] == ["release", "run_ended"]
    release = entries[-2]["payload"]
    assert release["round"] == 1 and release["global_state_digest"] == server.history[-1].global_state_digest
    artefact = next(e["payload"] for e in entries if e["kind"] == "artefact" and e["payload"]["name"].startswith("release/"))
    assert artefact["sha256"] == release["model_sha256"]
    assert entries[-1]["payload"] == {"status": "completed", "reason": "all 2 planned round(s) ran",
                                      "rounds_completed": 2, "rounds_planned": 2}
    closed = [d for k, d in events if k == "round_closed"]
    assert closed[0]["dropped"] == ["h3"] and closed[0]["refused"] == []
    assert verify_audit_dir(audit_dir).ok


def test_a_spent_budget_is_a_signed_refusal_and_a_planned_end_of_the_run(federation):
    build, audit_dir = federation

    class SpentAtRound1(BudgetHospital):
        spent_from = 1

    server, hospitals = build(h1=SpentAtRound1, h2=SpentAtRound1)
    outcomes = run_rounds(server, InProcessTransport(hospitals), rounds=4)  # no exception: a planned end
    server.audit.close()
    assert len(outcomes) == 1
    entries = _entries(audit_dir)
    refused = [e["payload"] for e in entries if e["kind"] == "hospital_refused"]
    assert [(r["client"], r["round"], r["stage"], r["signed"], r["final"]) for r in refused] == [
        ("h1", 1, "plan", True, True), ("h2", 1, "plan", True, True)]
    assert refused[0]["reason"].startswith("PrivacyBudgetExceeded: h1: round 1 would spend")
    stored = [e["payload"] for e in entries if e["kind"] == "envelope" and e["payload"]["kind"] == "hospital_refusal"]
    assert [s["digest"] for s in stored] == [r["refusal_sha256"] for r in refused]
    assert all(s["signature"] == "valid" for s in stored)
    part = [e["payload"] for e in entries if e["kind"] == "round_participation"]
    assert part[1]["outcome"] == "aborted" and sorted(part[1]["refused"]) == ["h1", "h2"]
    assert part[1]["refused"]["h1"]["final"] is True and part[1]["answered"] == ["h3"]
    ended = entries[-1]
    assert ended["kind"] == "run_ended" and ended["payload"]["status"] == "too_few_hospitals"
    assert "fewer than min_clients = 2" in ended["payload"]["reason"] and "h1: PrivacyBudgetExceeded" in ended["payload"]["reason"]
    assert entries[-2]["kind"] == "release" and entries[-2]["payload"]["round"] == 0
    report = verify_audit_dir(audit_dir)
    assert report.ok, report.problems


def test_an_aborted_round_without_final_refusals_fails_the_run_and_says_so(federation):
    build, audit_dir = federation
    server, hospitals = build()
    transport = InProcessTransport(hospitals)
    transport.drop_at(0, {"h1": 1, "h2": 1})  # masked: two of three silent after the plan -> abort
    with pytest.raises(RoundAborted) as info:
        run_rounds(server, transport, rounds=2)
    assert "completed stage" in str(info.value) and "Round aborted, nothing published" in str(info.value)
    assert isinstance(info.value, ProtocolError)
    server.audit.close()
    entries = _entries(audit_dir)
    assert entries[-1]["kind"] == "run_ended" and entries[-1]["payload"]["status"] == "failed"
    assert entries[-1]["payload"]["reason"].startswith("round 0 aborted")
    assert "release" not in [e["kind"] for e in entries]
    part = next(e["payload"] for e in entries if e["kind"] == "round_participation")
    assert part["outcome"] == "aborted" and part["contributed"] == [] and part["abort_reason"]
    assert verify_audit_dir(audit_dir).ok


def test_a_refusal_is_bound_to_its_hospital_round_stage_and_message(federation):
    build, _ = federation
    server, hospitals = build()
    h1 = hospitals["h1"]
    plan = server.open_round(HOSPITALS)
    data = seal_refusal(h1.identity, round_=0, stage="plan", parts={"data": plan},
                        exc=PrivacyBudgetExceeded("budget spent"))
    key = server.enrolled["h1"]
    refusal = check_refusal(data, hospital="h1", key=key, round_=0, stage="plan", sent=plan)
    assert isinstance(refusal, HospitalRefusal) and refusal.final and refusal.error == "PrivacyBudgetExceeded"
    with pytest.raises(ProtocolError, match="a replay"):
        check_refusal(data, hospital="h1", key=key, round_=1, stage="plan", sent=plan)
    with pytest.raises(ProtocolError, match="another message"):
        check_refusal(data, hospital="h1", key=key, round_=0, stage="plan", sent=b"other")
    with pytest.raises(ProtocolError, match="came from 'h2'"):
        check_refusal(data, hospital="h2", key=server.enrolled["h2"], round_=0, stage="plan", sent=plan)
    forged = seal_refusal(hospitals["h2"].identity, round_=0, stage="plan", parts={"data": plan},
                          exc=ProtocolError("no"))
    from clinograph.core.errors import IntegrityError

    env = parse_envelope(forged)
    with pytest.raises(IntegrityError):
        check_refusal(env.model_copy(update={"sender": "h1"}).to_bytes(), hospital="h1", key=key, round_=0,
                      stage="plan", sent=plan)


class CrashingHospital(fh.FakeHospital):
    """Raises a plain Python error (a bug, not a Clinograph refusal) at stage 1 of every round."""

    def on_stage(self, data: bytes):
        raise KeyError("a bug in the hospital's own code")


def test_a_participant_bug_drops_it_by_exception_class_and_closes_the_round(federation):
    """Issue 31: a non-Clinograph exception escaped the in-process run_round and left the round open."""
    build, audit_dir = federation
    server, hospitals = build(h2=CrashingHospital)
    outcomes = run_rounds(server, InProcessTransport(hospitals), rounds=1)
    server.audit.close()
    with pytest.raises(ProtocolError, match="No round is open"):
        server.current  # noqa: B018 - the round closed
    assert outcomes[0].result.contributors == ("h1", "h3")
    p0 = next(e["payload"] for e in _entries(audit_dir) if e["kind"] == "round_participation")
    assert p0["outcome"] == "aggregated" and set(p0["dropped"]) == {"h2"}
    reason = p0["dropped"]["h2"]["reason"]
    assert "KeyError" in reason and "not a Clinograph error" in reason
    assert "bug in the hospital" not in reason  # the class is named, never the message (it may hold data)
    assert verify_audit_dir(audit_dir).ok
