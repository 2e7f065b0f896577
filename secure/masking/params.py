"""Public parameters of the ``masked`` mode, carried in the signed RoundPlan's ``options``.

Keys: ``masked.threshold`` (t), ``masked.neighbours`` (k), ``masked.clip`` (bound on every
weighted value ``w_i * Delta_i``), ``masked.max_weight`` (bound on a client's weight),
``masked.scale`` / ``masked.weight_scale`` (fixed-point scales, eq. (1) of
:mod:`clinograph.secure.hazmat.fixedpoint`), ``masked.out_of_range`` (``"error"`` or
``"clip"``: an explicitly configured, counted clip) and, only when quantised,
``masked.word_bits = 16``.

Quantised mode (``word_bits = 16``, off by default). The parameter values travel in the ring
Z_{2^16} (2 bytes a parameter on the wire; weight and count slots stay 32-bit), with the
scale of eq. (1) for a 16-bit ring,

    scale16 = (2^15 - 1 - n) / (n * clip),                                   (2)

so the sum of n in-range values never wraps (same argument as eq. (1)). The price is
precision: each hospital's value is rounded to the nearest 1/scale16, so every coordinate of
the decoded sum is off by at most

    n / (2 * scale16) = n^2 * clip / (2 * (2^15 - 1 - n))                    (3)

(:func:`quantisation_error_bound`; e.g. 1.5e-3 for n = 10, clip = 1, against 2.3e-8 in the
32-bit ring). Configurations where a hospital's whole range [-clip, clip] would be fewer than
two quantisation steps (scale16 * clip < 1, i.e. n > ~2^14) are refused with a ConfigError
when the plan options are built, as is any plan whose 16-bit scale would let the sum wrap.

Neighbour graph (Bell et al. 2020, "SecAgg+"): a k-regular circulant (Harary) graph over
the participants in an order fixed by hashing the plan, so every client computes its own
neighbours from the signed plan. k = O(log n): the smallest even number >= log2(n), at
least 2, capped at n-1 (then the graph is complete). So n = 2 gives k = 1 (the two clients
are each other's only neighbour), n = 3 gives the triangle and n = 4 the 4-*cycle* (k = 2,
not the complete graph); the graph is complete again for n = 5 (k = 4). Each client's
secrets are shared among its k neighbours and itself (k+1 holders) with threshold t; we
require (k+1)/2 < t <= k+1 so that no server can collect t shares of *both* of a client's
secrets from honest holders.

Collusion bounds (c = colluding neighbours of a client u, i.e. share holders other than u; n
participants). Independently of t, u's k neighbours together know every pairwise mask of u,
and the server legitimately rebuilds u's self-mask when u survives, so **c = k always reveals
u's update**. Hence:

- Honest-but-curious server: u's update stays hidden while c < min(t, k) (t shares of a
  secret are needed; t-1 reveal nothing; all k neighbours know all pairwise masks). This is
  the SecAgg+ bound; with t = k+1 it is c < k, not c < k+1.
- Active server that lies about who dropped, including by sending *different* survivor sets
  to different clients: an honest client refuses a request listing anyone as both surviving
  and dropped, reveals at most once a round, and (signed consistency check, Bonawitz et al.
  2017 round 4, :mod:`.consistency`) only for the U3 it signed, vouched for by >= t valid
  signatures from distinct members of U3. Then: with c = 0 nobody is ever unmasked; two
  honest clients end up revealing under different survivor sets only if >= 2t - n
  participants signed both (collude); and u's update stays hidden exactly while
  c < min(2t - (k+1), k). The consistency check does **not** raise this to t: the colluders
  sign both views, so each side of a split view gathers its own t signatures (a test
  demonstrates it for n = 5, t = 3, c = 1). **Only on a complete graph** (session 53): on a
  sparse graph at t = k, k - 2 colluding neighbours of u suffice (u's seed from one view, the
  pairwise-key secrets of its two non-adjacent honest neighbours, shown as dropped, from the
  other; demonstrated at n = 10, k = 4); and below t = k: below it, on a sparse graph, two views signed by disjoint honest
  quorums (2t - n <= 0: no colluder needed) can give u's self-mask seed in one view and the
  pairwise-key secrets of all u's neighbours, "dropped" in the other, in the other -- u's update
  alone with c = 0 (n = 10, k = 4, t = 3, a test demonstrates it). With t = k and no colluder
  that route is closed: u's seed needs all its neighbours in one view, a neighbour's secret all
  that neighbour's other neighbours in the other, and in the circulant graph they share some.
- Liveness: a round completes iff no client loses more than k+1-t of its k+1 holders
  (itself included) to dropouts; t = k+1 tolerates no dropout at all.

:func:`masked_defaults` derives the default (k, t) from these bounds; see its docstring.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from clinograph.core.errors import ConfigError, ProtocolError
from clinograph.core.labels import HASH_NEIGHBOUR_GRAPH

from ..hazmat.fixedpoint import scale_for, wrap_free
from ..hazmat.x25519 import encode_context
from ..messages import RoundPlan

#: Ring sizes of the parameter values: 2^32 (default) or 2^16 (the quantised mode).
WORD_BITS = (32, 16)
HALF16 = 1 << 15


def neighbour_count(n_clients: int) -> int:
    """k = O(log n): smallest even k >= log2(n), k >= 2, capped at n - 1."""
    if n_clients < 2:
        raise ConfigError(f"Masked aggregation needs at least 2 participants, got {n_clients}.")
    k = max(2, math.ceil(math.log2(n_clients)))
    k += k % 2
    return min(k, n_clients - 1)


@dataclass(frozen=True)
class MaskedDefaults:
    """The default masked-mode parameters for ``n_clients`` participants and what they buy.

    ``max_colluders`` is the number of hospitals that may collude with an *active* server (one
    that lies about dropouts) while every honest hospital's update stays hidden: the worst
    case puts all colluders among one hospital's neighbours. ``tolerated_dropouts`` is how
    many hospitals may drop out of a round, anywhere, while the round still completes.
    ``reason`` states the argument in words (it goes into docs and logs; it holds no secret).
    """

    neighbours: int
    threshold: int
    tolerated_dropouts: int
    max_colluders: int
    reason: str


def masked_defaults(n_clients: int) -> MaskedDefaults:
    """Default neighbour count k and threshold t for the masked mode, from a stated argument.

    The argument. With k neighbours, k+1 share holders and threshold t (module docstring):

    * privacy against a server that lies about dropouts holds while fewer than
      min(2t - (k+1), k) of a hospital's neighbours collude with it (honest-but-curious
      server: min(t, k)); both grow with t;
    * liveness: a round survives up to k+1-t dropouts among any hospital's holders; this
      shrinks with t, and t = k+1 aborts the round whenever any one hospital goes offline.

    A crashed or slow hospital is the expected failure of a federation (the deployment test
    kills one mid-round), and a threshold that aborts on it invites operators to weaken the
    configuration. So the default is **the largest t that still tolerates one dropout**:
    t = k (for k >= 2). Any larger t aborts on one crash; any smaller t gives up collusion
    resistance for dropout tolerance that was not asked for. It yields k+1-t = 1 tolerated
    dropout and ``max_colluders`` = min(2t-(k+1), k) - 1 = k - 2 against a lying server on the
    complete graph (n <= 5), **k - 3 on a sparse graph** (session 53: k - 2 colluding neighbours
    and two survivor-set views expose a hospital whose two honest neighbours are not adjacent --
    its self-mask seed from one view, their pairwise-key secrets from the other; demonstrated at
    n = 10, k = 4 with 2; none found with k - 3 by random search at n = 10 and 20 -- a search,
    not a proof), and k - 1 against an honest-but-curious one. For the 4-hospital demo (a 4-cycle, k = 2,
    t = 2) that is 0 against a lying server and 1 against an honest-but-curious one; a
    federation that needs more should have more hospitals (k grows as log2 n) -- it is not
    reached by raising t on the 4-cycle without losing all dropout tolerance.

    Two hospitals (k = 1, the complete graph, t = 2, the only valid threshold) work, but the
    masking then hides each update from the server only: each hospital learns the aggregate,
    and the aggregate minus its own update *is* the other hospital's update. No dropout is
    tolerated (a one-hospital "sum" would be that hospital's update, so such a round aborts).

    Args:
        n_clients: participants in the round (>= 2).

    Returns:
        MaskedDefaults with ``neighbours`` = :func:`neighbour_count` and the threshold above;
        both pass :func:`masked_plan_options`.

    Raises:
        ConfigError: fewer than 2 participants.
    """
    if isinstance(n_clients, bool) or not isinstance(n_clients, int):
        raise ConfigError(f"n_clients must be an integer number of participants, got {type(n_clients).__name__}.")
    k = neighbour_count(n_clients)
    if k == 1:
        return MaskedDefaults(
            neighbours=1, threshold=2, tolerated_dropouts=0, max_colluders=0,
            reason=("Two-party masking (k = 1, t = 2): the masks hide each hospital's update from the server, "
                    "but not from the other hospital -- the aggregate minus your own update is the other "
                    "hospital's update, so each of the two learns the other's. The server colluding with either "
                    "hospital learns both. No dropout is tolerated: a round with one survivor aborts."))
    t = k
    lying = min(2 * t - (k + 1), k) - 1
    if k < n_clients - 1:  # sparse graph: a split view takes two non-adjacent honest neighbours' keys (params docstring)
        lying = max(0, lying - 1)
    curious = min(t, k) - 1
    return MaskedDefaults(
        neighbours=k, threshold=t, tolerated_dropouts=k + 1 - t, max_colluders=lying,
        reason=(f"t = k = {t}: the largest threshold that still completes a round when one hospital drops out "
                f"(k + 1 - t = {k + 1 - t}); with {n_clients} hospitals and k = {k} neighbours each, every "
                f"update stays hidden while at most {lying} hospital(s) collude with a server that lies about "
                f"dropouts ({curious} with an honest-but-curious server). All {k} neighbours of a hospital "
                "together always reveal its update."))


def check_threshold(*, threshold: int, neighbours: int) -> None:
    """Raise ConfigError unless (k+1)/2 < t <= k+1 (k neighbours plus the client itself hold shares)."""
    holders = neighbours + 1
    lo = holders // 2 + 1
    if isinstance(threshold, bool) or not isinstance(threshold, int) or not lo <= threshold <= holders:
        raise ConfigError(
            f"masked.threshold = {threshold!r} is invalid for {neighbours} neighbours: each secret has "
            f"{holders} share holders, so the threshold must be in [{lo}, {holders}] (more than half, "
            "so a server cannot rebuild both of a client's secrets). Pick a value in that range.")


def scale16_for(*, n_clients: int, bound: float) -> float:
    """The largest wrap-free scale for n values in [-bound, bound] in the ring 2^16, eq. (2).

    Raises ConfigError when the ring cannot give one hospital's range two quantisation steps."""
    scale = (HALF16 - 1 - n_clients) / (n_clients * bound)
    if not scale * bound >= 1:
        raise ConfigError(f"masked.word_bits = 16 cannot hold the sum of {n_clients} values in [-{bound:g}, {bound:g}]: "
                          f"one hospital's range would get {max(scale * bound, 0):.3g} quantisation steps (ring 2^16). "
                          "Use word_bits = 32 (the default) or fewer hospitals per round.")
    return scale


def wrap_free16(*, n_clients: int, bound: float, scale: float) -> bool:
    """Whether n encoded values in [-bound, bound] sum without wrapping the ring 2^16."""
    return n_clients * (bound * scale + 0.5) < HALF16


def quantisation_error_bound(*, n_clients: int, clip: float, word_bits: int = 32) -> float:
    """Largest error of one coordinate of the decoded masked sum, eq. (3) (and eq. (1) of
    fixedpoint for 32 bits): n / (2 * scale) with the scale masked_plan_options() chooses."""
    scale = scale16_for(n_clients=n_clients, bound=clip) if word_bits == 16 else \
        scale_for(n_clients=n_clients, bound=clip)
    return n_clients / (2 * scale)


def masked_plan_options(*, n_clients: int, threshold: int, clip: float, max_weight: float | None = None,
                        out_of_range: Literal["error", "clip"] = "error",
                        word_bits: int = 32) -> dict[str, float | int | str | bool]:
    """RoundPlan.options for the ``masked`` mode with n_clients participants.

    ``threshold`` is a security decision and has no default. ``clip`` bounds every weighted
    value ``w_i * Delta_i``; ``max_weight`` bounds weights (defaults to ``clip``).
    ``word_bits = 16`` selects the quantised mode (module docstring, eqs. (2)-(3)); an
    overflowing or meaningless 16-bit configuration is a ConfigError here.
    """
    if word_bits not in WORD_BITS:
        raise ConfigError(f"masked.word_bits must be 32 or 16, got {word_bits!r}.")
    k = neighbour_count(n_clients)
    check_threshold(threshold=threshold, neighbours=k)
    if not (isinstance(clip, int | float) and math.isfinite(clip) and clip > 0):
        raise ConfigError(f"masked.clip must be a finite number > 0, got {clip!r}.")
    mw = float(clip if max_weight is None else max_weight)
    if not (math.isfinite(mw) and mw > 0):
        raise ConfigError(f"masked.max_weight must be a finite number > 0, got {max_weight!r}.")
    if out_of_range not in ("error", "clip"):
        raise ConfigError(f"masked.out_of_range must be 'error' or 'clip', got {out_of_range!r}.")
    scale = scale16_for(n_clients=n_clients, bound=float(clip)) if word_bits == 16 else \
        scale_for(n_clients=n_clients, bound=float(clip))
    opts: dict[str, float | int | str | bool] = {
        "masked.threshold": threshold, "masked.neighbours": k, "masked.clip": float(clip), "masked.max_weight": mw,
        "masked.scale": scale, "masked.weight_scale": scale_for(n_clients=n_clients, bound=mw),
        "masked.out_of_range": out_of_range}
    if word_bits == 16:
        opts["masked.word_bits"] = 16
    return opts


@dataclass(frozen=True)
class MaskingParams:
    """Validated mode parameters of one round, read from a plan."""

    threshold: int
    neighbours: int
    clip: float
    max_weight: float
    scale: float
    weight_scale: float
    clip_out_of_range: bool
    word_bits: int = 32

    @property
    def value_dtype(self) -> type[np.unsignedinteger]:
        """Ring word of the parameter values: uint32, or uint16 in the quantised mode."""
        return np.uint16 if self.word_bits == 16 else np.uint32

    @classmethod
    def from_plan(cls, plan: RoundPlan) -> MaskingParams:
        """Read and validate ``plan.options``; a problem is a ConfigError naming the key."""
        o = plan.options
        missing = [k for k in ("masked.threshold", "masked.neighbours", "masked.clip", "masked.max_weight",
                               "masked.scale", "masked.weight_scale") if k not in o]
        if missing:
            raise ConfigError(f"RoundPlan.options lacks {missing} for secure_mode 'masked'. "
                              "Build the options with masked_plan_options(n_clients=, threshold=, clip=).")
        n = len(plan.participants)
        k, t = o["masked.neighbours"], o["masked.threshold"]
        expected = neighbour_count(n)  # the graph is fixed by n: a sparser one (a server's smaller k) would mask
        if type(k) is not int or k != expected:  # each update with fewer neighbours, so fewer colluders reveal it
            raise ConfigError(f"masked.neighbours = {k!r} is invalid for {n} participants: it must be {expected} "
                              "(neighbour_count(n): the smallest even k >= log2(n), at least 2, capped at n - 1). "
                              "Build the options with masked_plan_options(n_clients=, threshold=, clip=).")
        check_threshold(threshold=t, neighbours=k)  # type: ignore[arg-type]
        vals = {key: o[key] for key in ("masked.clip", "masked.max_weight", "masked.scale", "masked.weight_scale")}
        for key, v in vals.items():
            if not isinstance(v, float) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"{key} = {v!r} must be a finite float > 0.")
        bits = o.get("masked.word_bits", 32)
        if isinstance(bits, bool) or bits not in WORD_BITS:
            raise ConfigError(f"masked.word_bits must be 32 or 16, got {bits!r}.")
        if bits == 16 and not wrap_free16(n_clients=n, bound=vals["masked.clip"], scale=vals["masked.scale"]):  # type: ignore[arg-type]
            raise ConfigError(f"masked.scale is too large for {n} clients within masked.clip: sums would wrap the "
                              "2^16 ring of masked.word_bits = 16. Use masked_plan_options() to compute it.")
        for bound, sc in (("masked.clip", "masked.scale"), ("masked.max_weight", "masked.weight_scale")):
            if not wrap_free(n_clients=n, bound=vals[bound], scale=vals[sc]):  # type: ignore[arg-type]
                raise ConfigError(f"{sc} is too large for {n} clients within {bound}: sums would wrap the "
                                  "2^32 ring. Use masked_plan_options() to compute it.")
        oor = o.get("masked.out_of_range", "error")
        if oor not in ("error", "clip"):
            raise ConfigError(f"masked.out_of_range must be 'error' or 'clip', got {oor!r}.")
        return cls(threshold=t, neighbours=k, clip=vals["masked.clip"], max_weight=vals["masked.max_weight"],  # type: ignore[arg-type]
                   scale=vals["masked.scale"], weight_scale=vals["masked.weight_scale"],  # type: ignore[arg-type]
                   clip_out_of_range=oor == "clip", word_bits=int(bits))  # type: ignore[arg-type]


