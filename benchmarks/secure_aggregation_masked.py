"""The ``masked`` mode (32-bit and 16-bit quantised) against ``insecure_plaintext`` and Flower 1.41's own SecAgg+.

    python benchmarks/secure_aggregation_masked.py           # the cases of issue 19 (below), 3 reps
    python benchmarks/secure_aggregation_masked.py --quick   # n in {5, 10}, P = 1e4; prints JSON, writes nothing

Cases (n, P): (10, 1e4), (5|10|20|50|100, 1e5), (10, 1e6); Flower only for n <= 20.
What is measured, per (n, P), interleaved in one process, median over the repetitions:

- ``insecure_plaintext``, ``masked`` and ``masked16`` (``masked.word_bits = 16``): one whole
  round through :func:`clinograph.secure.transport.run_aggregation` (every client and the
  server in this process, clients one after another; signed envelopes, strict parsing, all
  four masked stages). Plaintext ships binary float32 through the same envelope attachments
  as the masked vectors (secure/wire.py), so neither side pays for JSON or base64.
- ``flower_secaggplus``: Flower 1.41's real ``SecAggPlusWorkflow`` (server) driving its real
  ``secaggplus_mod`` (clients) through a minimal in-process ``Grid`` that round-trips every
  message through Flower's protobuf wire encoding (``message_to_proto`` /
  ``SerializeToString`` / ``message_from_proto``), FedAvg strategy, same vectors, the same
  number of share holders (num_shares = k + 1) and the same threshold t.

Bytes: uploaded per client (all stages, whole envelopes / protobuf messages), and the one
message that carries the vector (``vector_upload``): our envelope, and the same envelope inside
the Flower message our Flower transport sends (``secure/transport/flower/records.py``, a
``ConfigRecord`` of bytes serialised with Flower's own ``message_to_proto``), per parameter.
Also the peak traced memory of one round (tracemalloc, a separate untimed run, all simulated
clients included). Server memory against n is in ``benchmarks/scale.py``. Hospitals work in
parallel in reality, so these serial in-process round times overstate a real round's latency
for all sides alike. Writes benchmarks/results/secure_aggregation_masked.json. Asserts nothing.
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
        bits = 16 if mode == "masked16" else 32
        opts = masked_plan_options(n_clients=len(self.names), threshold=self.t, clip=1.0, word_bits=bits) \
            if mode.startswith("masked") else {}
        return RoundPlan(federation_id="bench", round=1, participants=tuple(self.names), spec=self.spec,
                         dictionary_hash="a" * 64, secure_mode=mode[:6] if mode.startswith("masked") else mode,
                         strategy="fedavg", min_clients=2, local_epochs=1, global_state_digest="b" * 64,
                         options=opts)

    def run(self, mode: str):
        traffic: dict[str, int] = {}
        plan = self.plan(mode)
        res, rejected = run_aggregation(mode=plan.secure_mode, plan=plan, server_identity=self.server,
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


def flower_message_bytes(envelope: bytes) -> int:
    """Bytes of the protobuf Flower message our Flower transport sends for one reply carrying
    ``envelope`` (secure/transport/flower: clientapp.py wraps it with records.to_content)."""
    from clinograph.secure.transport.flower.records import MESSAGE_TYPE, to_content
    from flwr.app import Message
    from flwr.common.serde import message_to_proto
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    query = Message(to_content("stage", {"data": b"x"}, round_=1), dst_node_id=101, message_type=MESSAGE_TYPE)
    reply = Message(to_content("stage", {"reply": envelope}, round_=1), reply_to=query)
    return len(message_to_proto(reply).SerializeToString())


def vector_upload_bytes(ours: _Ours, mode: str) -> dict:
    """The one upload that carries the vector: our envelope and the Flower message around it."""
    from clinograph.secure.aggregation.plaintext import PlaintextClient
    from clinograph.secure.masking import MaskingParams
    from clinograph.secure.masking.messages import MaskedInput
    from clinograph.secure.masking.stages import Layout, word_bytes
    from clinograph.secure.wire import seal

    plan, c = ours.plan(mode), ours.names[0]
    if mode == "insecure_plaintext":
        env = PlaintextClient(plan=plan, identity=ours.ids[c], server=ours.server.public,
                              peers={n: i.public for n, i in ours.ids.items()}, update=ours.updates[c]).first_message()
    else:
        size = word_bytes(Layout.of(plan), MaskingParams.from_plan(plan))
        env = seal(MaskedInput(federation_id=plan.federation_id, round=plan.round, client=c,
                               spec_digest=plan.spec.digest(), dictionary_hash=plan.dictionary_hash,
                               words=bytes(size)), ours.ids[c])
    p = sum(m.size for m in plan.spec.shared)
    fl = flower_message_bytes(env)
    return {"envelope_bytes": len(env), "flower_message_bytes": fl, "envelope_bytes_per_parameter": len(env) / p,
            "flower_message_bytes_per_parameter": fl / p}


def bench_case(n: int, p: int, reps: int, *, with_flower: bool = True) -> dict:
    deltas, weights = make_case(n, p)
    ours = _Ours(n, p, deltas, weights)
    flower = _Flower(deltas, weights, ours.k, ours.t)
    exact = sum(w * d.astype(np.float64) for d, w in zip(deltas, weights, strict=True)) / sum(weights)
    exact_fl = sum(m * d.astype(np.float64) for d, m in zip(deltas, flower.nums, strict=True)) / sum(flower.nums)
    sides = {"insecure_plaintext": lambda: ours.run("insecure_plaintext"), "masked": lambda: ours.run("masked"),
             "masked16": lambda: ours.run("masked16")}
    if with_flower:
        sides["flower_secaggplus"] = flower.run
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
    peaks = {s: _peak(fn) for s, fn in sides.items()} if p <= 100_000 or n <= 10 else {}
    row = {
        "n": n, "P": p, "neighbours_k": ours.k, "threshold_t": ours.t, "flower_num_shares": ours.k + 1,
        "seconds_per_round_median": med, "seconds_per_round_all": times,
        "ratio_masked_over_plaintext": med["masked"] / med["insecure_plaintext"],
        "ratio_masked16_over_plaintext": med["masked16"] / med["insecure_plaintext"],
        "bytes_uploaded_per_client_all_stages": uploads,
        "bytes_uploaded_per_parameter_all_stages": {s: b / p for s, b in uploads.items()},
        "vector_upload": {m: vector_upload_bytes(ours, m) for m in ("insecure_plaintext", "masked", "masked16")},
        "peak_traced_bytes_per_round": peaks,
        "relative_error_of_mean": errors,
    }
    if with_flower:
        row["ratio_flower_over_plaintext"] = med["flower_secaggplus"] / med["insecure_plaintext"]
        row["ratio_masked_over_flower"] = med["masked"] / med["flower_secaggplus"]
    return row


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
    ap.add_argument("--no-flower", action="store_true", help="skip Flower's SecAgg+ (faster)")
    args = ap.parse_args(argv)
    grid = [(5, 10_000), (10, 10_000)] if args.quick else \
        [(10, 10_000), (5, 100_000), (10, 100_000), (20, 100_000), (50, 100_000), (100, 100_000), (10, 1_000_000)]
    cases = []
    for n, p in grid:
        reps = max(args.reps, 5) if p <= 10_000 else args.reps
        row = bench_case(n, p, reps, with_flower=n <= 20 and not args.no_flower)
        cases.append(row)
        m = row["seconds_per_round_median"]
        print(f"n={n} P={p}: " + ", ".join(f"{s} {v:.3f} s" for s, v in m.items())
              + f"; masked/plaintext {row['ratio_masked_over_plaintext']:.2f}", file=sys.stderr)
    result = {"benchmark": "secure_aggregation_masked", "quick": args.quick, "reps": args.reps,
              "machine": machine(),
              "parameters": {"clip": 1.0, "modules": N_MODULES, "deltas": "N(0, 0.05) float32",
                             "weights": "U(0.2, 1); Flower gets num_examples = round(100 w), max_weight 100",
                             "threshold": "t = k // 2 + 1 (as Flower's default reconstruction threshold)",
                             "flower": "SecAggPlusWorkflow(num_shares=k+1, reconstruction_threshold=t, "
                                       "clipping_range=8, quantization 2^22, modulus 2^32)"},
              "cases": cases}
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
