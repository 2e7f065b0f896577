"""The ``masked`` mode against ``insecure_plaintext`` and Flower 1.41's own SecAgg+.

    python benchmarks/secure_aggregation_masked.py           # n in {5,10,20}, P in {1e5,1e6}, 3 reps + n=100 scaling
    python benchmarks/secure_aggregation_masked.py --quick   # small sizes; prints JSON, writes nothing

What is measured, per (n, P), interleaved in one process, median over the repetitions:

- ``insecure_plaintext`` and ``masked``: one whole round through
  :func:`clinograph.secure.transport.run_aggregation` (every client and the server in this
  process, clients one after another; signed envelopes, strict parsing, all four masked stages).
- ``flower_secaggplus``: Flower 1.41's real ``SecAggPlusWorkflow`` (server) driving its real
  ``secaggplus_mod`` (clients) through a minimal in-process ``Grid`` that round-trips every
  message through Flower's protobuf wire encoding (``message_to_proto`` /
  ``SerializeToString`` / ``message_from_proto``), FedAvg strategy, same vectors, the same
  number of share holders (num_shares = k + 1) and the same threshold t.

Also: bytes uploaded per client (all stages, whole envelopes / protobuf messages); peak
traced memory of one round (tracemalloc, a separate untimed run of the whole
in-process round, all simulated clients included: numpy and Python allocations, not Rust-side
buffers inside pydantic-core); and a scaling run of the masked mode to n = 100 simulated
clients at modest P measuring the *server's* memory alone (what allocations under
masking/server.py retain once all vectors are summed, plus the largest transient of one
server call): it stays flat in n because the server streams the sum. Hospitals work in
parallel in reality, so these serial in-process round times overstate a real round's latency
for all three alike. Writes benchmarks/results/secure_aggregation_masked.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import platform
import statistics
import sys
import time
import tracemalloc
from importlib.metadata import version
from pathlib import Path

import numpy as np
from clinograph.secure.aggregation import LocalUpdate
from clinograph.secure.identity import Identity
from clinograph.secure.masking import masked_plan_options, neighbour_count
from clinograph.secure.messages import RoundPlan
from clinograph.secure.spec import ModelSpec, ModuleKind, ModuleSpec
from clinograph.secure.transport import run_aggregation

OUT = Path(__file__).parent / "results" / "secure_aggregation_masked.json"
N_MODULES = 4


def _spec(p: int) -> ModelSpec:
    sizes = [p // N_MODULES] * (N_MODULES - 1)
    sizes.append(p - sum(sizes))
    return ModelSpec(version=1, modules=tuple(ModuleSpec(name=f"gnn/layer{i}", shape=(s,), kind=ModuleKind.SHARED)
                                              for i, s in enumerate(sizes)))


def make_case(n: int, p: int, seed: int = 0):
    """Same deltas and weights for every side: d_i ~ N(0, 0.05) float32, w_i ~ U(0.2, 1)."""
    rng = np.random.default_rng(seed)  # benchmark data, not a secret
    deltas = [rng.normal(0.0, 0.05, p).astype(np.float32) for _ in range(n)]
    weights = [float(rng.uniform(0.2, 1.0)) for _ in range(n)]
    return deltas, weights


class _Ours:
    def __init__(self, n: int, p: int, deltas, weights):
        self.names = [f"hosp{i:03d}" for i in range(n)]
        self.ids = {c: Identity.generate(c) for c in self.names}
        self.server = Identity.generate("server")
        self.spec = _spec(p)
        self.k = neighbour_count(n)
        self.t = self.k // 2 + 1
        bounds = np.cumsum([0] + [m.size for m in self.spec.modules])
        self.updates = {c: LocalUpdate(modules={m.name: w * d[bounds[j]:bounds[j + 1]].astype(np.float64)
                                                for j, m in enumerate(self.spec.modules)}, weight=w)
                        for c, d, w in zip(self.names, deltas, weights, strict=True)}

    def plan(self, mode: str) -> RoundPlan:
        opts = masked_plan_options(n_clients=len(self.names), threshold=self.t, clip=1.0) if mode == "masked" else {}
        return RoundPlan(federation_id="bench", round=1, participants=tuple(self.names), spec=self.spec,
                         dictionary_hash="a" * 64, secure_mode=mode, strategy="fedavg", min_clients=2,
                         local_epochs=1, global_state_digest="b" * 64, options=opts)

    def run(self, mode: str):
        traffic: dict[str, int] = {}
        res, rejected = run_aggregation(mode=mode, plan=self.plan(mode), server_identity=self.server,
                                        client_identities=self.ids, updates=self.updates, traffic=traffic)
        if rejected:
            raise RuntimeError(f"benchmark round rejected messages: {rejected}")
        mean = np.concatenate([res.mean(m.name) for m in self.spec.modules])
        return mean, statistics.median(traffic.values())


class _Flower:
    """Flower's SecAggPlusWorkflow + secaggplus_mod, in one process, over protobuf bytes."""

    def __init__(self, deltas, weights, k: int, t: int):
        import flwr  # noqa: F401  (imported here: only the benchmark needs Flower)

        logging.getLogger("flwr").setLevel(logging.WARNING)
        self.deltas, self.k, self.t = deltas, k, t
        self.nums = [max(1, round(100 * w)) for w in weights]  # Flower weights by num_examples

    def run(self):
        from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
        from flwr.client.mod.secure_aggregation.secaggplus_mod import secaggplus_mod
        from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
        from flwr.common.serde import message_from_proto, message_to_proto
        from flwr.compat.common import recorddict_compat as compat
        from flwr.proto.message_pb2 import Message as ProtoMessage
        from flwr.server.client_manager import SimpleClientManager
        from flwr.server.client_proxy import ClientProxy
        from flwr.server.compat.legacy_context import LegacyContext
        from flwr.server.strategy import FedAvg
        from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
        from flwr.server.workflow.constant import Key as WorkflowKey
        from flwr.server.workflow.secure_aggregation.secaggplus_workflow import SecAggPlusWorkflow
        from flwr.serverapp.grid import Grid
        from flwr.supercore.task_identity import TaskIdentity

        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
        n = len(self.deltas)
        nodes = {100 + i: i for i in range(n)}
        split = np.cumsum([0] + [len(self.deltas[0]) // N_MODULES] * (N_MODULES - 1))

        def wire(msg):
            proto = ProtoMessage()
            data = message_to_proto(msg).SerializeToString()
            proto.ParseFromString(data)
            return message_from_proto(proto), len(data)

        class Proxy(ClientProxy):
            def get_properties(self, *a, **k): raise NotImplementedError  # noqa: E704
            def get_parameters(self, *a, **k): raise NotImplementedError  # noqa: E704
            def fit(self, *a, **k): raise NotImplementedError  # noqa: E704
            def evaluate(self, *a, **k): raise NotImplementedError  # noqa: E704
            def reconnect(self, *a, **k): raise NotImplementedError  # noqa: E704

        outer = self
        uploaded = dict.fromkeys(nodes, 0)

        class InProcessGrid(Grid):
            def __init__(self):
                self.ctx = {nid: Context(run_id=1, node_id=nid, node_config={}, state=RecordDict(), run_config={})
                            for nid in nodes}

            def set_run(self, run): pass  # noqa: E704
            @property
            def run(self): return None  # noqa: E704
            def create_message(self, *a, **k): raise NotImplementedError  # noqa: E704
            def get_node_ids(self): return list(nodes)  # noqa: E704
            def push_messages(self, messages): raise NotImplementedError  # noqa: E704
            def pull_messages(self, message_ids): raise NotImplementedError  # noqa: E704

            def send_and_receive(self, messages, *, timeout=None):
                replies = []
                for m in messages:
                    m, _ = wire(m)
                    nid = m.metadata.dst_node_id
                    i = nodes[nid]

                    def fit(msg, ctxt, i=i):
                        arrays = np.split(outer.deltas[i], split[1:])
                        res = FitRes(status=Status(Code.OK, ""), parameters=ndarrays_to_parameters(arrays),
                                     num_examples=outer.nums[i], metrics={})
                        return Message(compat.fitres_to_recorddict(res, False), reply_to=msg)

                    reply, size = wire(secaggplus_mod(m, self.ctx[nid], fit))
                    uploaded[nid] += size
                    replies.append(reply)
                return replies

        cm = SimpleClientManager()
        for nid in nodes:
            proxy = Proxy(str(nid))
            proxy.node_id = nid
            cm.register(proxy)
        strategy = FedAvg(fraction_fit=1.0, min_fit_clients=n, min_available_clients=n, fraction_evaluate=0.0)
        ctx = LegacyContext(Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}),
                            strategy=strategy, client_manager=cm)
        ctx.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: 1})
        ctx.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord(np.split(np.zeros_like(self.deltas[0]), split[1:]))
        SecAggPlusWorkflow(num_shares=self.k + 1, reconstruction_threshold=self.t, max_weight=100.0,
                           clipping_range=8.0)(InProcessGrid(), ctx)
        mean = np.concatenate(ctx.state.array_records[MAIN_PARAMS_RECORD].to_numpy_ndarrays())
        return mean, statistics.median(uploaded.values())


