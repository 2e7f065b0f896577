"""A hospital's audit anchor: the latest signed plan it saw, kept across restarts; older heads
refused, and a later head only with a proof that it extends the anchored one -- a fork with a
higher sequence number is refused (real audit trails, secure/audit/consistency.py)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from clinograph.sdk.federation.anchor import HospitalAnchor, RollbackDetected
from clinograph.secure.audit import AuditTrail
from clinograph.secure.messages import RoundPlan
from clinograph.secure.state import UNKNOWN_STATE
from clinograph.secure.wire import seal

from clinograph.core.errors import IntegrityError
from clinograph.core.identity import Identity

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "secure"))
from hostile_helpers import DICTIONARY_HASH, SPEC  # noqa: E402

SERVER = Identity.generate("server")


def _plan(round_: int, seq: int | None, head: str = "a", **extra) -> tuple[RoundPlan, bytes]:
    options = {} if seq is None else {"audit.seq": seq, "audit.head": head * 64}
    options.update(extra)
    plan = RoundPlan(federation_id="fed", round=round_, participants=("h1",), spec=SPEC,
                     dictionary_hash=DICTIONARY_HASH, secure_mode="masked", strategy="fedavg", min_clients=1,
                     local_epochs=1, global_state_digest=UNKNOWN_STATE, options=options)
    return plan, seal(plan, SERVER)


def test_the_anchor_survives_a_restart_and_refuses_an_older_head(tmp_path):
    anchor = HospitalAnchor(tmp_path, server=SERVER.public)
    plan, data = _plan(3, 40)
    anchor.check(plan)
    anchor.keep(plan, data)
    again = HospitalAnchor(tmp_path, server=SERVER.public)  # the hospital restarted
    assert again.get("fed").round == 3 and again.get("fed").plan == data
    with pytest.raises(RollbackDetected, match=r"presents audit entry 55 .* but does not prove it extends round 3 at "
                                               r"audit entry 40 .*: the plan carries no proof"):
        again.check(_plan(4, 55)[0])  # a later head alone proves nothing
    with pytest.raises(RollbackDetected, match=r"presents audit entry 12 .* already saw round 3 at audit entry 40 "
                                               r".*rolled back to an earlier copy"):
        again.check(_plan(4, 12)[0])
    with pytest.raises(RollbackDetected, match="or forked"):
        again.check(_plan(4, 40, head="b")[0])  # same position, another entry
    with pytest.raises(RollbackDetected, match="carries no audit head"):
        again.check(_plan(4, None)[0])
    assert HospitalAnchor(tmp_path, server=Identity.generate("server").public).get("fed") is None  # another server key


def test_the_kept_global_model_is_restored_exactly_and_tampering_is_refused(tmp_path):
    anchor = HospitalAnchor(tmp_path, server=SERVER.public)
    plan, data = _plan(0, 5)
    anchor.keep(plan, data)
    state = {"b": np.array([1e-17, -3.0]), "a": np.array([np.pi])}
    anchor.keep_model("fed", state)
    back = HospitalAnchor(tmp_path, server=SERVER.public).model("fed", names=["a", "b"])
    assert all(np.array_equal(back[k], state[k]) for k in state)
    kept = next(tmp_path.glob("global_model.*.bin"))
    kept.write_bytes(kept.read_bytes()[:-1] + b"\x00")
    with pytest.raises(IntegrityError, match="missing or altered"):
        HospitalAnchor(tmp_path, server=SERVER.public).model("fed", names=["a", "b"])
    (tmp_path / "audit_anchor.json").write_text("{}")
    with pytest.raises(IntegrityError, match="not a Clinograph anchor file"):
        HospitalAnchor(tmp_path, server=SERVER.public)


@pytest.mark.parametrize("hostile", ["[]", "[" * 100_000 + "]" * 100_000, "too large",
                                     '{"format": "clinograph-anchor/1", "anchors": {"k": 5}}'])
def test_a_hostile_anchor_file_is_an_integrity_error_not_a_traceback(tmp_path, monkeypatch, hostile):
    """Adversarial rerun of issue 31: a JSON list gave an AttributeError, deep nesting a
    RecursionError, and a link to /dev/zero was read until memory ran out (now: a regular file
    of bounded size; the bound is shown here on a small one)."""
    import clinograph.sdk.federation.anchor as anchor_module

    if hostile == "too large":
        anchor = HospitalAnchor(tmp_path, server=SERVER.public)
        anchor.keep(*_plan(0, 5))
        monkeypatch.setattr(anchor_module, "MAX_ANCHOR_BYTES", 10)
    else:
        (tmp_path / "audit_anchor.json").write_text(hostile)
    with pytest.raises(IntegrityError, match="is not a Clinograph anchor file"):
        HospitalAnchor(tmp_path, server=SERVER.public)


def test_a_kept_blob_is_read_only_as_a_bounded_file_beside_the_anchor(tmp_path, monkeypatch):
    """A record naming a path elsewhere (/dev/zero was read until memory ran out) is refused as
    altered, even when the file there holds the kept bytes; so is a blob past the bound."""
    import json

    import clinograph.sdk.federation.anchor as anchor_module

    state = tmp_path / "state"
    anchor = HospitalAnchor(state, server=SERVER.public)
    anchor.keep(*_plan(0, 5))
    anchor.keep_model("fed", {"a": np.array([1.0])})
    assert HospitalAnchor(state, server=SERVER.public).model("fed", names=["a"]) is not None
    kept = next(state.glob("global_model.*.bin"))
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(kept, tmp_path / "elsewhere" / kept.name)
    record = json.loads((state / "audit_anchor.json").read_text())
    for rec in record["anchors"].values():
        rec["model"] = f"../elsewhere/{kept.name}"
    (state / "audit_anchor.json").write_text(json.dumps(record))
    with pytest.raises(IntegrityError, match="missing or altered"):
        HospitalAnchor(state, server=SERVER.public).model("fed", names=["a"])
    for rec in record["anchors"].values():
        rec["model"] = kept.name
    (state / "audit_anchor.json").write_text(json.dumps(record))
    monkeypatch.setattr(anchor_module, "MAX_BLOB_BYTES", 4)
    with pytest.raises(IntegrityError, match="missing or altered"):
        HospitalAnchor(state, server=SERVER.public).model("fed", names=["a"])


def _grow(trail: AuditTrail, n: int, tag: str) -> None:
    for i in range(n):
        trail.record("test_event", {"tag": tag, "i": i})


def _plan_at(trail: AuditTrail, round_: int, *, proof_from: int | None = None) -> tuple[RoundPlan, bytes]:
    """The plan a server on ``trail`` signs for ``round_`` (its head, and the entries since ``proof_from``)."""
    head = trail.head
    extra = {} if proof_from is None else {"audit.proof_from": proof_from,
                                           "audit.proof": trail.segment(proof_from).decode("ascii")}
    plan = RoundPlan(federation_id="fed", round=round_, participants=("h1",), spec=SPEC,
                     dictionary_hash=DICTIONARY_HASH, secure_mode="masked", strategy="fedavg", min_clients=1,
                     local_epochs=1, global_state_digest=UNKNOWN_STATE,
                     options={"audit.seq": head.seq, "audit.head": head.hash, **extra})
    return plan, seal(plan, SERVER)


def test_a_later_head_must_extend_the_anchored_one_and_a_fork_is_refused(tmp_path):
    trail = AuditTrail(tmp_path / "audit", identity=SERVER)
    _grow(trail, 3, "round 0")
    trail.checkpoint()
    shutil.copytree(tmp_path / "audit", tmp_path / "copy")  # the server's disk, copied after round 0
    _grow(trail, 3, "round 1")
    anchor = HospitalAnchor(tmp_path / "h1", server=SERVER.public)
    plan, data = _plan_at(trail, 1)
    anchor.check(plan)
    anchor.keep(plan, data)  # the hospital anchored entry 6
    anchored = trail.head.seq
    # the honest server goes on: later heads with the entries since (or since earlier) are accepted
    _grow(trail, 4, "round 2")
    anchor.check(_plan_at(trail, 2, proof_from=anchored)[0])
    anchor.check(_plan_at(trail, 2, proof_from=1)[0])
    # the server rolled back to the copy, then ran further than the hospital's anchor: a fork
    fork = AuditTrail(tmp_path / "copy", identity=SERVER)
    _grow(fork, 12, "replayed rounds")
    assert fork.head.seq > anchored
    for start in (-1, 1, anchored):
        with pytest.raises(RollbackDetected, match=rf"presents audit entry {fork.head.seq} .* does not prove it "
                                                   rf"extends round 1 at audit entry {anchored} .*: audit entry "
                                                   rf"{anchored + 1} of its proof does not follow entry {anchored}"):
            anchor.check(_plan_at(fork, 2, proof_from=start)[0])
    # an honest proof made malformed is refused too
    plan, _ = _plan_at(trail, 2, proof_from=anchored)
    lines = plan.options["audit.proof"].split("\n")
    bad = {**plan.options, "audit.proof": "\n".join(lines[:-1])}
    with pytest.raises(RollbackDetected, match="its audit proof holds 3 entries, not the 4 from entry 7 to 10"):
        anchor.check(plan.model_copy(update={"options": bad}))
    with pytest.raises(RollbackDetected, match="starts after entry 7, past the anchored entry 6"):
        anchor.check(_plan_at(trail, 2, proof_from=anchored + 1)[0])
    tampered = {**plan.options, "audit.proof": plan.options["audit.proof"].replace('"round 2"', '"round 9"', 1)}
    with pytest.raises(RollbackDetected, match="content does not match its hash"):
        anchor.check(plan.model_copy(update={"options": tampered}))
    fork.close()
    trail.close()


def test_the_deployment_guides_command_prints_the_latest_anchored_head(tmp_path, capsys):
    """docs/deployment.md said an auditor takes `audit_head` out of a hospital's audit_anchor.json for `audit verify
    --expect-head`; the file holds one anchor a federation id (each candidate model's run is one) under `anchors`,
    and where it lives was not said. The guide's command, run on a hospital's file: the latest head."""
    import re

    text = (Path(__file__).resolve().parents[3] / "docs" / "deployment.md").read_text()
    code = re.search(r'python3 -c "(import json,sys;[^"]*)" /srv/h1/state/privacy/audit_anchor.json', text).group(1)
    anchor = HospitalAnchor(tmp_path / "privacy", server=SERVER.public)  # make_hospital's state_dir: state-dir/privacy
    older, data = _plan(3, 40, head="a")
    anchor.keep(older, data)
    later = older.model_copy(update={"federation_id": "fed-shape", "options": {"audit.seq": 55, "audit.head": "b" * 64}})
    anchor.keep(later, seal(later, SERVER))
    argv = sys.argv
    sys.argv = ["-c", str(tmp_path / "privacy" / "audit_anchor.json")]
    try:
        exec(code, {})  # noqa: S102 -- the guide's own command, on a file this test wrote
    finally:
        sys.argv = argv
    assert capsys.readouterr().out.strip() == "b" * 64
