"""A hospital's audit anchor: the latest signed plan it saw, kept across restarts; older heads refused."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from clinograph.sdk.federation.anchor import HospitalAnchor, RollbackDetected
from clinograph.secure.errors import IntegrityError
from clinograph.secure.identity import Identity
from clinograph.secure.messages import RoundPlan
from clinograph.secure.state import UNKNOWN_STATE
from clinograph.secure.wire import seal

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "secure"))
from hostile_helpers import DICTIONARY_HASH, SPEC  # noqa: E402

SERVER = Identity.generate("server")


def _plan(round_: int, seq: int | None, head: str = "a") -> tuple[RoundPlan, bytes]:
    options = {} if seq is None else {"audit.seq": seq, "audit.head": head * 64}
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
    again.check(_plan(4, 55)[0])  # later head: fine
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
