"""The ``ckks_threshold`` secure mode: set-up, a round, and a malicious server's requests refused."""

from __future__ import annotations

import secrets
from types import SimpleNamespace

import numpy as np
import pytest
from clinograph.secure.aggregation import LocalUpdate, create_mode
from clinograph.secure.ckks import threshold_upload as U
from clinograph.secure.ckks.holder import CkksKeyHolder
from clinograph.secure.ckks.threshold import Combiner, seeded_canary
from clinograph.secure.ckks.threshold_messages import (
    DecryptionRequest,
    DecryptionShare,
    ThresholdCommitments,
    ThresholdDecrypt,
    ThresholdUpdate,
    ThresholdUpload,
)
from clinograph.secure.hazmat import ckks_compact as C
from clinograph.secure.hazmat import threshold_ckks as T
from clinograph.secure.messages import RoundPlan
from clinograph.secure.runtime.transport import InProcessTransport
from clinograph.secure.wire import load_payload, parse_envelope, seal

from clinograph.core.errors import IntegrityError, ProtocolError
from clinograph.core.identity import Identity
from clinograph.core.spec import ModelSpec, ModuleKind, ModuleSpec

FED = "fed-tckks"
SPEC = ModelSpec(version=1, modules=(ModuleSpec(name="gnn/w", shape=(40,), kind=ModuleKind.SHARED),
                                     ModuleSpec(name="head/task", shape=(4,), kind=ModuleKind.PERSONAL)))
SERVER = Identity.generate("server")
NAMES = ("east", "north", "south")


class _Hospital:
    def __init__(self, identity: Identity, peers):
        self.name = identity.name
        self.keys = CkksKeyHolder(identity=identity, peers=peers, federation_id=FED)

    def on_setup(self, step, parts):
        return self.keys.on_setup(step, parts)


@pytest.fixture(scope="module")
def fed():
    ids = {n: Identity.generate(n) for n in NAMES}
    enrolled = {n: i.public for n, i in ids.items()}
    hospitals = {n: _Hospital(i, enrolled) for n, i in ids.items()}
    events = []
    mode = create_mode("ckks_threshold")
    run = mode.open_run(federation=SimpleNamespace(min_clients=2), transport=InProcessTransport(hospitals), run_id=FED,
                        enrolled=enrolled, max_weight=10.0, on_event=lambda k, d: events.append((k, d)))
    return SimpleNamespace(ids=ids, enrolled=enrolled, hospitals=hospitals, mode=mode, run=run, events=events)


def _plan(fed, round_=1, min_clients=2):
    return RoundPlan(federation_id=FED, round=round_, participants=NAMES, spec=SPEC, dictionary_hash="d" * 64,
                     secure_mode="ckks_threshold", strategy="fedavg", min_clients=min_clients, local_epochs=1,
                     global_state_digest="0" * 64, options=fed.run.options(NAMES))


def _updates():
    rng = np.random.default_rng(3)
    return {n: LocalUpdate(modules={"gnn/w": (i + 1) * rng.normal(0, 0.1, 40)}, weight=float(i + 1))
            for i, n in enumerate(NAMES)}


def _round(fed, plan):
    server = fed.run.server(plan=plan, peers=fed.enrolled, identity=SERVER)
    ups = _updates()
    clients = {n: fed.mode.make_client(plan=plan, identity=fed.ids[n], server=SERVER.public, peers=fed.enrolled,
                                       update=ups[n], keys=fed.hospitals[n].keys) for n in NAMES}
    for c in clients.values():  # stage commit: the hashes of the c1; then every hospital reveals its upload
        server.receive(parse_envelope(c.first_message()))
    reveal = server.next_stage()
    firsts = {n: c.handle(reveal[n]) for n, c in clients.items()}
    return server, clients, firsts, ups


def test_set_up_records_who_holds_a_share_and_that_no_one_holds_the_key(fed):
    assert fed.run.hospitals == NAMES
    (kind, payload), = fed.run.audit
    assert kind == "tckks_key_holders" and payload["holders"] == list(NAMES) and payload["rule"] == "N-of-N"
    text, rows = fed.mode.describe(fed.run.options(NAMES), {kind: [payload]})
    table = dict(rows)
    assert table["who holds a share of the secret key"].startswith("east, north, south")
    assert table["who holds the whole secret key"].startswith("no one")
    assert all(h.keys.threshold.public.digest == payload["public_key_digest"] for h in fed.hospitals.values())


