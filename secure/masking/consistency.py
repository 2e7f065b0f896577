"""The signed consistency check of the ``masked`` mode (Bonawitz et al. 2017, round 4 "ConsistencyCheck").

After the masked inputs are in, the server sends every survivor the survivor set U3. Each
client checks U3 (:func:`check_survivor_set`), answers with a :class:`~.messages.ConsistencySignature`
naming ``survivors_digest(federation, round, sorted U3)`` in its signed envelope, and
remembers the U3 it signed; it signs at most one U3 per round. With the unmask request the
server forwards, for t signers, that envelope's payload bytes and signature as received (t is
what the check needs; forwarding all |U3| made every request O(n) bytes), and for the signers
that recipient's confirmed group goes through (:func:`check_confirmed_group`);
before revealing any share a client requires (:func:`check_signatures`) the request's
survivors to be exactly the U3 it signed and at least t valid signatures on that U3 from
distinct members of U3 -- any forged, foreign, repeated or out-of-U3 signature is refused.

One signature, not two (masked/2). Earlier versions signed (federation, round, U3) under
their own context *and* the envelope around it, and the server verified both. Now the
envelope signature is the consistency signature. It is the same guarantee: the envelope
signature covers ``SIG_MESSAGE || 0x00 || kind || 0x00 || payload`` (``secure/wire.py``), the
kind ``masked_consistency_signature`` is signed by a client only at stage 3, once a round,
and the payload is parsed strictly and must name the signer, this federation and round (and
ModelSpec, dictionary and -- masked/3 -- the global model the round starts from and the plan) and the
SHA-256 digest of the domain-separated (federation, round, sorted U3)
(:func:`~.stages.open_relayed`). So a valid relayed signature exists only if that client signed
that U3 for this federation and round -- the statement the separate signature made -- under
Ed25519's unforgeability plus SHA-256's collision resistance (the digest; Ed25519 itself hashes
with SHA-512). Kinds never contain 0x00, so no other message a client signs can
be read as one of these. The same argument makes the :class:`~.messages.AdvertiseKeys`
envelope the key signature of round 0 (its payload names the client, round and both keys).
Saved: one signature per client and one verification per client at the server, twice a round.

Guarantees: every honest client that reveals a share saw a U3 that at least t distinct
participants signed, for this federation and round. Since an honest client signs one U3 per
round, two honest clients can be made to reveal under *different* survivor sets only if at
least 2t - |U3_a cup U3_b| >= 2t - n participants signed both, i.e. collude with the server
(Bonawitz et al.'s condition t > (n + n_C)/2); and a client given a U3 that nobody else
confirmed (too few signatures) reveals nothing.

Does not guarantee: a collusion bound of t against a lying server. Each side of a split view
can form its own quorum of t signers, so the bound on colluding share holders of one client
stays c >= 2t - (k+1), as with the double-listing refusal alone (for a complete graph,
n = k+1, the two bounds coincide; for a sparse SecAgg+ graph, 2t - n is weaker). What each
side's sum covers is floored within its own view: a signer's group in U3 (:func:`check_survivor_set`)
and its group walked through confirming signers (:func:`check_confirmed_group`) have at least
max(t, min_clients) members. Across views it is not: below t = k on a sparse graph, one view's
self-mask seeds and another's pairwise-key secrets of the same neighbours open one update with no
colluder (n = 10, k = 4, t = 3, demonstrated), and colluders that cut U3 open one side's sum
(SECURITY.md). See :mod:`clinograph.secure.masking.params` for the bounds that hold.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

from clinograph.core.errors import IntegrityError, ProtocolError
from clinograph.core.identity import PublicIdentity
from clinograph.core.labels import SIG_MASKED_CONSISTENCY

from ..messages import RoundPlan
from .messages import ConsistencySignature, SurvivorSignature
from .params import NeighbourGraph, confirmed_group
from .stages import open_relayed, round_context


def signing_bytes(plan: RoundPlan, survivors: Iterable[str]) -> bytes:
    """Length-prefixed (federation, round, sorted U3): what :func:`survivors_digest` hashes."""
    return round_context(plan, *sorted(survivors))


def survivors_digest(plan: RoundPlan, survivors: Iterable[str]) -> str:
    """SHA-256 (hex) of ``SIG_MASKED_CONSISTENCY || 0x00 || signing_bytes``: the U3 a
    :class:`~.messages.ConsistencySignature` vouches for (its envelope signature signs it)."""
    return hashlib.sha256(SIG_MASKED_CONSISTENCY + b"\x00" + signing_bytes(plan, survivors)).hexdigest()


def check_survivor_set(*, me: str, survivors: Iterable[str], participants: Iterable[str],
                       threshold: int, min_clients: int = 1, neighbours: Iterable[str] = (),
                       masked_with: Iterable[str] = (), graph: NeighbourGraph | None = None) -> tuple[str, ...]:
    """Return U3 sorted, or raise ProtocolError unless it is a set of at least max(t, ``min_clients``)
    participants containing ``me`` that lists none of ``me``'s ``neighbours`` outside ``masked_with``.
    ``min_clients``: the signed plan's; the server closes a stage below it, so only a lying server
    shows a smaller U3 -- whose sum, with colluders among its members, would be the few updates the
    plan's floor was to hide.

    ``masked_with``: the neighbours whose shares the server forwarded to ``me`` (U2 among them:
    Bonawitz et al. 2017 require U3 within U2). An honest server forwards every share a U2 member
    dealt, and the dealer must deal one to each keyed neighbour, so a neighbour in U3 is always one
    ``me`` masked with. Before (session 52), a lying server met the floor by listing in U3
    hospitals that never masked with the group it unmasks (they "dropped" at stage 1 for it): three
    hospitals revealed their self-mask shares under a plan whose ``min_clients`` was 4. The check
    sees neighbours only; hence also:

    ``graph``: the round's public neighbour graph. ``me``'s group in U3 (:meth:`.params.NeighbourGraph.
    component`: the members joined to it by neighbour edges within U3) must have at least max(t,
    ``min_clients``) members: a group with no edge to the rest of U3 is a sum the server can open on
    its own. Before (session 53), in a sparse graph (n = 8, k = 4, t = 3, ``min_clients`` = 4) a server
    that kept the inputs of three mutual neighbours and of one hospital neighbouring none of them met
    the floor "on paper": all four signed and revealed their shares, and the server could open the sum
    of the three (the fourth's self-mask has no holder left in U3). In a complete graph U3 is one group."""
    u3 = tuple(survivors)
    people = set(participants)
    if len(set(u3)) != len(u3):
        raise ProtocolError("Survivor set U3 repeats a client. Refused (malicious or broken server).")
    strangers = sorted(set(u3) - people)
    if strangers:
        raise ProtocolError(f"Survivor set U3 names {len(strangers)} client(s) that are not participants of the "
                            "round plan. Refused.")
    if me not in u3:
        raise ProtocolError(f"Survivor set U3 does not list {me!r} itself. Refused.")
    absent = sorted((set(u3) & set(neighbours)) - set(masked_with) - {me})
    if absent:
        raise ProtocolError(f"Survivor set U3 lists {len(absent)} neighbour(s) of {me!r} whose shares never reached "
                            f"it ({', '.join(repr(a) for a in absent[:3])}{', ...' if len(absent) > 3 else ''}): their "
                            "masked inputs cannot be in the sum it helps open, so U3 overstates who is in it (the "
                            "plan's min_clients floor met on paper). Refused (malicious or broken server).")
    if len(u3) < threshold:
        raise ProtocolError(f"Survivor set U3 has {len(u3)} client(s), below the threshold {threshold}. Refused.")
    if len(u3) < min_clients:
        raise ProtocolError(f"Survivor set U3 has {len(u3)} client(s), below the round's floor {min_clients} "
                            "(min_clients of the signed plan): its sum would be over fewer hospitals than the plan "
                            "promised. Refused (malicious or broken server).")
    if graph is not None:
        group, floor = graph.component(me, u3), max(threshold, min_clients)
        if len(group) < floor:
            raise ProtocolError(
                f"Survivor set U3 has {len(u3)} client(s), but only {len(group)} of them (this client included) are "
                f"joined to {me!r} by masking neighbours; the others share no pairwise mask with that group, so its "
                f"sum could be opened on its own -- a sum over fewer than {floor} hospitals (max of the threshold and "
                "min_clients of the signed plan). Refused (malicious or broken server, or dropouts that cut the "
                "neighbour graph).")
    return tuple(sorted(u3))


def check_signatures(*, plan: RoundPlan, signed: tuple[str, ...], survivors: Iterable[str],
                     signatures: Iterable[SurvivorSignature], peers: Mapping[str, PublicIdentity],
                     threshold: int, digest: str | None = None) -> frozenset[str]:
    """Refuse an unmask request whose U3 is not the one this client signed, or is not vouched for
    by at least ``threshold`` valid signatures from distinct members of U3 (Bonawitz et al. 2017,
    round 5 check). Every listed signature must name a distinct member of U3; signatures are
    verified in the order listed until ``threshold`` of them are valid (what the guarantee
    needs), and a bad one met before that is refused, not skipped. Those listed after the
    first ``threshold`` valid ones are not verified: they add nothing to the check, and
    verifying all |U3| of them made the check the costliest part of a small round.

    ``digest``: :func:`survivors_digest` of ``signed``, if the caller kept it when it signed.

    Returns the clients whose signatures it verified (:func:`check_confirmed_group` does not redo them).

    Raises:
        ProtocolError: naming what was wrong (never a key or signature bytes).
    """
    if tuple(sorted(survivors)) != signed:
        raise ProtocolError("Unmask request's survivor set differs from the survivor set U3 this client signed at "
                            "the consistency check. Refused (the server shows clients different views).")
    digest, spec_digest, seen = digest or survivors_digest(plan, signed), plan.spec.digest(), set()
    members, verified = set(signed), set()
    for s in signatures:
        if s.client in seen:
            raise ProtocolError(f"Consistency signatures list {s.client!r} twice. Refused.")
        if s.client not in members or s.client not in peers:
            raise ProtocolError(f"Consistency signature from {s.client!r}, who is not in the survivor set U3 "
                                "(or not enrolled). Refused.")
        if len(seen) < threshold:
            _verify(plan, s, peers[s.client], digest=digest, spec_digest=spec_digest)
            verified.add(s.client)
        seen.add(s.client)
    if len(seen) < threshold:
        raise ProtocolError(f"Only {len(seen)} valid consistency signature(s) on U3; the threshold is {threshold}. "
                            "Refused: too few clients confirmed this survivor set.")
    return frozenset(verified)


def _verify(plan: RoundPlan, s: SurvivorSignature, key: PublicIdentity, *, digest: str, spec_digest: str) -> None:
    """ProtocolError unless ``s`` is its client's consistency signature on the U3 of ``digest`` for this
    federation and round (:func:`.stages.open_relayed`); never shows key or signature bytes."""
    try:
        ok = open_relayed(plan, client=s.client, payload=s.payload, signature=s.signature, key=key,
                          model=ConsistencySignature, spec_digest=spec_digest).survivors_digest == digest
    except (IntegrityError, ProtocolError):
        ok = False
    if not ok:
        raise ProtocolError(f"Consistency signature of {s.client!r} does not verify on this federation, round and "
                            "survivor set U3. Refused (forged or for another view).")


def check_confirmed_group(*, plan: RoundPlan, me: str, signed: tuple[str, ...],
                          signatures: Iterable[SurvivorSignature], peers: Mapping[str, PublicIdentity],
                          graph: NeighbourGraph, floor: int, digest: str | None = None,
                          verified: frozenset[str] = frozenset()) -> None:
    """Refuse an unmask request unless ``me``'s group in U3 joined through hospitals whose consistency
    signatures on U3 the request carries (:func:`.params.confirmed_group`) has at least ``floor``
    (max(t, min_clients)) members. Run after :func:`check_signatures` (which checked that every listed
    signature names a distinct member of U3). A signature is verified only when the walk goes through
    its signer (``verified``: those :func:`check_signatures` verified already); one that does not
    verify is refused, as there.

    Why: the stage-3 check (:func:`check_survivor_set`) counts ``me``'s group by the graph's edges,
    but only a hospital that signed U3 checked that it masked with each of its neighbours in U3. A
    lying server kept in U3 a hospital it had not forwarded one neighbour's shares to (so it did not
    mask with that neighbour; it refused to sign, which the server did not need) and opened the sum
    on its side of that edge: four hospitals at n = 10, k = 4, t = 3, under min_clients = 7, no
    colluder (session 53, reproduced)."""
    digest, spec_digest = digest or survivors_digest(plan, signed), plan.spec.digest()
    listed = {s.client: s for s in signatures}

    def verify(client: str) -> None:
        if client not in verified:
            _verify(plan, listed[client], peers[client], digest=digest, spec_digest=spec_digest)

    group, _ = confirmed_group(graph, me, signed, listed.__contains__, floor, verify)
    if len(group) < floor:
        raise ProtocolError(
            f"Unmask request: only {len(group)} member(s) of U3 (this client included) are joined to {me!r} through "
            f"hospitals that confirmed U3 (their consistency signatures in the request); a hospital that did not "
            f"confirm it may not have masked with its neighbours, so a sum over fewer than {floor} hospitals (max of "
            "the threshold and min_clients of the signed plan) could be opened. Refused (malicious or broken "
            "server, or too few confirmations for the neighbour graph).")