def accept_plan(plan: RoundPlan, *, release: object) -> None:
    """A hospital's check of a masked plan before it trains: the mode's parameters
    (:meth:`MaskingParams.from_plan`) and its own rule for the threshold -- ``release.masked_threshold``,
    the smallest t it accepts, or (unset) the default t of :func:`masked_defaults` for the plan's
    participant count. The server proposes t; a lower one needs fewer colluding neighbours to
    reveal an update (module docstring), so it is the hospital's choice, as ``tckks_threshold`` is.

    Raises:
        ConfigError: the plan's masked options are invalid (names the key).
        ProtocolError: t is below this hospital's rule (names both and the fix).
    """
    t = MaskingParams.from_plan(plan).threshold
    own = getattr(release, "masked_threshold", None)
    floor = masked_defaults(len(plan.participants)).threshold if own is None else int(own)
    if t < floor:
        rule = f"[release] masked_threshold = {own}" if own is not None else \
            f"unset [release] masked_threshold: the default t = {floor} for {len(plan.participants)} participants"
        raise ProtocolError(f"Round {plan.round}: the plan's masked.threshold t = {t} is below this hospital's rule "
                            f"({rule}); with a lower t fewer colluding neighbours reveal its update. Refused. If the "
                            f"federation agreed on t = {t}, put masked_threshold = {t} under [release] in the hospital "
                            "config.")