def _timed(fn):
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _peak(fn) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def bench_case(n: int, p: int, reps: int) -> dict:
    deltas, weights = make_case(n, p)
    ours = _Ours(n, p, deltas, weights)
    flower = _Flower(deltas, weights, ours.k, ours.t)
    exact = sum(w * d.astype(np.float64) for d, w in zip(deltas, weights, strict=True)) / sum(weights)
    exact_fl = sum(m * d.astype(np.float64) for d, m in zip(deltas, flower.nums, strict=True)) / sum(flower.nums)
    sides = {"insecure_plaintext": lambda: ours.run("insecure_plaintext"), "masked": lambda: ours.run("masked"),
             "flower_secaggplus": flower.run}
    times: dict[str, list[float]] = {s: [] for s in sides}
    uploads, errors = {}, {}
    for _ in range(reps):  # interleaved
        for side, fn in sides.items():
            dt, (mean, up) = _timed(fn)
            times[side].append(dt)
            uploads[side] = int(up)
            ref = exact_fl if side == "flower_secaggplus" else exact
            errors[side] = float(np.linalg.norm(mean - ref) / np.linalg.norm(ref))
    med = {s: statistics.median(v) for s, v in times.items()}
    peaks = {s: _peak(fn) for s, fn in sides.items()}
    return {
        "n": n, "P": p, "neighbours_k": ours.k, "threshold_t": ours.t, "flower_num_shares": ours.k + 1,
        "seconds_per_round_median": med, "seconds_per_round_all": times,
        "ratio_masked_over_plaintext": med["masked"] / med["insecure_plaintext"],
        "ratio_flower_over_plaintext": med["flower_secaggplus"] / med["insecure_plaintext"],
        "ratio_masked_over_flower": med["masked"] / med["flower_secaggplus"],
        "bytes_uploaded_per_client": uploads,
        "bytes_uploaded_per_parameter": {s: b / p for s, b in uploads.items()},
        "peak_traced_bytes_per_round": peaks,
        "relative_error_of_mean": errors,
    }