def test_a_round_opens_exactly_the_weighted_sum(fed):
    plan = _plan(fed)
    server, clients, firsts, ups = _round(fed, plan)
    for data in firsts.values():
        server.receive(parse_envelope(data))
    requests = server.next_stage()
    assert set(requests) == set(NAMES)
    for n, data in requests.items():
        server.receive(parse_envelope(clients[n].handle(data)))
    assert server.next_stage() is None
    sums = server.result()
    want = sum(u.modules["gnn/w"] for u in ups.values())
    assert np.max(np.abs(sums.sums["gnn/w"] - want)) < 1e-6
    assert sums.weights["gnn/w"] == pytest.approx(6.0, abs=1e-6) and sums.contributors == NAMES


def _inner(firsts, name):
    """The signed c1 envelope inside ``name``'s upload (what the server forwards to the holders)."""
    return load_payload(parse_envelope(firsts[name]), ThresholdUpload).update


def _forged_request(fed, plan, firsts, *, contributors, seed=None):
    """A request the server signs: the signed c1 envelopes of ``contributors`` and a canary seed."""
    msg = ThresholdDecrypt(federation_id=FED, round=plan.round, canary_seed=seed or secrets.token_bytes(32),
                           updates=tuple(_inner(firsts, n) if isinstance(n, str) else n for n in contributors))
    return seal(msg, SERVER)


@pytest.mark.parametrize("case", ["one_hospital", "one_hospital_plan_lowered", "below_minimum",
                                  "one_c1_coefficient_changed", "contribution_of_another_round"])
def test_every_honest_holder_refuses_to_open_anything_but_the_aggregate(fed, case):
    plan = _plan(fed, round_=2, min_clients={"below_minimum": 3, "one_hospital_plan_lowered": 1}.get(case, 2))
    _, clients, firsts, _ = _round(fed, plan)
    if case.startswith("one_hospital"):  # the attack of SECURITY.md: open east's update (a plan saying 1 too)
        data, why = _forged_request(fed, plan, firsts, contributors=["east"]), "minimum is 2"
    elif case == "below_minimum":
        data, why = _forged_request(fed, plan, firsts, contributors=["east", "north"]), "minimum is 3"
    elif case == "one_c1_coefficient_changed":  # s_i*delta would leak through a share of c1 + delta
        inner = bytearray(_inner(firsts, "east"))
        inner[-100] ^= 1  # inside east's last c1 part: one coefficient moves
        was, now = (U.read_c1(fed.hospitals["east"].keys.threshold.public, load_payload(parse_envelope(bytes(b)), ThresholdUpdate).c1, "east")[-1]
                    for b in (_inner(firsts, "east"), inner))
        assert np.count_nonzero(was != now) == 1
        data, why = _forged_request(fed, plan, firsts, contributors=[bytes(inner), "north", "south"]), \
            "not validly signed"
    else:  # east's signed update of round 1 replayed into round 2's sum
        _, _, old, _ = _round(fed, _plan(fed, round_=1))
        data, why = _forged_request(fed, plan, firsts, contributors=[_inner(old, "east"), "north", "south"]), \
            "not its update for round 2"
    for n, client in clients.items():
        with pytest.raises(IntegrityError, match=f"Hospital '{n}' refuses to decrypt: .*{why}.*report the server"):
            client.handle(data)