class NeighbourGraph(Mapping[str, frozenset[str]]):
    """Each participant's k neighbours: a read-only mapping that builds a neighbour set when it
    is first asked for (a hospital needs its own and its neighbours', not all n of them)."""

    def __init__(self, people: list[str], k: int):
        self._people, self._k = people, k
        self._at = {c: i for i, c in enumerate(people)}
        self._sets: dict[str, frozenset[str]] = {}
        self._holders: dict[str, tuple[str, ...]] = {}

    def __getitem__(self, c: str) -> frozenset[str]:
        got = self._sets.get(c)
        if got is None:
            i, n, people = self._at[c], len(self._people), self._people  # KeyError for a stranger
            if self._k >= n - 1:
                got = frozenset(people[:i] + people[i + 1:])
            else:
                half = self._k // 2
                got = frozenset(people[(i + d) % n] for d in range(-half, half + 1) if d)
            self._sets[c] = got
        return got

    def holders(self, owner: str) -> tuple[str, ...]:
        """Share holders of ``owner``'s secrets in index order: its neighbours and itself (cached)."""
        got = self._holders.get(owner)
        if got is None:
            got = self._holders[owner] = tuple(sorted(self[owner] | {owner}))
        return got

    def component(self, me: str, members: Iterable[str]) -> frozenset[str]:
        """The members joined to ``me`` by a path of graph edges within ``members`` (``me`` included).

        Why it matters: two members of U3 that are neighbours masked with each other (an honest
        signer checks it, :func:`~.consistency.check_survivor_set`), so their pairwise mask cancels
        only when both inputs are in one sum, and no honest hospital reveals the pairwise key of a
        survivor. A set of survivors with no edge to the rest of U3 is thus a sum the server can open
        on its own: in a sparse graph U3 can split into such groups, each a sum over fewer hospitals
        than U3 counts.

        On the circulant graph C_n(1..k/2) two members consecutive in the graph's order (cyclically)
        are neighbours when at most k/2 apart, and any two members at most k/2 apart are joined
        through the members between them: the groups are the runs of members between gaps wider
        than k/2. So: sort the members' positions, cut at those gaps -- O(|members| log |members|)
        integer steps, no neighbour set built (a breadth-first search built all n of them, about
        0.1 ms a hospital at n = 100); the same sets as the search (tested against it)."""
        inside = set(members) | {me}
        n = len(self._people)
        if self._k >= n - 1:  # the complete graph: one group
            return frozenset(inside)
        at, half = self._at, self._k // 2
        pos = sorted(at[c] for c in inside)  # KeyError for a stranger, as self[c]
        m = len(pos)
        cuts = [i for i in range(m) if (pos[(i + 1) % m] - pos[i]) % n > half]  # a gap after pos[i]
        if len(cuts) <= 1:  # one run around the cycle (one gap: a path)
            return frozenset(inside)
        mine = pos.index(at[me])
        start = max((c for c in cuts if c < mine), default=cuts[-1] - m) + 1  # the run after the last cut before me
        end = min((c for c in cuts if c >= mine), default=cuts[0] + m)  # ... to the first cut at or after me
        people = self._people
        return frozenset(people[pos[i % m]] for i in range(start, end + 1))

    def __iter__(self) -> Iterator[str]:
        return iter(self._people)

    def __len__(self) -> int:
        return len(self._people)