def server_memory(ours: _Ours) -> dict:
    """Memory attributable to the masked *server* during one round (clients excluded).

    Relays the round like run_aggregation does, with tracemalloc on: ``retained`` is what
    allocations made under ``masking/server.py`` still hold once every masked vector has been
    summed (its largest point before unmasking); ``transient`` is the largest extra memory one
    server call (receive one message, or close a stage) needs on top of what was live before it.
    """
    from clinograph.secure.masking import MaskingClient, MaskingServer

    plan = ours.plan("masked")
    peers = {c: ours.ids[c].public for c in ours.names}
    tracemalloc.start(40)
    try:
        server = MaskingServer(plan=plan, peers=peers, identity=ours.server)
        clients = {c: MaskingClient(plan=plan, identity=ours.ids[c], server=ours.server.public, peers=peers,
                                    update=ours.updates[c]) for c in ours.names}
        transient = retained = 0

        def server_call(fn, *args):
            nonlocal transient
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            out = fn(*args)
            transient = max(transient, tracemalloc.get_traced_memory()[1] - before)
            return out

        for c, cl in clients.items():
            server_call(server.receive_bytes, c, cl.first_message())
        stage = 0
        while (msgs := server_call(server.next_stage)) is not None:
            stage += 1
            if stage == 3:  # every masked vector is in the running sum: the server's largest state
                snap = tracemalloc.take_snapshot().filter_traces(
                    [tracemalloc.Filter(True, "*masking/server.py", all_frames=True)])
                retained = sum(t.size for t in snap.traces)
            for c in list(msgs):
                server_call(server.receive_bytes, c, clients[c].handle(msgs.pop(c)))
        server.result()
    finally:
        tracemalloc.stop()
    return {"server_retained_bytes": retained, "server_max_transient_bytes": transient}


