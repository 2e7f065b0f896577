"""A hospital whose input voids rounds is named by group testing, retired and audited (issue 31,
item 5; secure/runtime/attribution.py). Two culprits, each running the real protocol: in masked
mode one that puts out-of-bound counts into its masked vector (the unmasked sum fails
``check_total``), in ckks mode one that encrypts under a key of its own while claiming the
federation's context (every hospital's tag check fails). Real federations over the in-process
transport, the one round loop, the real secure-mode clients.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from clinograph.secure.audit import verify_audit_dir
from clinograph.secure.runtime import run_rounds
from clinograph.secure.runtime.attribution import Attribution
from clinograph.secure.runtime.loop import RoundAborted

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hostile_helpers import HOSTILE, BadSharesMasked, audit_entries, federation  # noqa: E402


def _run(tmp_path: Path, *, mode: str, n: int, culprit: str | None, rounds: int = 2):
    server, transport, _ = federation(tmp_path, n=n, mode=mode,
                                      hospitals={culprit: HOSTILE[mode]} if culprit else None)
    events: list[tuple[str, dict]] = []
    outcomes = run_rounds(server, transport, rounds=rounds, on_event=lambda k, d: events.append((k, dict(d))))
    server.audit.close()
    return server, outcomes, audit_entries(tmp_path), events


def _kind(entries, kind):
    return [e["payload"] for e in entries if e["kind"] == kind]


def _check_named(entries, *, culprit: str, n: int, mode: str):
    """The culprit, and nobody else, is retired; the proof in the audit holds; the voided rounds
    list no contributor and publish nothing; the test rounds stay within the bound."""
    retired = _kind(entries, "hospital_retired")
    assert [r["client"] for r in retired] == [culprit]
    steps = _kind(entries, "attribution_step")
    voided = [s for s in steps if s["outcome"] == "voided"]
    # the proof: the culprit is the only hospital whose input was in every voided round of the search
    assert set.intersection(*(set(s["hospitals"]) for s in voided)) == {culprit}
    assert retired[0]["evidence"] == [s["round"] for s in voided]
    tests = [s for s in steps if s["test"] > 0]
    log = math.ceil(math.log2(n))
    assert len(tests) <= log + 2, (mode, n, culprit, len(tests))
    assert len([s for s in tests if s["outcome"] == "voided"]) <= log + 1
    assert steps[-1]["end"] == "named" and steps[0]["test"] == 0
    part = {p["round"]: p for p in _kind(entries, "round_participation")}
    aggregated = {a["round"] for a in _kind(entries, "aggregate")}
    for s in voided:
        assert part[s["round"]]["outcome"] == "aborted" and part[s["round"]]["contributed"] == []
        assert s["round"] not in aggregated
    models = {a["meta"]["round"] for a in _kind(entries, "artefact") if a["kind"] == "global_model"}
    assert not models & {s["round"] for s in voided}
    return steps


@pytest.mark.parametrize(("n", "culprit"), [(4, "h0"), (4, "h3"), (5, "h2"), (8, "h5"), (8, "h7")])
def test_masked_out_of_bounds_culprit_is_named_retired_and_the_run_goes_on(tmp_path, n, culprit):
    server, outcomes, entries, events = _run(tmp_path, mode="masked", n=n, culprit=culprit, rounds=6)
    _check_named(entries, culprit=culprit, n=n, mode="masked")
    ended = _kind(entries, "run_ended")[-1]
    assert ended["status"] == "completed" and ended["rounds_completed"] == 6
    # after the naming every round runs with all the others, and aggregates
    named_at = _kind(entries, "hospital_retired")[0]["round"]
    later = [p for p in _kind(entries, "round_participation") if p["round"] > named_at]
    assert later and all(p["outcome"] == "aggregated" for p in later)
    assert all(p["contributed"] == sorted(set(f"h{i}" for i in range(n)) - {culprit}) for p in later)
    assert culprit not in outcomes[-1].result.contributors
    assert ("hospital_retired", _kind(entries, "hospital_retired")[0]) in events
    assert verify_audit_dir(tmp_path / "audit").ok


def test_test_rounds_respect_a_configured_masked_threshold(tmp_path):
    """masked_threshold = 3 fixed for every round: no test round may have fewer than 3 hospitals
    (a 2-hospital plan cannot even be built), and the culprit is still named."""
    server, transport, _ = federation(tmp_path, n=8, masked_threshold=3, hospitals={"h4": HOSTILE["masked"]})
    run_rounds(server, transport, rounds=6)
    server.audit.close()
    entries = audit_entries(tmp_path)
    assert [r["client"] for r in _kind(entries, "hospital_retired")] == ["h4"]
    assert min(len(p["participants"]) for p in _kind(entries, "round_plan")) >= 3


@pytest.mark.parametrize(("n", "culprit"), [(4, "h1"), (6, "h0"), (8, "h6")])
def test_ckks_foreign_key_culprit_is_named_retired_and_the_run_goes_on(tmp_path, n, culprit):
    server, outcomes, entries, _ = _run(tmp_path, mode="ckks", n=n, culprit=culprit, rounds=5)
    steps = _check_named(entries, culprit=culprit, n=n, mode="ckks")
    first = _kind(entries, "round_participation")[0]
    # before: every hospital refused the aggregate it decrypted, the round was recorded with all
    # contributors. Now it is voided, and lists none.
    assert first["outcome"] == "aborted" and first["contributed"] == [] and len(first["refused"]) == n
    assert "refused the aggregate" in first["abort_reason"]
    assert steps[0]["hospitals"] == [f"h{i}" for i in range(n)]
    ended = _kind(entries, "run_ended")[-1]
    assert ended["status"] == "completed" and ended["rounds_completed"] == 5
    assert all(culprit not in o.result.contributors for o in outcomes[-1:])
    assert verify_audit_dir(tmp_path / "audit").ok


@pytest.mark.parametrize(("secret", "shift", "drop"), [
    ("pairwise_key", 1, True),  # a well-formed wrong key: it does not match the advertised one
    ("pairwise_key", 1 << 255, True),  # shares that do not rebuild a 32-byte secret at all
    ("self_mask", 1 << 255, False),  # the same for the self-mask of a hospital that stays
])
def test_bad_shares_void_the_round_and_their_dealer_is_named(tmp_path, secret, shift, drop):
    """Adversarial rerun of issue 31: a hospital that deals wrong Shamir shares (and, for its
    pairwise key, leaves the round) made the server's unmasking fail with a plain ProtocolError:
    the round aborted unattributed and the whole run failed at round 0. Such a round is voided
    with the dealer and every survivor (whoever revealed a share) as its inputs, so group testing
    names the dealer and the run goes on."""
    culprit, n = "h2", 5
    server, transport, _ = federation(tmp_path, n=n, hospitals={culprit: {
        "mode_client": BadSharesMasked, "mode_client_kw": {"secret": secret, "shift": shift, "drop": drop}}})
    run_rounds(server, transport, rounds=6)
    server.audit.close()
    entries = audit_entries(tmp_path)
    assert [r["client"] for r in _kind(entries, "hospital_retired")] == [culprit]
    voided = [s for s in _kind(entries, "attribution_step") if s["outcome"] == "voided"]
    assert set.intersection(*(set(s["hospitals"]) for s in voided)) == {culprit}
    ended = _kind(entries, "run_ended")[-1]
    assert ended["status"] == "completed" and ended["rounds_completed"] == 6
    assert verify_audit_dir(tmp_path / "audit").ok


@pytest.mark.parametrize("mode", ["masked", "ckks"])
def test_an_honest_run_has_no_extra_round(tmp_path, mode):
    server, outcomes, entries, _ = _run(tmp_path, mode=mode, n=4, culprit=None, rounds=2)
    assert len(_kind(entries, "round_plan")) == 2 and len(outcomes) == 2
    assert not _kind(entries, "attribution_step") and not _kind(entries, "hospital_retired")
    assert all(p["invited"] == ["h0", "h1", "h2", "h3"] for p in _kind(entries, "round_participation"))


def test_run_round_alone_still_raises_the_void_with_its_inputs(tmp_path):
    from clinograph.secure.runtime import run_round

    server, transport, _ = federation(tmp_path, n=4, hospitals={"h2": HOSTILE["masked"]})
    with pytest.raises(RoundAborted, match="breaks the plan's bounds") as info:
        run_round(server, transport)
    assert info.value.voided == ("h0", "h1", "h2", "h3")


# -- the search itself, against every behaviour of one hostile hospital ------------------------

class _Audit:
    def __init__(self):
        self.entries = []

    def record(self, kind, payload):
        self.entries.append((kind, dict(payload)))


class _Server:
    def __init__(self):
        self.audit = _Audit()


def _simulate(n: int, *, voids, min_size: int = 2, limit: int = 40):
    """Drive :class:`Attribution` with ``voids(round, invited) -> bool`` as the hostile side's
    choice; returns the named hospitals and the number of test rounds."""
    att, retired, pool = Attribution(min_size=min_size), {}, tuple(f"h{i}" for i in range(n))
    server, tests = _Server(), 0
    for round_ in range(limit):
        invited = att.invite(tuple(p for p in pool if p not in retired))
        tests += att.search is not None
        if voids(round_, invited):
            if not att.voided(server, round_=round_, inputs=invited, retired=retired, event=lambda k, d: None):
                break
        else:
            att.aggregated(server, round_=round_, contributors=invited, event=lambda k, d: None)
        if retired:
            break
    return retired, tests


@pytest.mark.parametrize(("n", "floor"), [(4, 2), (5, 2), (6, 2), (7, 2), (8, 2), (13, 2), (6, 3), (8, 3), (11, 3)])
def test_a_consistent_culprit_anywhere_is_named_within_the_bound(n, floor):
    for c in range(n):
        retired, tests = _simulate(n, min_size=floor, voids=lambda r, invited, c=c: f"h{c}" in invited)
        assert list(retired) == [f"h{c}"], (n, c)
        assert tests <= math.ceil(math.log2(n)) + 2, (n, c, tests)


@pytest.mark.parametrize(("n", "floor"), [(2, 2), (3, 2), (3, 3), (5, 3)])
def test_below_twice_the_round_floor_the_culprit_may_hide_but_nobody_else_is_named(n, floor):
    """No test round may hold fewer than the floor (min_clients), and fillers must have shown
    themselves in a round that aggregated: with n < 2 x floor the culprit may hide among its
    peers; the search then ends inconclusive and names nobody."""
    hidden = 0
    for c in range(n):
        retired, _ = _simulate(n, min_size=floor, voids=lambda r, invited, c=c: f"h{c}" in invited)
        assert set(retired) <= {f"h{c}"}
        hidden += not retired
    assert hidden > 0


@pytest.mark.parametrize("seed", range(40))
def test_one_hostile_hospital_behaving_at_random_never_gets_an_honest_one_named(seed):
    """Whatever the hostile hospital does -- void only some rounds it is in, behave while tested --
    only it can be named (it may escape; it can never frame)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 9))
    culprit = f"h{int(rng.integers(n))}"
    retired, _ = _simulate(n, voids=lambda r, invited: culprit in invited and bool(rng.random() < 0.6))
    assert set(retired) <= {culprit}


