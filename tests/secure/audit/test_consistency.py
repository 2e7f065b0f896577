"""The audit consistency proof (secure/audit/consistency.py): entries since an anchored head prove
a later head extends it; any single-byte change to a proof, and any fork, is refused."""

from __future__ import annotations

import shutil

import pytest
from clinograph.secure.audit import AuditTrail
from clinograph.secure.audit.consistency import check_extension
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clinograph.core.errors import IntegrityError
from clinograph.core.identity import Identity

SERVER = Identity.generate("server")


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """A trail anchored at entry 4, grown to entry 9; and a fork of it from entry 2 grown to entry 12."""
    root = tmp_path_factory.mktemp("consistency")
    trail = AuditTrail(root / "audit", identity=SERVER)
    for i in range(2):
        trail.record("test_event", {"i": i})
    trail.checkpoint()
    shutil.copytree(root / "audit", root / "fork")
    for i in range(2, 4):
        trail.record("test_event", {"i": i})
    anchored = (trail.head.seq, trail.head.hash)
    for i in range(4, 9):
        trail.record("test_event", {"i": i})
    fork = AuditTrail(root / "fork", identity=SERVER)
    for i in range(10):
        fork.record("test_event", {"i": i, "fork": True})
    out = anchored, trail, fork
    yield out
    trail.close()
    fork.close()


def _check(anchored, trail, start, proof=None, key=SERVER.public):
    check_extension(anchored_seq=anchored[0], anchored_head=anchored[1], seq=trail.head.seq, head=trail.head.hash,
                    proof=trail.segment(start).decode("ascii") if proof is None else proof, proof_from=start,
                    server=key)


def test_the_entries_since_the_anchor_or_earlier_prove_the_extension(grown):
    anchored, trail, _ = grown
    assert anchored[0] == 4 and trail.head.seq == 9
    for start in (-1, 0, 3, 4):
        _check(anchored, trail, start)


def test_a_fork_with_a_higher_sequence_number_is_refused(grown):
    anchored, _, fork = grown
    assert fork.head.seq > 9
    with pytest.raises(IntegrityError, match="audit entry 5 of its proof does not follow entry 4"):
        _check(anchored, fork, 4)


def test_entries_signed_by_another_key_are_refused(grown):
    anchored, trail, _ = grown
    with pytest.raises(IntegrityError, match="the server signature does not verify"):
        _check(anchored, trail, 4, key=Identity.generate("server").public)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_single_byte_change_to_a_proof_is_refused(grown, data):
    anchored, trail, _ = grown
    proof = bytearray(trail.segment(4))
    i = data.draw(st.integers(0, len(proof) - 1))
    new = data.draw(st.integers(0x20, 0x7E).filter(lambda b: b != proof[i]))
    proof[i] = new
    with pytest.raises(IntegrityError):
        _check(anchored, trail, 4, proof=proof.decode("ascii"))