def smallest_group(graph: NeighbourGraph, members: Iterable[str]) -> frozenset[str]:
    """The smallest of the groups (:meth:`NeighbourGraph.component`) ``members`` fall into; each
    member's group found once. Empty for no members."""
    inside, seen, small = set(members), set(), frozenset()
    for u in sorted(inside):
        if u not in seen:
            group = graph.component(u, inside)
            seen |= group
            if not small or len(group) < len(small):
                small = group
    return small


def confirmed_group(graph: NeighbourGraph, me: str, members: Iterable[str], confirmed: Callable[[str], bool],
                    floor: int, verify: Callable[[str], None] | None = None) -> tuple[frozenset[str], tuple[str, ...]]:
    """``me``'s group in ``members`` joined through *confirmed* members only: it starts as ``me`` and its
    neighbours in ``members``; a confirmed member of the group (it signed U3, so it masked with each
    of its neighbours in U3: :func:`~.consistency.check_survivor_set`) adds its own neighbours. Greedy
    and deterministic, so the server and every hospital walk the same path: each step goes through the
    confirmed member that adds the most (ties: the smallest name), until the group has ``floor``
    members or no confirmed member adds any. ``verify``: called on each member gone through (a hospital
    verifies that signature then, and raises if it is bad). Returns the group and the members gone
    through, in order: the consistency signatures a hospital needs to walk it (about floor / (k/2)
    on a circulant graph, not n).

    Why (session 53, after :meth:`NeighbourGraph.component`): an edge of the graph is a pairwise mask
    only if both ends masked with each other, and a hospital checks its own ends only. A member that
    did not sign U3 may not have masked with a neighbour (the server withheld that neighbour's
    shares from it), so the sum on its side of that edge opens without the other side: at n = 10
    (k = 4, t = 3, min_clients = 7) a server kept such a hospital in a U3 of seven that was one group
    by the graph and opened the sum of four. Any sum the server can open holds a revealing signer
    whose neighbours in U3 are all in it (a signer's mask with each of them is in its input), so it
    holds that signer's confirmed group."""
    inside = set(members)
    seen = {me} | (graph[me] & inside)
    done, through = {me}, []
    while len(seen) < floor:
        best, gain = None, 0
        for v in sorted(seen - done):
            if confirmed(v):
                g = len((graph[v] & inside) - seen)
                if g > gain:
                    best, gain = v, g
        if best is None:
            break
        if verify is not None:
            verify(best)
        done.add(best)
        through.append(best)
        seen |= graph[best] & inside
    return frozenset(seen), tuple(through)


def neighbour_graph(plan: RoundPlan, k: int) -> NeighbourGraph:
    """Each participant's k neighbours: circulant graph over a plan-hashed order (complete if k = n-1).

    The order sorts participants by SHA-256(label || context(federation, round, name)); the
    common prefix is hashed once and each name appended to a copy of it (same digests)."""
    head = hashlib.sha256(HASH_NEIGHBOUR_GRAPH + encode_context([plan.federation_id, plan.round]))

    def rank(c: str) -> bytes:
        h = head.copy()
        raw = c.encode()
        h.update(len(raw).to_bytes(4, "big") + raw)  # = encode_context([c]): the order is unchanged
        return h.digest()

    return NeighbourGraph(sorted(plan.participants, key=rank), k)