def test_a_contribution_chosen_after_another_c1_was_revealed_is_refused(fed):
    """The colluding-contributor attack: south, shown north's c1 by the server, signs minus it, so
    that the sum is east's c1 alone. Its c1 is not the one it committed to before anyone revealed:
    every honest holder refuses; and no hospital reveals twice."""
    plan = _plan(fed, round_=8)
    server, clients, firsts, _ = _round(fed, plan)
    public = fed.hospitals["east"].keys.threshold.public
    north = U.read_c1(public, load_payload(parse_envelope(_inner(firsts, "north")), ThresholdUpdate).c1, "north")
    honest = load_payload(parse_envelope(_inner(firsts, "south")), ThresholdUpdate)
    crafted = [C.pack_words(T.submod(np.zeros_like(p), p, public._c.ring.q(2)), 60) for p in north]
    south = seal(honest.model_copy(update={"c1": tuple(crafted)}), fed.ids["south"])  # south's own signature
    data = _forged_request(fed, plan, firsts, contributors=["east", "north", south])
    for n in ("east", "north"):
        with pytest.raises(IntegrityError, match=f"'{n}' refuses to decrypt: 'south' signed a c1 it did not commit"):
            clients[n].handle(data)
    again = seal(ThresholdCommitments(federation_id=FED, round=8, commits=tuple(
        server._commits[n][0] for n in sorted(server._commits))), SERVER)
    with pytest.raises(IntegrityError, match="refuses a second commitment set"):
        clients["east"].handle(again)


def test_holders_decrypt_only_the_sum_they_computed(fed):
    """The request names no c1: each holder's share answers the sums it added itself (canary last);
    a combiner that built its request on anything else (one hospital's ciphertext) gets shares that
    answer another request, and opens nothing."""
    plan = _plan(fed, round_=7)
    server, clients, firsts, _ = _round(fed, plan)
    for data in firsts.values():
        server.receive(parse_envelope(data))
    requests = server.next_stage()
    public = fed.hospitals["east"].keys.threshold.public
    c1 = U.sum_c1(public, [U.read_c1(public, load_payload(parse_envelope(_inner(firsts, n)), ThresholdUpdate).c1, n)
                           for n in NAMES])
    seed = load_payload(parse_envelope(requests["east"]), ThresholdDecrypt).canary_seed
    mine = DecryptionRequest(federation_id=FED, round=7, c1=tuple(
        p.astype("<u8").tobytes() for p in (*c1, seeded_canary(seed=seed, public=public)[0])))
    shares = {n: load_payload(parse_envelope(clients[n].handle(requests[n])), DecryptionShare) for n in NAMES}
    assert {s.request_sha256 for s in shares.values()} == {mine.digest()} == {server._combiner.request.digest()}
    up = load_payload(parse_envelope(firsts["east"]), ThresholdUpload)
    east_only = U.aggregate(public, c0=[U.read_c0(public, up.c0, "east")],
                            c1_sums=U.read_c1(public, load_payload(parse_envelope(up.update), ThresholdUpdate).c1, "east"))
    liar = Combiner(public=public, round=7, aggregate=east_only, contributions=1, canary_seed=seed)
    with pytest.raises(ProtocolError, match="answers another request"):
        liar.combine(shares, length=10)


def test_a_second_request_in_a_round_is_refused(fed):
    plan = _plan(fed, round_=3)
    _, clients, firsts, _ = _round(fed, plan)
    first = _forged_request(fed, plan, firsts, contributors=NAMES)
    second = _forged_request(fed, plan, firsts, contributors=["east", "north"])
    assert clients["south"].handle(first)
    with pytest.raises(IntegrityError, match="second decryption request"):
        clients["south"].handle(second)


def test_a_contribution_not_signed_by_its_hospital_is_refused(fed):
    plan = _plan(fed, round_=4)
    _, clients, firsts, _ = _round(fed, plan)
    msg = load_payload(parse_envelope(_inner(firsts, "north")), ThresholdUpdate)
    forged = seal(msg, Identity.generate("north"))  # the server's own key, under north's name
    data = _forged_request(fed, plan, firsts, contributors=["east", forged, "south"])
    with pytest.raises(IntegrityError, match="not validly signed"):
        clients["east"].handle(data)


