"""One enrolled hospital, or whoever can put bytes on a channel, must not break a round.

Every message either enters the round or is refused with a bounded, audited reason, and the
round goes on without the hospital that sent it; a message that does not authenticate
(signature under the channel's hospital key, this federation, this round, this stage) changes
nobody's state and is only counted (one ``unattributed_refusals`` entry per round).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from clinograph.secure.audit import verify_audit_dir
from clinograph.secure.runtime import run_round
from clinograph.secure.wire import Envelope, parse_envelope
from hostile_helpers import FEDERATION, audit_entries, federation, honest_mean

from clinograph.core.labels import SIG_MESSAGE

HONEST = ("h0", "h1", "h2")


def signed_raw(ident, kind: str, payload: bytes) -> bytes:
    """An envelope over arbitrary payload bytes, validly signed by ``ident`` (a hostile hospital)."""
    sig = ident.sign(kind.encode() + b"\x00" + payload, context=SIG_MESSAGE)
    return Envelope(sender=ident.name, kind=kind, payload=payload, signature=sig).to_bytes()


def raw_report(**fields):
    """A report function for Hospital: a validly signed client_report with hostile fields."""
    def make(h, p):
        body = {"kind": "client_report", "federation_id": p.federation_id, "round": p.round, "client": h.name,
                "dictionary_hash": p.dictionary_hash, **fields}
        return signed_raw(h.identity, "client_report", json.dumps(body).encode())  # allow_nan: NaN, Infinity
    return make


LEDGER = {"round": 0, "noise_multiplier": 1.0, "sample_rate": 0.01, "steps": 10, "clip_norm": 1.0,
          "accountant": "rdp", "epsilon": 0.5, "delta": 1e-5, "budget_epsilon": 8.0}
HOSTILE_REPORTS = {
    "nan_metric": {"metrics": {"auc": float("nan")}},
    "inf_metric": {"metrics": {"auc": float("inf")}},
    "inf_relevance": {"feature_relevance": {"heart_rate": float("-inf")}},
    "nan_ledger": {"ledger": {**LEDGER, "epsilon": float("nan")}},
    "inf_ledger_budget": {"ledger": {**LEDGER, "budget_epsilon": float("inf")}},
    "huge_metrics": {"metrics": {f"m{i}" + "x" * 40_000: 0.5 for i in range(32)}},  # > 1 MiB
    "long_key": {"metrics": {"k" * 5000: 0.5}},
    "long_relevance_key": {"feature_relevance": {"f" * 5000: 0.5}},
    "huge_relevance": {"feature_relevance": {f"feature_{i:05d}" + "y" * 150: 0.1 for i in range(10_000)}},
}


def _check_round(tmp_path, server, outcome, *, attacker: str = "h3"):
    assert server.round == 1 and server._current is None
    assert outcome.result.contributors == HONEST
    assert attacker in outcome.result.rejected
    assert verify_audit_dir(tmp_path / "audit").ok
    want = honest_mean(HONEST)
    for name, mean in want.items():
        np.testing.assert_allclose(-server.state[name], mean, atol=1e-6)


@pytest.mark.parametrize("case", sorted(HOSTILE_REPORTS))
def test_hostile_report_is_refused_and_the_round_goes_on(tmp_path, case):
    server, transport, _ = federation(tmp_path, hospitals={"h3": {"report": raw_report(**HOSTILE_REPORTS[case])}})
    outcome = run_round(server, transport)
    _check_round(tmp_path, server, outcome)
    rejected = [e["payload"] for e in audit_entries(tmp_path) if e["kind"] == "update_rejected"]
    assert [r["client"] for r in rejected] == ["h3"]
    assert len(rejected[0]["reason"]) <= 4000


def test_refusal_reason_is_truncated_to_the_audit_limit(tmp_path):
    # Each of 32 metric names is in the reason pydantic gives; the reason must still fit the audit.
    server, transport, _ = federation(tmp_path, hospitals={"h3": {"report": raw_report(
        metrics={"a" * 3000 + str(i): float("nan") for i in range(32)})}})
    outcome = run_round(server, transport)
    _check_round(tmp_path, server, outcome)
    assert all(len(r) <= 4000 for r in outcome.result.rejected.values())


# -- item 2: refused messages must not knock out the hospital they name ---------------------------
def _forgery_of(name: str, kind: str) -> bytes:
    """An envelope naming ``name`` with a random signature (anyone can make it)."""
    return Envelope(sender=name, kind=kind, payload=b'{"kind": "%s"}' % kind.encode(),
                    signature=os.urandom(64)).to_bytes()


STAGE_KINDS = {0: ("report", "client_report"), 1: ("reply", "masked_share_keys"), 2: ("reply", "masked_input"),
               3: ("reply", "masked_consistency_signature"), 4: ("reply", "masked_unmask_response")}


@pytest.mark.parametrize("stage", sorted(STAGE_KINDS))
def test_forged_envelope_does_not_knock_out_the_hospital_it_names(tmp_path, stage):
    part, kind = STAGE_KINDS[stage]

    def inject(idx, name):
        if idx != stage or name != "h1":
            return []
        extra = [(part, _forgery_of("h1", kind))]
        if stage == 0:
            extra.append(("first", _forgery_of("h1", "masked_advertise_keys")))
        return extra

    server, transport, _ = federation(tmp_path, inject=inject)
    outcome = run_round(server, transport)
    assert outcome.result.contributors == ("h0", "h1", "h2", "h3")
    assert outcome.result.rejected == {}
    assert verify_audit_dir(tmp_path / "audit").ok
    kinds = [e["kind"] for e in audit_entries(tmp_path)]
    assert "update_rejected" not in kinds and kinds.count("unattributed_refusals") == 1


def test_report_replayed_from_an_earlier_round_does_not_knock_out_its_sender(tmp_path):
    sent: dict[str, list[bytes]] = {}

    def inject(idx, name):
        if server.round == 0 or name != "h2":
            return []
        old = sent["h2"]  # h2's round-0 messages, replayed at the same point of round 1
        return [("report", old[0]), ("first", old[1])] if idx == 0 else (
            [("reply", old[idx + 1])] if idx + 1 < len(old) else [])

    server, transport, hosp = federation(tmp_path, inject=inject)
    run_round(server, transport)
    sent["h2"] = list(hosp["h2"].sent)
    outcome = run_round(server, transport)
    assert outcome.result.contributors == ("h0", "h1", "h2", "h3")
    assert outcome.result.rejected == {}
    summary = [e["payload"] for e in audit_entries(tmp_path) if e["kind"] == "unattributed_refusals"]
    assert summary and summary[-1]["round"] == 1 and summary[-1]["counts"].get("stale_round", 0) >= 2


def test_channel_mismatch_is_not_attributed_to_the_claimed_sender(tmp_path):
    # h3 signs a perfectly good envelope as itself but sends it on h1's channel.
    def inject(idx, name):
        return [("report", transport.participants["h3"].sent[0])] if (idx, name) == (1, "h1") else []

    server, transport, _ = federation(tmp_path, inject=inject)
    outcome = run_round(server, transport)
    assert outcome.result.contributors == ("h0", "h1", "h2", "h3")


# -- item 4: refusals must not flood the audit ------------------------------------------------
def test_ten_thousand_forged_messages_are_one_audit_entry(tmp_path):
    n = 10_000

    def inject(idx, name):
        if name != "h1" or idx != 1:
            return []
        return [("reply", os.urandom(40)) if i % 2 else ("reply", _forgery_of("h1", "masked_share_keys"))
                for i in range(n)]

    server, transport, _ = federation(tmp_path, inject=inject)
    outcome = run_round(server, transport)
    assert outcome.result.contributors == ("h0", "h1", "h2", "h3")
    size = (tmp_path / "audit" / "audit.jsonl").stat().st_size
    summary = [e["payload"] for e in audit_entries(tmp_path) if e["kind"] == "unattributed_refusals"]
    assert len(summary) == 1 and summary[0]["total"] == n
    assert summary[0]["counts"] == {"bad_signature": n // 2, "malformed_envelope": n // 2}
    assert size < 64 * 1024, size


def test_authenticated_refusals_are_bounded_per_sender_per_round(tmp_path):
    from clinograph.secure.server import MAX_REJECTIONS_PER_SENDER

    def inject(idx, name):
        if name != "h3" or idx != 0:
            return []
        return [("report", raw_report(metrics={"auc": float("nan")})(transport.participants["h3"], plan))] * 1 + [
            ("report", raw_report(metrics={"auc": float("nan"), f"x{i}": 1.0})(transport.participants["h3"], plan))
            for i in range(50)]

    server, transport, _ = federation(tmp_path, inject=inject)
    plan = _peek_plan(server)
    outcome = run_round(server, transport)
    # h3 signed hostile reports: it is out of this round (its later genuine report too), nobody else is
    assert outcome.result.contributors == HONEST and "h3" in outcome.result.rejected
    rejected = [e for e in audit_entries(tmp_path) if e["kind"] == "update_rejected"]
    assert len(rejected) == MAX_REJECTIONS_PER_SENDER
    summary = [e["payload"] for e in audit_entries(tmp_path) if e["kind"] == "unattributed_refusals"]
    assert summary[0]["suppressed"]["h3"] >= 51 - MAX_REJECTIONS_PER_SENDER
    assert verify_audit_dir(tmp_path / "audit").ok


def _peek_plan(server):
    """The plan the server will sign for round 0 (same fields; only what raw_report reads)."""
    class P:
        federation_id = FEDERATION
        round = server.round
        dictionary_hash = server.dictionary_hash
    return P


# -- property: hostile bytes at every stage ---------------------------------------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

HOSTILE_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**70), 2**70), st.text(max_size=6000),
    st.none(), st.booleans(), st.lists(st.integers(-5, 5), max_size=5),
    st.dictionaries(st.text(max_size=300), st.floats(allow_nan=True), max_size=40),
)
MUTATIONS = st.one_of(
    st.tuples(st.just("random"), st.binary(max_size=3000)),
    st.tuples(st.just("truncate"), st.floats(0, 1)),
    st.tuples(st.just("flip"), st.floats(0, 1), st.integers(0, 7)),
    st.tuples(st.just("field"), st.integers(0, 50), HOSTILE_VALUES),   # validly signed by h3
    st.tuples(st.just("extra_key"), st.text(min_size=1, max_size=6000), HOSTILE_VALUES),  # validly signed by h3
)
SIGNED = ("field", "extra_key")


def mutate(data: bytes, mutation) -> bytes:
    from hostile_helpers import identity

    how = mutation[0]
    if how == "random":
        return mutation[1]
    if how == "truncate":
        return data[: int(len(data) * mutation[1])]
    if how == "flip":
        i = min(int(len(data) * mutation[1]), len(data) - 1)
        return data[:i] + bytes([data[i] ^ (1 << mutation[2])]) + data[i + 1:]
    env = parse_envelope(data)
    body = json.loads(env.payload)
    if how == "field":
        keys = sorted(body)
        body[keys[mutation[1] % len(keys)]] = mutation[2]
    else:
        body[mutation[1]] = mutation[2]
    return signed_raw(identity(env.sender), env.kind, json.dumps(body).encode())


@settings(max_examples=int(os.environ.get("CLINOGRAPH_FUZZ_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(stage=st.integers(0, 4), first=st.booleans(), inject=st.booleans(), mutation=MUTATIONS)
def test_hostile_messages_at_any_stage_never_break_the_round(tmp_path_factory, stage, first, inject, mutation):
    """run_round raises nothing but the documented abort (ProtocolError), the audit verifies,
    and the honest hospitals' contributions are aggregated."""
    from clinograph.core.errors import ProtocolError

    tmp = tmp_path_factory.mktemp("prop")
    part = ("first" if first else "report") if stage == 0 else "reply"

    def target(idx, name, p):
        return idx == stage and name == "h3" and p == part

    def injector(idx, name):
        if not inject or not target(idx, name, part):
            return []
        genuine = transport.participants["h3"].sent[-1 if stage else (1 if first else 0)]
        return [(part, mutate(genuine, mutation))]

    def replacer(idx, name, p, data):
        return mutate(data, mutation) if not inject and target(idx, name, p) else data

    server, transport, _ = federation(tmp, inject=injector, replace=replacer)
    try:
        outcome = run_round(server, transport)
    except ProtocolError:
        kinds = [e["kind"] for e in audit_entries(tmp)]
        assert "round_aborted" in kinds and "aggregate" not in kinds
        assert verify_audit_dir(tmp / "audit").ok
        return
    assert server._current is None and server.round == 1
    assert verify_audit_dir(tmp / "audit").ok
    contributors = outcome.result.contributors
    assert set(HONEST) <= set(contributors)
    if "h3" not in contributors or (inject and mutation[0] not in SIGNED):
        for name, mean in honest_mean(contributors).items():
            np.testing.assert_allclose(-server.state[name], mean, atol=1e-6)
    for e in audit_entries(tmp):
        if e["kind"] == "update_rejected":
            assert e["payload"]["client"] == "h3" and len(e["payload"]["reason"]) <= 4000
