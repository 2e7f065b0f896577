"""The ``masked`` mode (32-bit and 16-bit quantised) against ``insecure_plaintext`` and Flower 1.41's own SecAgg+.

    python -m benchmarks.secure_aggregation_cost.secure_aggregation_masked           # the cases of issue 19 (below), 3 reps
    python -m benchmarks.secure_aggregation_cost.secure_aggregation_masked --quick   # n in {5, 10}, P = 1e4; prints JSON, writes nothing

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

Per party (``per_party_seconds_per_round_median``): the same round driven by hand with every
call charged to the party that makes it -- server seconds a round, and each client's seconds
(median and slowest client). Hospitals run in parallel, so a real round's compute latency is
about the server's time plus the slowest client's; Bonawitz et al. 2017 (sec. 7) report
client and server costs separately for the same reason.

Floor (``floor``): the protocol-required operations of one round of each mode, counted while
it runs (Ed25519 signs and verifies, X25519 key generations and agreements, mask PRG bytes,
SHA-256 bytes of attachments), times their unit cost measured in the same process
(``unit_seconds``). ``ratio_floor`` is the masked/plaintext ratio if nothing but these
operations cost extra: a ratio target below it cannot be met without dropping protocol steps.

Per party against its floor (``per_party_floor``): each party's masked seconds against its
plaintext seconds plus the unit cost of the operations the masked round adds for that party
(counted per party), on wall time and on the party's CPU time (``time.thread_time``: the
machine is shared); median hospital and worst hospital. ``--case N:P`` runs one (n, P).

Bytes: uploaded per client (all stages, whole envelopes / protobuf messages), and the one
message that carries the vector (``vector_upload``): our envelope, and the same envelope inside
the Flower message our Flower transport sends (``secure/transport/flower/records.py``, a
``ConfigRecord`` of bytes serialised with Flower's own ``message_to_proto``), per parameter.
Also the peak traced memory of one round (tracemalloc, a separate untimed run, all simulated
clients included). Server memory against n is in ``benchmarks/secure_aggregation_cost/scale.py``. Hospitals work in
parallel in reality, so these serial in-process round times overstate a real round's latency
for all sides alike. Writes benchmarks/secure_aggregation_cost/results/secure_aggregation_masked.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import logging
import os
import statistics
import sys
import time
import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from clinograph.secure import wire  # noqa: E402
from clinograph.secure.aggregation import LocalUpdate, create_mode  # noqa: E402
from clinograph.secure.hazmat import x25519  # noqa: E402
from clinograph.secure.hazmat.masking_prg import MASK_PRG, add_mask_parts  # noqa: E402
from clinograph.secure.masking import client as masking_client  # noqa: E402
from clinograph.secure.masking import masked_plan_options, neighbour_count  # noqa: E402
from clinograph.secure.masking import server as masking_server  # noqa: E402
from clinograph.secure.messages import MAX_MESSAGE_BYTES, RoundPlan  # noqa: E402
from clinograph.secure.transport import run_aggregation  # noqa: E402

from clinograph.core.identity import Identity, PublicIdentity  # noqa: E402
from clinograph.core.spec import ModelSpec, ModuleKind, ModuleSpec  # noqa: E402
from research._common import add_convention, emit, machine, out_path  # noqa: E402

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
                               global_state_digest=plan.global_state_digest, plan_digest=plan.digest(),
                               words=bytes(size)), ours.ids[c])
    p = sum(m.size for m in plan.spec.shared)
    fl = flower_message_bytes(env)
    return {"envelope_bytes": len(env), "flower_message_bytes": fl, "envelope_bytes_per_parameter": len(env) / p,
            "flower_message_bytes_per_parameter": fl / p}


def party_seconds(ours: _Ours, mode: str, ops: Counter | None = None, first: int = 0) -> dict:
    """One round driven by hand, every call timed and charged to the party that makes it: the
    server (parsing, checks, sums, unmasking, its signatures) and each client (encoding,
    masking, its signatures and checks). No drops, so it is :func:`run_aggregation`'s round;
    hospitals run in parallel in reality, so a round's latency is about the server's time
    plus the slowest client's per stage (Bonawitz et al. 2017 report the two separately).

    ``ops``: the live counter of :func:`counting`; when given, the operations each call makes
    are charged to its party too (``"ops"`` in the result: party -> operation -> count). Only
    for the untimed counting pass: the wrappers cost time themselves.

    ``first``: the hospitals answer each stage in their name order rotated to start at hospital
    ``first`` (``"first"`` in the result). The one that answers first runs right after the
    server's stage work, on caches that work has filled, and costs 10-20 % more than the rest;
    rotating it over the repetitions spreads that over all hospitals instead of always charging
    the same one (it was the "slowest hospital" of earlier runs)."""
    plan = ours.plan(mode)
    charged: dict[str, Counter] = {}
    secure_mode = create_mode(plan.secure_mode)
    peers = {c: ours.ids[c].public for c in ours.names}
    spent: dict[str, float] = dict.fromkeys([*ours.names, "server"], 0.0)
    cpu: dict[str, float] = dict.fromkeys([*ours.names, "server"], 0.0)

    def timed(party, fn, *args):
        before = Counter(ops) if ops is not None else None
        t0, c0 = time.perf_counter(), time.thread_time()
        out = fn(*args)
        spent[party] += time.perf_counter() - t0
        cpu[party] += time.thread_time() - c0
        if ops is not None:
            charged.setdefault(party, Counter()).update(Counter(ops) - before)
        return out

    def deliver(sender, data):
        receive_bytes = getattr(server, "receive_bytes", None)
        if receive_bytes is not None:
            receive_bytes(sender, data)
        else:
            server.receive(wire.parse_envelope(data, max_bytes=MAX_MESSAGE_BYTES))

    gc.collect()
    server = timed("server", lambda: secure_mode.server(plan=plan, peers=peers, identity=ours.server))
    clients = {c: timed(c, lambda c=c: secure_mode.client(plan=plan, identity=ours.ids[c], server=ours.server.public,
                                                          peers=peers, update=ours.updates[c])) for c in ours.names}
    k = first % len(ours.names)
    order = ours.names[k:] + ours.names[:k]
    for c in order:
        timed("server", deliver, c, timed(c, clients[c].first_message))
    while (msgs := timed("server", server.next_stage)) is not None:
        for c in order:
            if c not in msgs:
                continue
            reply = timed(c, clients[c].handle, msgs[c])
            if reply is not None:
                timed("server", deliver, c, reply)
    res = timed("server", server.result)
    if sorted(res.contributors) != sorted(ours.names):
        raise RuntimeError(f"hand-driven {mode} round lost contributors: {res.contributors}")
    per_client = [spent[c] for c in ours.names]
    out = {"server": spent["server"], "client_median": statistics.median(per_client), "client_max": max(per_client),
           "clients": dict(zip(ours.names, per_client, strict=True)), "cpu": cpu, "first": order[0]}
    if ops is not None:
        out["ops"] = {party: dict(c) for party, c in charged.items()}
    return out


def party_floor(ours: _Ours, units: dict, plain: dict, *, sized: bool = True) -> dict:
    """The floor of each party, as :func:`floor` is the round's: a party's measured plaintext
    seconds plus the unit cost of the operations the masked round makes it do beyond the
    plaintext round's (operations counted per party, :func:`party_seconds` with ``ops``).

    ``plain``: median plaintext seconds per party (``server`` and every client). Returns the
    floor seconds per party and the operations behind them (server and the first client; the
    clients' counts differ only by how many neighbours the graph gives each). ``sized=False``:
    every signature priced at the unit's message size (:data:`SIZED_UNITS` left out)."""
    if not sized:
        units = {k: v for k, v in units.items() if k not in SIZED_UNITS}
    counted = {}
    for mode in ("insecure_plaintext", "masked"):
        with counting() as n:
            counted[mode] = party_seconds(ours, mode, ops=n)["ops"]
    seconds = {}
    for party in ["server", *ours.names]:
        extra = sum(v * units[k] for k, v in counted["masked"].get(party, {}).items() if k in units) \
            - sum(v * units[k] for k, v in counted["insecure_plaintext"].get(party, {}).items() if k in units)
        seconds[party] = plain[party] + extra
    first = ours.names[0]
    return {"seconds": seconds, "operations": {m: {p: counted[m].get(p, {}) for p in ("server", first)}
                                               for m in counted}}


#: Masked-only steps the floor leaves out though no masked round can skip them (``timed=True``
#: of :func:`counting`): Shamir sharing of the two secrets and rebuilding them, the AEAD of the
#: shares, the self-mask seed's HKDF, and the range check and fixed-point encoding of the update.
NOT_IN_FLOOR = {
    masking_client: (("split_secret", "shamir_split"), ("encrypt_share", "share_aead"),
                     ("decrypt_share", "share_aead"), ("hkdf", "self_mask_hkdf"),
                     ("check_update", "fixed_point"), ("encode_update", "fixed_point")),
    masking_server: (("combine_shares", "shamir_combine"), ("hkdf", "self_mask_hkdf")),
}


@contextlib.contextmanager
def counting(*, timed: bool = False):
    """Count the protocol's costly operations while the block runs: Ed25519 signs and
    verifies, X25519 key generations and agreements (with their HKDF), mask PRG bytes (with
    the ring addition) and SHA-256 bytes of envelope attachments. Wraps the names the
    protocol code calls and restores them afterwards (benchmark bookkeeping only).

    ``timed``: also add each operation's CPU seconds inside the round under ``"cpu/<key>"``,
    and count and time the :data:`NOT_IN_FLOOR` steps (``"not_in_floor/<key>"``)."""
    n: Counter = Counter()
    saved = []

    def wrap(owner, name, key, size=None, *, time_it=True):
        orig = getattr(owner, name)
        saved.append((owner, name, orig))

        def counted(*a, **k):
            n[key] += size(*a, **k) if size else 1
            if not timed or not time_it:
                return orig(*a, **k)
            c0 = time.thread_time()
            try:
                return orig(*a, **k)
            finally:
                n[f"cpu/{key}"] += time.thread_time() - c0

        setattr(owner, name, counted)

    if timed:
        for mod, names in NOT_IN_FLOOR.items():
            for name, key in names:
                wrap(mod, name, f"not_in_floor/{key}")

    wrap(Identity, "sign", "ed25519_sign")
    wrap(PublicIdentity, "verify", "ed25519_verify")
    # the bytes each signs or verifies beyond the unit's message (SIZED_UNITS; negative for a shorter one)
    wrap(Identity, "sign", "ed25519_sign_msg_bytes", lambda _me, data, **_: len(data) - UNIT_MESSAGE_BYTES,
         time_it=False)
    wrap(PublicIdentity, "verify", "ed25519_verify_msg_bytes",
         lambda _pub, _sig, data, **_: len(data) - UNIT_MESSAGE_BYTES, time_it=False)
    for mod in (masking_client, masking_server):
        wrap(mod, "agree", "x25519_agree")
        if hasattr(mod, "add_mask_parts"):  # one seed a call (and the code before add_masks)
            wrap(mod, "add_mask_parts", "prg_bytes", lambda parts, *a, **k: sum(p.nbytes for p in parts))
        if hasattr(mod, "add_masks"):  # several seeds a call, one keystream each
            wrap(mod, "add_masks", "prg_bytes", lambda parts, seeds, **k: sum(p.nbytes for p in parts) * len(seeds))
    wrap(masking_client, "generate_keypair", "x25519_keygen")
    real_hashlib = wire.hashlib

    class _Hashlib:
        @staticmethod
        def sha256(data=b""):
            if sys._getframe(1).f_code.co_name != "<genexpr>":  # attachment hashes (seal, verify), not digest()
                return real_hashlib.sha256(data)
            n["sha256_attachment_bytes"] += len(data)
            c0 = time.thread_time()
            try:
                return real_hashlib.sha256(data)  # hashes here: digest() is then a copy
            finally:
                if timed:
                    n["cpu/sha256_attachment_bytes"] += time.thread_time() - c0

    wire.hashlib = _Hashlib  # type: ignore[assignment]
    try:
        yield n
    finally:
        wire.hashlib = real_hashlib
        for owner, name, orig in reversed(saved):
            setattr(owner, name, orig)


#: The message an Ed25519 sign or verify unit cost is measured on (about one small JSON payload).
UNIT_MESSAGE_BYTES = 300
#: Units of the message bytes signed or verified beyond :data:`UNIT_MESSAGE_BYTES` (seconds a byte,
#: the marginal cost: Ed25519 hashes the message, SHA-512, twice to sign and once to verify). With
#: them the floor prices each signature at the size of what it signs (a server signs 2-3 kB key
#: directories); without them (``fixed_size`` in the JSON) every signature is priced at 300 bytes.
SIZED_UNITS = ("ed25519_sign_msg_bytes", "ed25519_verify_msg_bytes")


def unit_costs(reps: int = 200, clock=time.perf_counter) -> dict:
    """Seconds per operation counted by :func:`counting`, measured here (median of batches) on
    ``clock`` (wall time, or ``time.thread_time`` for CPU seconds)."""
    me = Identity.generate("unit")
    msg = os.urandom(UNIT_MESSAGE_BYTES)
    sig = me.sign(msg, context=b"bench")
    long = os.urandom(UNIT_MESSAGE_BYTES + 8000)
    long_sig = me.sign(long, context=b"bench")
    sk, _ = x25519.generate_keypair()
    _, pk = x25519.generate_keypair()
    big = np.zeros(1 << 20, dtype=np.uint32)  # 4 MB, as at P = 1e6
    blob = os.urandom(4 << 20)

    def per_op(fn, n):
        batches = []
        for _ in range(5):
            t0 = clock()
            for _ in range(n):
                fn()
            batches.append((clock() - t0) / n)
        return statistics.median(batches)

    sign = per_op(lambda: me.sign(msg, context=b"bench"), reps)
    verify = per_op(lambda: me.public.verify(sig, msg, context=b"bench"), reps)
    return {
        "ed25519_sign": sign,
        "ed25519_verify": verify,
        "ed25519_sign_msg_bytes": max(per_op(lambda: me.sign(long, context=b"bench"), reps) - sign, 0.0) / 8000,
        "ed25519_verify_msg_bytes": max(per_op(lambda: me.public.verify(long_sig, long, context=b"bench"), reps)
                                        - verify, 0.0) / 8000,
        "x25519_keygen": per_op(x25519.generate_keypair, reps),
        "x25519_agree": per_op(lambda: x25519.agree(sk, pk, label=b"bench", context=b""), reps),
        "prg_bytes": per_op(lambda: add_mask_parts([big], b"\x01" * 32, sign=1), 5) / big.nbytes,
        "sha256_attachment_bytes": per_op(lambda: hashlib.sha256(blob).digest(), 5) / len(blob),
    }


def floor(ours: _Ours, units: dict, plain_seconds: float) -> dict:
    """The cost of the operations each mode cannot do without, in this process.

    Counts come from one round of each mode (:func:`counting`); times are counts x
    :func:`unit_costs`. ``ratio_floor`` = (measured plaintext round + masked floor - plaintext
    floor) / measured plaintext round: the masked/plaintext ratio if everything besides these
    operations cost nothing extra. A target below it is out of reach without removing
    protocol steps (signatures, key agreements, masks) or faster primitives.
    """
    out: dict = {"unit_seconds": units}
    for mode in ("insecure_plaintext", "masked"):
        with counting() as n:
            ours.run(mode)
        ops = dict(n)
        out[mode] = {"operations": ops, "seconds": {k: v * units[k] for k, v in ops.items()},
                     "total_seconds": sum(v * units[k] for k, v in ops.items())}
    extra = out["masked"]["total_seconds"] - out["insecure_plaintext"]["total_seconds"]
    out["masked_extra_seconds"] = extra
    out["ratio_floor"] = (plain_seconds + extra) / plain_seconds
    return out



def per_party_floor(ours: _Ours, parties: dict[str, list[dict]], wall_units: dict, cpu_units: dict) -> dict:
    """Each party's masked seconds against its floor (:func:`party_floor`), on wall time and on
    the party's own CPU time (``time.thread_time``: what a party computes, without the time
    the machine gave other jobs -- it is shared, and a client's few milliseconds are easily
    preempted). Per client: its median over repetitions; reported as the median client and
    the worst client, and (``client_first``) the median over repetitions of the hospital that
    answered first in that round: the cold case, see :func:`party_seconds`."""
    out = {}
    for clock, units in (("wall", wall_units), ("cpu", cpu_units)):
        def pick(row, party, clock=clock):
            return (row["cpu"] if clock == "cpu" else {"server": row["server"], **row["clients"]})[party]

        med = {s: {party: statistics.median(pick(r, party) for r in rows) for party in ["server", *ours.names]}
               for s, rows in parties.items()}
        pf = party_floor(ours, units, med["insecure_plaintext"])
        fixed = party_floor(ours, units, med["insecure_plaintext"], sized=False)["seconds"]
        over = {party: med["masked"][party] / pf["seconds"][party] for party in med["masked"]}
        over_fixed = {party: med["masked"][party] / fixed[party] for party in med["masked"]}
        clients = {c: over[c] for c in ours.names}
        worst = max(clients, key=clients.get)
        out[clock] = {
            "unit_seconds": units,
            "masked_seconds": {"server": med["masked"]["server"], "client_median": statistics.median(
                med["masked"][c] for c in ours.names), "client_max": max(med["masked"][c] for c in ours.names)},
            "floor_seconds": {"server": pf["seconds"]["server"], "client_median": statistics.median(
                pf["seconds"][c] for c in ours.names), "client_max": max(pf["seconds"][c] for c in ours.names)},
            "ratio_masked_over_floor": {"server": over["server"], "client_median": statistics.median(clients.values()),
                                        "client_worst": clients[worst],
                                        # the hospital answering first in each round (party_seconds, ``first``)
                                        "client_first": statistics.median(pick(r, r["first"]) / pf["seconds"][r["first"]]
                                                                          for r in parties["masked"])},
            "client_worst_name": worst,  # a different hospital from run to run: the worst of n is noise
            # the same against a floor pricing every signature at UNIT_MESSAGE_BYTES (the earlier passes' floor)
            "ratio_masked_over_floor_fixed_size": {
                "server": over_fixed["server"],
                "client_median": statistics.median(over_fixed[c] for c in ours.names),
                "client_worst": max(over_fixed[c] for c in ours.names)},
        }
    out["operations"] = pf["operations"]
    return out


def in_round(ours: _Ours, cpu_units: dict, floor_cpu: dict, masked_cpu: dict, reps: int = 3) -> dict:
    """Where a party's masked CPU seconds above its floor go, measured inside the round
    (:func:`counting` with ``timed``; medians of ``reps`` masked rounds; server and median client):

    - ``floor_operations``: the floor's operations (verifies, signs, agreements, PRG, attachment
      hashes) as they cost in the round, against their count x unit cost (``at_unit_cost``):
      the part of the excess that is the floor's own work running colder than in the unit loop;
    - ``not_in_floor``: the masked-only steps of :data:`NOT_IN_FLOOR`;
    - ``ratio_masked_over_floor_and_not_in_floor``: the masked seconds against the floor plus
      those steps (a second, wider floor: see the README for why they are not in the first).
    """
    rows = []
    for _ in range(reps):
        with counting(timed=True) as n:
            rows.append(party_seconds(ours, "masked", ops=n)["ops"])

    def per(party: str) -> dict:
        keys = {k for r in rows for k in r.get(party, {})}
        got = {k: statistics.median(r.get(party, {}).get(k, 0) for r in rows) for k in keys}
        ops = {k: v for k, v in got.items() if k in cpu_units}
        return {"floor_operations": {k[4:]: v for k, v in got.items() if k.startswith("cpu/") and k[4:] in cpu_units},
                "at_unit_cost": {k: v * cpu_units[k] for k, v in ops.items()},
                "not_in_floor": {k.split("/", 2)[-1]: v for k, v in got.items()
                                 if k.startswith("cpu/not_in_floor/")}}

    server = per("server")
    clients = [per(c) for c in ours.names]

    def med(section: str) -> dict:
        keys = {k for c in clients for k in c[section]}
        return {k: statistics.median(c[section].get(k, 0.0) for c in clients) for k in keys}

    client = {sec: med(sec) for sec in ("floor_operations", "at_unit_cost", "not_in_floor")}
    out = {"server": server, "client_median": client}
    for party, row in out.items():
        row["ratio_masked_over_floor_and_not_in_floor"] = masked_cpu[party] / (
            floor_cpu[party] + sum(row["not_in_floor"].values()))
    return out


OURS = ("insecure_plaintext", "masked", "masked16")


def bench_case(n: int, p: int, reps: int, *, with_flower: bool = True, party_reps: int = 7) -> dict:
    """One (n, P): whole rounds ``reps`` times, per-party rounds ``max(reps, party_reps)`` times
    (each client's time is a few milliseconds: more repetitions steady its median)."""
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
    parties: dict[str, list[dict]] = {s: [] for s in OURS}
    uploads, errors = {}, {}
    for rep in range(max(reps, party_reps)):  # interleaved
        for side, fn in sides.items() if rep < reps else ():
            dt, (mean, up) = _timed(fn)
            times[side].append(dt)
            uploads[side] = int(up)
            ref = exact_fl if side == "flower_secaggplus" else exact
            errors[side] = float(np.linalg.norm(mean - ref) / np.linalg.norm(ref))
        for side in OURS:
            parties[side].append(party_seconds(ours, side, first=rep))
    med = {s: statistics.median(v) for s, v in times.items()}
    per_party = {s: {k: statistics.median(r[k] for r in rows) for k in ("server", "client_median", "client_max")}
                 for s, rows in parties.items()}
    units = unit_costs()  # now: the load varies
    cpu_units = unit_costs(clock=time.thread_time)
    party_floor_row = per_party_floor(ours, parties, units, cpu_units)
    cpu_row = party_floor_row["cpu"]
    cpu_row["in_round"] = in_round(ours, cpu_units, cpu_row["floor_seconds"], cpu_row["masked_seconds"])
    peaks = {s: _peak(fn) for s, fn in sides.items()} if p <= 100_000 or n <= 10 else {}
    row = {
        "n": n, "P": p, "neighbours_k": ours.k, "threshold_t": ours.t, "flower_num_shares": ours.k + 1,
        "seconds_per_round_median": med, "seconds_per_round_all": times,
        "ratio_masked_over_plaintext": med["masked"] / med["insecure_plaintext"],
        "ratio_masked16_over_plaintext": med["masked16"] / med["insecure_plaintext"],
        "per_party_seconds_per_round_median": per_party,
        "per_party_ratio_masked_over_plaintext": {
            k: per_party["masked"][k] / per_party["insecure_plaintext"][k] for k in ("server", "client_max")},
        "floor": floor(ours, units, med["insecure_plaintext"]),
        "per_party_floor": party_floor_row,
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


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_convention(ap, quick_help="small sizes")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-flower", action="store_true", help="skip Flower's SecAgg+ (faster)")
    ap.add_argument("--party-reps", type=int, default=7, help="hand-driven rounds for the per-party medians")
    ap.add_argument("--case", action="append", default=None, metavar="N:P",
                    help="only this (n, P) (repeatable; e.g. 100:100000)")
    args = ap.parse_args(argv)
    grid = [(5, 10_000), (10, 10_000)] if args.quick else \
        [(10, 10_000), (5, 100_000), (10, 100_000), (20, 100_000), (50, 100_000), (100, 100_000), (10, 1_000_000)]
    if args.case:
        grid = [(int(n), int(float(p))) for n, p in (c.split(":") for c in args.case)]
    cases = []
    for n, p in grid:
        reps = max(args.reps, 5) if p <= 10_000 else args.reps
        row = bench_case(n, p, reps, with_flower=n <= 20 and not args.no_flower, party_reps=args.party_reps)
        cases.append(row)
        m, pp = row["seconds_per_round_median"], row["per_party_ratio_masked_over_plaintext"]
        pf = row["per_party_floor"]["cpu"]["ratio_masked_over_floor"]
        pfx = row["per_party_floor"]["cpu"]["ratio_masked_over_floor_fixed_size"]
        print(f"n={n} P={p}: " + ", ".join(f"{s} {v:.3f} s" for s, v in m.items())
              + f"; masked/plaintext {row['ratio_masked_over_plaintext']:.2f} (floor {row['floor']['ratio_floor']:.2f}; "
              f"server {pp['server']:.2f}, slowest client {pp['client_max']:.2f}); per party / its floor (CPU): "
              f"server {pf['server']:.2f}, clients median {pf['client_median']:.2f}, worst {pf['client_worst']:.2f}; "
              f"signatures priced at {UNIT_MESSAGE_BYTES} B: server {pfx['server']:.2f}, clients median "
              f"{pfx['client_median']:.2f}",
              file=sys.stderr)
    result = {"benchmark": "secure_aggregation_masked", "quick": args.quick, "reps": args.reps,
              "machine": machine(("pydantic", "pycryptodome")), "mask_prg": MASK_PRG,
              "note": "serial in-process rounds on a 2-core machine shared with other jobs; see machine.load_average_at_start",
              "parameters": {"clip": 1.0, "modules": N_MODULES, "deltas": "N(0, 0.05) float32",
                             "weights": "U(0.2, 1); Flower gets num_examples = round(100 w), max_weight 100",
                             "threshold": "t = k // 2 + 1 (as Flower's default reconstruction threshold)",
                             "flower": "SecAggPlusWorkflow(num_shares=k+1, reconstruction_threshold=t, "
                                       "clipping_range=8, quantization 2^22, modulus 2^32)"},
              "cases": cases}
    emit(result, out=out_path(__file__, args))
    return result


if __name__ == "__main__":
    main()