def test_a_holder_refuses_a_collective_key_without_its_own_share():
    ids = {n: Identity.generate(n) for n in NAMES}
    enrolled = {n: i.public for n, i in ids.items()}
    holders = {n: CkksKeyHolder(identity=i, peers=enrolled, federation_id=FED) for n, i in ids.items()}
    seed = secrets.token_bytes(32)
    shares = {n: h.on_setup("tckks/keygen", {"federation": FED.encode(), "preset": b"threshold_128", "seed": seed})
              ["share"] for n, h in holders.items()}
    impostor = CkksKeyHolder(identity=ids["east"], peers=enrolled, federation_id=FED)  # a key the server would know
    shares["east"] = impostor.on_setup("tckks/keygen", {"federation": FED.encode(), "preset": b"threshold_128",
                                                        "seed": seed})["share"]
    parts = {"seed": seed, **{f"share/{n}": s for n, s in shares.items()}}
    with pytest.raises(IntegrityError, match="does not contain its own key-generation share"):
        holders["east"].on_setup("tckks/public", parts)
    assert holders["north"].on_setup("tckks/public", parts)["digest"]  # the others cannot tell; east is named


def test_a_missing_holder_aborts_the_round_n_of_n(fed):
    plan = _plan(fed, round_=5)
    server, clients, firsts, _ = _round(fed, plan)
    for data in firsts.values():
        server.receive(parse_envelope(data))
    requests = server.next_stage()
    for n in ("east", "north"):
        server.receive(parse_envelope(clients[n].handle(requests[n])))
    with pytest.raises(ProtocolError, match="missing from south"):
        server.next_stage()


def test_a_share_under_a_wrong_key_share_is_refused_and_its_holder_named(fed):
    """A holder answering with another key share (a stale one, say) passes its own check but fails
    the seeded canary: the combination is refused and the holder named."""
    from clinograph.secure.ckks.threshold import ThresholdParty, ThresholdPreset

    plan = _plan(fed, round_=6)
    server, clients, firsts, _ = _round(fed, plan)
    for data in firsts.values():
        server.receive(parse_envelope(data))
    requests = server.next_stage()
    north = clients["north"]
    north._party = ThresholdParty(preset=ThresholdPreset.THRESHOLD_128, federation_id=FED, name="north")
    for n, client in clients.items():
        server.receive(parse_envelope(client.handle(requests[n])))
    with pytest.raises(IntegrityError, match="Decryption share\\(s\\) of north are not made with their key share"):
        server.next_stage()
    with pytest.raises(ProtocolError, match="not decrypted"):
        server.result()


def test_the_seeded_canary_is_reproducible_and_seed_bound(fed):
    public = fed.hospitals["east"].keys.threshold.public
    seed = bytes(range(32))
    a, u = seeded_canary(seed=seed, public=public)
    b, _ = seeded_canary(seed=seed, public=public)
    c, _ = seeded_canary(seed=bytes(32), public=public)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    coeffs = T.to_coefficients(u, ring=public._c.ring, context=public._c.context, parms_id=public._c.ring.data_parms_id)
    assert set(np.unique(T.centered(coeffs, public._c.ring.primes)).tolist()) == {-1, 0, 1}  # ternary u
    with pytest.raises(ProtocolError, match="32 bytes"):
        seeded_canary(seed=b"short", public=public)


def test_a_mode_holder_refuses_the_unchecked_decrypt_step(fed):
    """The library's ``tckks/decrypt`` set-up step decrypts any c1; a hospital of the mode refuses it."""
    with pytest.raises(ProtocolError, match="answers no unchecked decryption request"):
        fed.hospitals["east"].on_setup("tckks/decrypt", {"request": b"anything"})


# -- t-of-N: [federation] tckks_threshold = 2 of the 3 holders ---------------------------------------

@pytest.fixture(scope="module")
def fed2():
    ids = {n: Identity.generate(n) for n in NAMES}
    enrolled = {n: i.public for n, i in ids.items()}
    hospitals = {n: _Hospital(i, enrolled) for n, i in ids.items()}
    mode = create_mode("ckks_threshold")
    run = mode.open_run(federation=SimpleNamespace(min_clients=2, tckks_threshold=2),
                        transport=InProcessTransport(hospitals), run_id=FED, enrolled=enrolled, max_weight=10.0,
                        on_event=lambda k, d: None)
    return SimpleNamespace(ids=ids, enrolled=enrolled, hospitals=hospitals, mode=mode, run=run, events=[])


