"""Liveness under an honest server (property test, derandomized): with hospitals going silent at any
stage, for n = 4 ... 40 with the default k and t, a masked round either completes with the exact sum
of the hospitals whose masked inputs arrived -- exactly when every check a hospital or the server
makes can pass -- or aborts with a reason; never a hang, a wrong sum, a voided round or a hospital
refusing what the honest server sent."""

from __future__ import annotations

from clinograph.secure.masking import MaskingClient, MaskingServer
from clinograph.secure.masking.params import (
    MaskingParams,
    confirmed_group,
    masked_defaults,
    neighbour_graph,
    smallest_group,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from masking_helpers import expected_sums, identities, identity, make_plan, make_updates, rel_err

from clinograph.core.errors import IntegrityError, ProtocolError

SERVER = identity("server")


def _run(plan, updates, silent):
    """Drive one honest round; ``silent``: client -> the first stage (0..4) it does not answer.
    Returns the server, the hospitals that refused a server message, and U1..U5 as the server saw them."""
    ids = identities(plan)
    peers = {c: ids[c].public for c in plan.participants}
    server = MaskingServer(plan=plan, peers=peers, identity=SERVER)
    clients = {c: MaskingClient(plan=plan, identity=ids[c], server=SERVER.public, peers=peers, update=updates[c])
               for c in plan.participants}
    outgoing = {c: cl.first_message() for c, cl in clients.items() if silent.get(c, 5) > 0}
    refused = {}
    for stage in range(1, 6):  # at most five closes: a round cannot hang
        for c, data in outgoing.items():
            server.receive_bytes(c, data)
        msgs = server.next_stage() or {}
        outgoing = {}
        for c, data in msgs.items():
            if silent.get(c, 5) > stage:
                try:
                    outgoing[c] = clients[c].handle(data)
                except (ProtocolError, IntegrityError) as exc:
                    refused[c] = str(exc)
    assert server.stage == "done"
    return server, refused


def _predicted(plan, silent):
    """Whether the round can complete: every stage keeps max(t, min_clients) hospitals, U3's smallest
    group and every signer's confirmed group reach that floor, and every secret the server rebuilds (the
    self-masks of U3, the pairwise keys of U2 minus U3) has t holders among the hospitals that answer
    the unmask request. Hospitals that answered stage s: those silent from a later stage."""
    params = MaskingParams.from_plan(plan)
    k, t = params.neighbours, params.threshold
    need, g = max(t, plan.min_clients), neighbour_graph(plan, k)
    alive = [{c for c in plan.participants if silent.get(c, 5) > s} for s in range(5)]
    for s in (0, 1):  # who would stop for want of neighbours counts as gone at that stage
        short = {u for u in alive[s] if len(g[u] & alive[s]) + 1 < t}
        while short:
            alive[s] -= short
            short = {u for u in alive[s] if len(g[u] & alive[s]) + 1 < t}
        for later in alive[s + 1:]:
            later &= alive[s]
    if any(len(a) < need for a in alive):
        return False
    u2, u3, u4, u5 = alive[1], alive[2], alive[3], alive[4]
    if len(smallest_group(g, u3)) < need:
        return False
    if any(len(confirmed_group(g, u, u3, u4.__contains__, need)[0]) < need for u in u4):
        return False
    return all(len(set(g.holders(v)) & u5) >= t for v in u2)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(data=st.data())
def test_an_honest_round_with_random_dropouts_completes_exactly_or_aborts_with_a_reason(data):
    n = data.draw(st.integers(4, 40), label="n")
    d = masked_defaults(n)
    min_clients = data.draw(st.integers(2, n), label="min_clients")
    plan = make_plan(n, threshold=d.threshold, min_clients=min_clients)
    drops = data.draw(st.dictionaries(st.sampled_from(plan.participants), st.integers(0, 4),
                                      max_size=max(1, n // 4)), label="silent from stage")
    updates = make_updates(plan, seed=n)
    server, refused = _run(plan, updates, drops)
    assert refused == {}  # no hospital refuses what the honest server sent
    expect = _predicted(plan, drops)
    try:
        res = server.result()
    except ProtocolError as exc:
        assert "Round aborted, nothing published" in str(exc)
        assert server.voided_inputs is None
        assert not expect, str(exc)
        return
    assert expect
    sent_input = {c for c in plan.participants if drops.get(c, 5) > 2} & server._alive[1]
    assert set(res.contributors) == sent_input
    for name, v in expected_sums(updates, sent_input).items():
        assert rel_err(res.sums[name], v) < 1e-6


def test_hospitals_left_without_enough_neighbours_are_dropped_by_the_server_not_refusing():
    """n = 8 (k = 4, t = 4), two neighbouring hospitals silent from the start. Before (session 53), the
    honest server sent their neighbours key directories of two keyed neighbours and four hospitals refused
    them ('cannot be unmasked safely'), then the round aborted. Now the server counts them as gone (as
    their refusal would have), nobody refuses, and the round aborts with the reason."""
    plan = make_plan(8, threshold=4, min_clients=4)
    order = list(neighbour_graph(plan, 4))
    server, refused = _run(plan, make_updates(plan, seed=8), {order[0]: 0, order[1]: 0})
    assert refused == {}
    try:
        server.result()
    except ProtocolError as exc:
        assert "Round aborted, nothing published" in str(exc)
    else:
        raise AssertionError("a round whose every hospital lost two of its four neighbours completed")