def scaling_run(ns: list[int], p: int) -> list[dict]:
    """Masked round at growing n and fixed P: the server's memory should not grow with n."""
    rows = []
    for n in ns:
        deltas, weights = make_case(n, p, seed=n)
        ours = _Ours(n, p, deltas, weights)
        dt, _ = _timed(lambda ours=ours: ours.run("masked"))
        mem = server_memory(ours)
        vec_bytes = 4 * (p + 2 * N_MODULES)
        rows.append({"n": n, "P": p, "neighbours_k": ours.k, "threshold_t": ours.t, "seconds_per_round": dt, **mem,
                     "server_bytes_over_one_vector": (mem["server_retained_bytes"] + mem["server_max_transient_bytes"])
                     / vec_bytes,
                     "masked_vector_bytes": vec_bytes, "holding_n_vectors_would_need_bytes": n * vec_bytes})
        print(f"scaling n={n}: {dt:.2f} s, server retained {mem['server_retained_bytes'] / 1e6:.2f} MB, "
              f"transient {mem['server_max_transient_bytes'] / 1e6:.2f} MB", file=sys.stderr)
    return rows


def machine() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    import os

    return {"platform": platform.platform(), "python": sys.version.split()[0], "cpu": cpu,
            "cpu_count": os.cpu_count(),
            "versions": {pkg: version(pkg) for pkg in ("numpy", "cryptography", "pycryptodome", "pydantic", "flwr")}}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes; print JSON, write nothing")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    ns, ps = ([5, 10], [10_000]) if args.quick else ([5, 10, 20], [100_000, 1_000_000])
    scale_ns, scale_p = ([10, 30], 5_000) if args.quick else ([10, 25, 50, 100], 100_000)
    cases = []
    for p in ps:
        for n in ns:
            row = bench_case(n, p, args.reps)
            cases.append(row)
            m = row["seconds_per_round_median"]
            print(f"n={n} P={p}: plaintext {m['insecure_plaintext']:.3f} s, masked {m['masked']:.3f} s, "
                  f"flower {m['flower_secaggplus']:.3f} s", file=sys.stderr)
    result = {"benchmark": "secure_aggregation_masked", "quick": args.quick, "reps": args.reps,
              "machine": machine(),
              "parameters": {"clip": 1.0, "modules": N_MODULES, "deltas": "N(0, 0.05) float32",
                             "weights": "U(0.2, 1); Flower gets num_examples = round(100 w), max_weight 100",
                             "flower": "SecAggPlusWorkflow(num_shares=k+1, reconstruction_threshold=t, "
                                       "clipping_range=8, quantization 2^22, modulus 2^32)"},
              "cases": cases, "scaling": scaling_run(scale_ns, scale_p)}
    text = json.dumps(result, indent=2)
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    else:
        print(text)
    return result


if __name__ == "__main__":
    main()