def _t_round(fed, round_, participants, min_clients=2, reveal=None):
    plan = RoundPlan(federation_id=FED, round=round_, participants=participants, spec=SPEC, dictionary_hash="d" * 64,
                     secure_mode="ckks_threshold", strategy="fedavg", min_clients=min_clients, local_epochs=1,
                     global_state_digest="0" * 64, options=fed.run.options(participants))
    server = fed.run.server(plan=plan, peers=fed.enrolled, identity=SERVER)
    ups = {n: u for n, u in _updates().items() if n in participants}
    clients = {n: fed.mode.make_client(plan=plan, identity=fed.ids[n], server=SERVER.public, peers=fed.enrolled,
                                       update=ups[n], keys=fed.hospitals[n].keys) for n in participants}
    for c in clients.values():  # stage commit, then every hospital reveals its upload against the set
        server.receive(parse_envelope(c.first_message()))
    for n, data in server.next_stage().items():
        if reveal is None or n in reveal:
            server.receive(parse_envelope(clients[n].handle(data)))
    return server, clients, ups


def test_t_of_n_set_up_records_the_rule_and_every_holders_index(fed2):
    (kind, payload), = fed2.run.audit
    assert payload["rule"] == "2-of-3" and payload["threshold"] == 2
    assert payload["share_index"] == {"east": 1, "north": 2, "south": 3}
    assert fed2.run.options(NAMES)["tckks.threshold"] == 2
    aggregate = {"round": 1, "contributors": ["east", "north"], "decrypted_by": ["east", "north"]}
    _, rows = fed2.mode.describe(fed2.run.options(NAMES), {kind: [payload], "aggregate": [aggregate]})
    table = dict(rows)
    assert table["who holds a share of the secret key"].startswith("east (index 1), north (index 2), south (index 3)")
    assert "any 2 of the 3 holders" in table["who holds the whole secret key"]
    assert table["key holders whose shares opened each round"] == "round 1: east, north"


@pytest.mark.parametrize("participants", [NAMES, ("east", "south")])
def test_t_of_n_a_round_asks_only_t_live_holders_and_opens_the_sum(fed2, participants):
    """All three upload: only east and north are asked. North gone before uploading: east and south."""
    server, clients, ups = _t_round(fed2, 10 + len(participants), participants)
    requests = server.next_stage()
    assert tuple(sorted(requests)) == participants[:2] == server.decrypted_by
    for n, data in requests.items():
        server.receive(parse_envelope(clients[n].handle(data)))
    assert server.next_stage() is None
    want = sum(u.modules["gnn/w"] for u in ups.values())
    assert np.max(np.abs(server.result().sums["gnn/w"] - want)) < 1e-6


def test_t_of_n_fewer_than_t_holders_decrypt_nothing(fed2):
    """North commits, then drops before revealing: one holder's update, t = 2 (a lone committed
    hospital would already refuse to reveal: below the floor of 2 contributors)."""
    server, _, _ = _t_round(fed2, 20, ("east", "north"), min_clients=1, reveal=("east",))
    with pytest.raises(ProtocolError, match=r"Only 1 key holder\(s\) sent an update .*2-of-3 needs 2"):
        server.next_stage()


def test_t_of_n_a_share_under_a_wrong_key_share_is_refused_naming_the_present_set(fed2):
    server, clients, _ = _t_round(fed2, 21, NAMES)
    requests = server.next_stage()
    party = clients["north"]._party
    kept = party._shamir
    party._shamir = (np.random.default_rng(5).integers(0, 2**40, size=kept[0].shape, dtype=np.uint64), *kept[1:])
    try:
        for n, data in requests.items():
            server.receive(parse_envelope(clients[n].handle(data)))
    finally:
        party._shamir = kept
    with pytest.raises(IntegrityError, match="share of one of east, north is not made with its key share"):
        server.next_stage()