def test_two_culprits_that_always_void_are_never_confused_with_an_honest_one():
    for n in (4, 6, 8):
        for a in range(n):
            for b in range(a + 1, n):
                bad = {f"h{a}", f"h{b}"}
                retired, _ = _simulate(n, voids=lambda r, invited, bad=bad: bool(bad & set(invited)))
                assert set(retired) <= bad, (n, bad, retired)


def test_a_named_hospital_stays_retired_across_a_restart(tmp_path):
    """The crash journal holds the retirement from the moment it is audited: a server killed right
    after naming the culprit resumes without it (no new void, no new search)."""
    from clinograph.secure.runtime.journal import Journal

    class Crash(BaseException):
        pass

    named: list[dict] = []

    def crash_after_naming(stage: str, round_: int) -> None:
        if stage == "aborted" and named:  # the save right after hospital_retired
            raise Crash

    server, transport, _ = federation(tmp_path, n=4, hospitals={"h1": HOSTILE["masked"]})
    with pytest.raises(Crash):
        run_rounds(server, transport, rounds=6, journal=Journal(tmp_path / "j.sqlite", on_saved=crash_after_naming),
                   on_event=lambda k, d: named.append(d) if k == "hospital_retired" else None)
    server.audit.close()
    named_at = _kind(audit_entries(tmp_path), "hospital_retired")[0]["round"]
    server2, transport2, _ = federation(tmp_path, n=4, hospitals={"h1": HOSTILE["masked"]})
    run_rounds(server2, transport2, rounds=6, journal=Journal(tmp_path / "j.sqlite"))
    server2.audit.close()
    entries = audit_entries(tmp_path)
    later = [p for p in _kind(entries, "round_plan") if p["round"] > named_at]
    assert later and all(p["participants"] == ["h0", "h2", "h3"] for p in later)
    assert len(_kind(entries, "hospital_retired")) == 1
    assert not [s for s in _kind(entries, "attribution_step") if s["round"] > named_at]
    assert _kind(entries, "run_ended")[-1]["status"] == "completed"
    assert verify_audit_dir(tmp_path / "audit").ok


