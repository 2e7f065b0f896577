"""Masked rounds at scale: seconds per round and the server's peak memory against n and P.

    python -m benchmarks.secure_aggregation_cost.scale           # n in {10, 20, 50, 100}, P in {1e4, 1e5, 1e6}
    python -m benchmarks.secure_aggregation_cost.scale --quick   # n in {10, 20}, P = 1e4; prints JSON, writes nothing

Every round is the real masked protocol (benchmarks/secure_aggregation_cost/secure_aggregation_masked.py's setup:
threshold t = masked_defaults(n), neighbours k = O(log n)) with dropouts at as many stages as
the neighbour graph allows: the default t = k tolerates one lost holder per hospital, so the
victims form a 2-packing of the graph (pairwise distance >= 3; benchmarks and
tests/secure/masking/test_masking_scale.py pick them the same way). At n >= 50 there is one
dropout at each of the five stages; fewer at n = 10 and 20 (the JSON lists them).

Measured per (n, P):

- ``seconds_per_round``: one whole round through ``run_aggregation`` (server and every
  client in this process, clients one after another: a real round's clients work in parallel);
- ``server_seconds``: the time spent in the server's calls alone;
- ``server_peak_bytes``: the largest memory the server holds at any point (tracemalloc; what
  its calls allocate and keep, plus the largest transient of one call; messages it returns are
  no longer counted once handed to the clients), also as a multiple of one update
  (``4 P`` bytes, a float32 update or one masked vector). Claim checked: <= 3 at n = 100, P = 1e6.

Writes benchmarks/secure_aggregation_cost/results/scale.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from clinograph.secure.masking import MaskingClient, MaskingServer  # noqa: E402
from clinograph.secure.masking.params import masked_defaults, neighbour_graph  # noqa: E402
from clinograph.secure.transport import run_aggregation  # noqa: E402

from benchmarks.secure_aggregation_cost.secure_aggregation_masked import _Ours, make_case  # noqa: E402
from research._common import add_convention, emit, machine, out_path  # noqa: E402


def spread(graph: dict[str, frozenset[str]], count: int) -> list[str]:
    """Up to ``count`` hospitals no two of which share a holder set (pairwise distance >= 3)."""
    chosen: list[str] = []
    blocked: set[str] = set()
    for c in sorted(graph):
        if c in blocked:
            continue
        chosen.append(c)
        for v in graph[c] | {c}:
            blocked |= graph[v] | {v}
        if len(chosen) == count:
            break
    return chosen


def setup(n: int, p: int) -> tuple[_Ours, dict[str, int]]:
    deltas, weights = make_case(n, p, seed=n)
    ours = _Ours(n, p, deltas, weights)
    ours.t = masked_defaults(n).threshold  # the default, not the benchmark's t = k//2 + 1
    plan = ours.plan("masked")
    victims = spread(neighbour_graph(plan, ours.k), 5)
    return ours, {v: stage for stage, v in enumerate(victims)}


def server_round(ours: _Ours, drop: dict[str, int]) -> dict:
    """Relay one round by hand, with tracemalloc accounting for the server's calls only."""
    plan = ours.plan("masked")
    peers = {c: ours.ids[c].public for c in ours.names}
    gc.collect()
    tracemalloc.start()
    held = peak = 0
    spent = 0.0

    def server_call(fn, *args):
        nonlocal held, peak, spent
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        t0 = time.perf_counter()
        out = fn(*args)
        spent += time.perf_counter() - t0
        now, top = tracemalloc.get_traced_memory()
        peak = max(peak, held + top - before)
        held += now - before
        return out

    try:
        server = server_call(lambda: MaskingServer(plan=plan, peers=peers, identity=ours.server))
        clients = {c: MaskingClient(plan=plan, identity=ours.ids[c], server=ours.server.public, peers=peers,
                                    update=ours.updates[c]) for c in ours.names}
        for c, cl in clients.items():
            if drop.get(c, 99) > 0:
                server_call(server.receive_bytes, c, cl.first_message())
        stage = 0
        while (msgs := server_call(server.next_stage)) is not None:
            stage += 1
            held -= sum(len(m) for m in msgs.values())  # handed over: the clients' memory now
            for c in sorted(msgs):
                data = msgs.pop(c)
                if drop.get(c, 99) > stage:
                    server_call(server.receive_bytes, c, clients[c].handle(data))
        res = server_call(server.result)
    finally:
        tracemalloc.stop()
    return {"server_seconds": spent, "server_peak_bytes": peak, "contributors": len(res.contributors)}


def case(n: int, p: int) -> dict:
    ours, drop = setup(n, p)
    gc.collect()
    t0 = time.perf_counter()
    res, rejected = run_aggregation(mode="masked", plan=ours.plan("masked"), server_identity=ours.server,
                                    client_identities=ours.ids, updates=ours.updates, drop=drop)
    seconds = time.perf_counter() - t0
    mem = server_round(ours, drop)
    update_bytes = 4 * p
    row = {"n": n, "P": p, "neighbours_k": ours.k, "threshold_t": ours.t,
           "dropouts": {v: ["advertise_keys", "share_keys", "masked_input", "consistency_check", "unmask"][s]
                        for v, s in drop.items()},
           "contributors": len(res.contributors), "rejected": len(rejected), "seconds_per_round": seconds, **mem,
           "update_bytes": update_bytes, "server_peak_over_update": mem["server_peak_bytes"] / update_bytes}
    print(f"n={n} P={p}: {seconds:.2f} s/round (server {mem['server_seconds']:.2f} s), server peak "
          f"{mem['server_peak_bytes'] / 1e6:.1f} MB = {row['server_peak_over_update']:.2f} updates, "
          f"{len(drop)} dropout(s)", file=sys.stderr)
    return row


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_convention(ap, quick_help="n in {10, 20}, P = 1e4")
    ap.add_argument("--max-p", type=int, default=1_000_000, help="skip larger P")
    ap.add_argument("--only", type=str, default=None, help="one case 'n,P' (written as a quick run)")
    args = ap.parse_args(argv)
    ns, ps = ([10, 20], [10_000]) if args.quick else ([10, 20, 50, 100], [10_000, 100_000, 1_000_000])
    if args.only:
        n, p = (int(float(x)) for x in args.only.split(","))
        ns, ps, args.quick = [n], [p], True
    rows = [case(n, p) for p in ps if p <= args.max_p for n in ns]
    result = {"benchmark": "scale", "quick": args.quick, "machine": machine(), "rows": rows,
              "note": "one round per (n, P); clients run serially in this process"}
    emit(result, out=out_path(__file__, args))
    return result


if __name__ == "__main__":
    main()