def test_t_of_n_a_holder_dropping_before_its_share_is_replaced_for_the_same_sum(fed2):
    server, clients, ups = _t_round(fed2, 22, NAMES)
    first = server.next_stage()
    assert tuple(sorted(first)) == ("east", "north")
    server.receive(parse_envelope(clients["east"].handle(first["east"])))  # north drops after uploading
    second = server.next_stage()
    assert tuple(sorted(second)) == ("east", "south") == server.decrypted_by
    for n, data in second.items():
        server.receive(parse_envelope(clients[n].handle(data)))
    assert server.next_stage() is None
    want = sum(u.modules["gnn/w"] for u in ups.values())  # north's update is in the sum
    assert np.max(np.abs(server.result().sums["gnn/w"] - want)) < 1e-6
    with pytest.raises(IntegrityError, match="second decryption request"):  # each present set once
        clients["east"].handle(second["east"])


def test_t_of_n_honest_holders_never_answer_two_different_sums_of_one_commitment_set(fed2):
    """Server + north (t - 1 = 1 holder): the full sum to east with present (east, north), the sum
    without east's update to south with present (north, south). North fills in its own shares, so
    both sums open and their difference is east's update: south must refuse the sub-sum."""
    server, clients, _ = _t_round(fed2, 40, NAMES)
    msg = load_payload(parse_envelope(server.next_stage()["east"]), ThresholdDecrypt)
    clients["east"].handle(seal(msg.model_copy(update={"present": ("east", "north")}), SERVER))
    sub = msg.model_copy(update={"present": ("north", "south"),
                                 "updates": tuple(u for u in msg.updates if parse_envelope(u).sender != "east")})
    with pytest.raises(IntegrityError, match="leaves out committed contribution.* of 'east'"):
        clients["south"].handle(seal(sub, SERVER))


def test_a_hospital_committing_without_revealing_aborts_the_round_before_decryption(fed2):
    server, _, _ = _t_round(fed2, 41, NAMES, reveal=("east", "north"))
    with pytest.raises(ProtocolError, match="south committed but sent no update"):
        server.next_stage()


def test_t_of_n_a_replacement_holder_answers_only_the_same_committed_sum(fed2):
    """Under the commit stage, north drops before its share: the server may re-send the *same*
    decryption message (the same committed contributions and canary seed) to east and south. East,
    which answered already, refuses the same present set twice, a new canary seed, or a sum
    without north's committed contribution; its shares for the two present sets differ (fresh
    smudging and a zero-sharing mask for each set); the replaced set opens the full sum."""
    server, clients, ups = _t_round(fed2, 23, NAMES)
    first = server.next_stage()
    raw1 = clients["east"].handle(first["east"])
    server.receive(parse_envelope(raw1))
    second = server.next_stage()  # north went silent
    assert tuple(sorted(second)) == ("east", "south")
    msg = load_payload(parse_envelope(second["east"]), ThresholdDecrypt)
    assert msg.present == ("east", "south") and msg.updates == load_payload(parse_envelope(first["east"]),
                                                                            ThresholdDecrypt).updates
    for forged in (msg.model_copy(update={"canary_seed": secrets.token_bytes(32)}),
                   msg.model_copy(update={"updates": tuple(u for u in msg.updates
                                                           if parse_envelope(u).sender != "north")}),
                   msg.model_copy(update={"present": ("east", "north")}),
                   msg.model_copy(update={"present": ("east", "north")})):
        with pytest.raises(IntegrityError, match="'east' refuses a second decryption request"):
            clients["east"].handle(seal(forged, SERVER))
    for reordered in (("north", "east"), ("south", "east"), ("east", "east", "south")):  # fresh smudging, same λ
        with pytest.raises(IntegrityError, match="'east' refuses .* present set is not sorted and distinct"):
            clients["east"].handle(seal(msg.model_copy(update={"present": reordered}), SERVER))
    raw2 = clients["east"].handle(second["east"])
    share1, share2 = (load_payload(parse_envelope(r), DecryptionShare) for r in (raw1, raw2))
    assert share2.request_sha256 != share1.request_sha256 and share2.shares[0] != share1.shares[0]
    server.receive(parse_envelope(raw2))
    server.receive(parse_envelope(clients["south"].handle(second["south"])))
    assert server.next_stage() is None and server.decrypted_by == ("east", "south")
    want = sum(u.modules["gnn/w"] for u in ups.values())  # north's committed update is in the sum
    assert np.max(np.abs(server.result().sums["gnn/w"] - want)) < 1e-6