def _fewest_test_rounds(n: int, floor: int, most: int = 6) -> int:
    """The fewest test rounds in the worst case in which *any* adaptive choice of rounds (each of at
    least ``floor`` hospitals, chosen freely) proves which hospital always voids, when the proof is
    the intersection of the voided rounds' inputs (a round that aggregates proves nothing, since a
    hostile hospital may behave while tested). Exhaustive search; n = 8 gives 5 (minutes)."""
    import functools
    import itertools

    tests = [frozenset(s) for k in range(floor, n + 1) for s in itertools.combinations(range(n), k)]

    @functools.lru_cache(maxsize=None)
    def solvable(state: frozenset, depth: int) -> bool:  # state: (culprit, intersection so far) pairs
        if all(len(i) == 1 for _, i in state):
            return True
        if depth == 0:
            return False
        for t in tests:
            voids = frozenset((c, i & t) for c, i in state if c in t)
            passes = frozenset((c, i) for c, i in state if c not in t)
            if not voids or voids == state:
                continue
            if solvable(voids, depth - 1) and (not passes or solvable(passes, depth - 1)):
                return True
        return False

    start = frozenset((c, frozenset(range(n))) for c in range(n))
    return next(d for d in range(most + 1) if solvable(start, d))


def test_no_search_does_better_at_four_hospitals():
    """ceil(log2 n) + 1 test rounds are not enough at n = 4 for any search with this proof: 4 are
    needed, as many as ours takes (test_a_consistent_culprit_anywhere_is_named_within_the_bound)."""
    assert _fewest_test_rounds(4, 2) == 4 == math.ceil(math.log2(4)) + 2
    assert _fewest_test_rounds(5, 2) == 4


@pytest.mark.parametrize("forgery", ["no such void", "not the only one"])
def test_audit_verify_refuses_a_retirement_its_own_steps_do_not_prove(tmp_path, forgery):
    """Adversarial rerun of issue 31: ``hospital_retired`` was checked for its shape only, so a server
    could name an honest hospital as the one whose input voided rounds -- with rounds that never
    voided, or in which others were suspects as much -- and ``audit verify`` passed. The
    verifier now recomputes the proof from the trail's own ``attribution_step`` entries: every
    evidence round voided with the named hospital among its inputs, and it is the only hospital
    in all of them."""
    from clinograph.secure.audit import AuditTrail
    from hostile_helpers import identity

    culprit = "h2" if forgery == "not the only one" else None
    server, _, entries, _ = _run(tmp_path, mode="masked", n=4, culprit=culprit, rounds=3)
    assert verify_audit_dir(tmp_path / "audit").ok  # the genuine trail verifies
    opened = [s for s in _kind(entries, "attribution_step") if s["test"] == 0]
    evidence = [opened[0]["round"]] if opened else [0]  # a round that voided with all four / one that aggregated
    trail = AuditTrail(tmp_path / "audit", identity=identity("server"))  # the server's own key: a hostile server
    trail.record("hospital_retired", {"round": 9, "client": "h1", "reason": "forged", "evidence": evidence,
                                      "method": "group_testing"})
    trail.close()
    report = verify_audit_dir(tmp_path / "audit")
    assert not report.ok and any("hospital_retired" in m and "h1" in m for m in report.problems), report.problems
