"""The ``ckks`` mode against the anchor, TenSEAL with NVFLARE's default parameters.

    python -m benchmarks.secure_aggregation_cost.secure_aggregation_ckks            # n in {5,10,20}, P in {1e5,1e6}, 3 reps (~10 min)
    python -m benchmarks.secure_aggregation_cost.secure_aggregation_ckks --quick    # n = 5, P = 1e5, 3 reps; prints JSON only

Per (n, P) and configuration, interleaved in one process, medians over the repetitions:
seconds a hospital spends encrypting (and sealing) its update, seconds the server spends
deserialising and summing all n updates (streamed: one update in memory at a time), seconds
a hospital spends verifying, deserialising and decrypting the aggregate; bytes uploaded per
client (wire envelope, the Flower message around it, and raw SEAL ciphertext bytes) and per
parameter; bytes downloaded. Ciphertexts travel as raw envelope attachments (secure/wire.py).

Configurations: our mode end to end (CkksClient/CkksServer) with ADD_ONLY_128 and
ADD_ONLY_128_COMPACT, and the anchor: ``tenseal.ckks_vector`` with NVFLARE's default context
(N 8192, [60, 40, 40], scale 2^40, symmetric), serialised and summed as NVFLARE does.
TenSEAL runs with n_threads=1 so that both sides use one core. Hospitals work in parallel,
so ``round_s = encrypt_s + server_s + decrypt_s``. Writes
benchmarks/secure_aggregation_cost/results/secure_aggregation_ckks.json (full run). Asserts nothing about time.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

import numpy as np
import tenseal as ts
from clinograph.secure.aggregation import LocalUpdate
from clinograph.secure.ckks import (
    CkksClient,
    CkksKeyDealer,
    CkksKeyring,
    CkksPreset,
    CkksRecipientKey,
    CkksServer,
    CkksServerContext,
    ckks_plan_options,
)
from clinograph.secure.ckks.messages import CkksUpdate
from clinograph.secure.messages import RoundPlan
from clinograph.secure.wire import open_envelope, parse_envelope

from clinograph.core.identity import Identity
from clinograph.core.spec import ModelSpec, ModuleKind, ModuleSpec
from research._common import add_convention, emit, machine, out_path

FED = "bench"


def _spec(p: int) -> ModelSpec:
    sizes = [p // 2, p // 4, p - p // 2 - p // 4]  # three modules, the way a real model is split
    return ModelSpec(version=1, modules=tuple(ModuleSpec(name=f"gnn/m{i}", shape=(s,), kind=ModuleKind.SHARED)
                                              for i, s in enumerate(sizes)))


def _updates(spec: ModelSpec, n: int, rng: np.random.Generator) -> dict[str, LocalUpdate]:
    out = {}
    for i in range(n):
        w = float(rng.integers(200, 5000)) / 1000.0
        out[f"h{i:02d}"] = LocalUpdate(modules={m.name: w * rng.normal(0, 0.05, m.size).astype(np.float32)
                                                .astype(np.float64) for m in spec.modules}, weight=w)
    return out


class Ours:
    """One federation with a preset: ceremony once, then rounds."""

    def __init__(self, preset: CkksPreset, n: int):
        self.ids = {f"h{i:02d}": Identity.generate(f"h{i:02d}") for i in range(n)}
        self.server_id = Identity.generate("server")
        dealer = CkksKeyDealer.create(preset=preset, identity=self.ids["h00"], federation_id=FED)
        self.rings = {"h00": dealer.keyring()}
        for h in list(self.ids)[1:]:
            rk = CkksRecipientKey.generate(identity=self.ids[h], federation_id=FED)
            pkg = dealer.wrap_for(request=rk.request(), requester=self.ids[h].public)
            self.rings[h] = CkksKeyring.unwrap(package=pkg, recipient_key=rk, dealer=self.ids["h00"].public)
        self.ctx = CkksServerContext.load(data=dealer.public_context(), dealer=self.ids["h00"].public, federation_id=FED)

    def round(self, spec: ModelSpec, updates: dict[str, LocalUpdate], rnd: int) -> dict:
        plan = RoundPlan(federation_id=FED, round=rnd, participants=tuple(self.ids), spec=spec, dictionary_hash="d" * 64,
                         secure_mode="ckks", strategy="fedavg", min_clients=2, local_epochs=1,
                         global_state_digest="0" * 64, options=ckks_plan_options(self.ctx))
        peers = {c: i.public for c, i in self.ids.items()}
        server = CkksServer.with_context(self.ctx)(plan=plan, peers=peers, identity=self.server_id)
        clients = {c: CkksClient.with_keyring(self.rings[c])(plan=plan, identity=self.ids[c], server=self.server_id.public,
                                                             peers=peers, update=u) for c, u in updates.items()}
        enc, env_s, srv, up, raw = [], [], 0.0, 0, 0
        for c, cl in clients.items():  # streamed: one upload in memory at a time
            t = time.perf_counter()
            data = cl.first_message()
            enc.append(time.perf_counter() - t)
            up = len(data)
            flower = _flower_message_bytes(data)
            t = time.perf_counter()  # the wire's share of the server's work (parse, verify, validate)
            env = parse_envelope(data)
            raw = sum(map(len, open_envelope(env, sender=peers[c], model=CkksUpdate).ciphertexts))
            env_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            server.receive(parse_envelope(data))
            srv += time.perf_counter() - t
            del data, env
        t = time.perf_counter()
        out = server.next_stage() or {}
        srv += time.perf_counter() - t
        first = next(iter(out))
        t = time.perf_counter()
        clients[first].handle(out[first])
        dec = time.perf_counter() - t
        res = clients[first].decrypted_result()
        err = max(float(np.max(np.abs(res.sums[m.name] - sum(u.modules[m.name] for u in updates.values()))))
                  for m in spec.modules)
        return dict(encrypt_s=statistics.median(enc), server_s=srv, decrypt_s=dec,
                    server_envelope_s_per_client=statistics.median(env_s), upload_bytes=up,
                    upload_ciphertext_bytes=raw, upload_flower_message_bytes=flower,
                    download_bytes=len(out[first]), max_abs_error=err)


def _flower_message_bytes(envelope: bytes) -> int:
    """Bytes of the protobuf Flower message our Flower transport sends for the update's envelope
    (secure/transport/flower/records.py: a ConfigRecord of bytes, Flower's own serialisation)."""
    from clinograph.secure.transport.flower.records import MESSAGE_TYPE, to_content
    from flwr.app import Message
    from flwr.common.serde import message_to_proto
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    query = Message(to_content("plan", {"data": b"x"}, round_=1), dst_node_id=101, message_type=MESSAGE_TYPE)
    reply = Message(to_content("plan", {"report": b"", "first": envelope}, round_=1), reply_to=query)
    return len(message_to_proto(reply).SerializeToString())


class Nvflare:
    """The anchor: TenSEAL ckks_vector with NVFLARE's default context, secret key at clients,
    a context without secret key at the server."""

    def __init__(self):
        self.ctx = ts.context(ts.SCHEME_TYPE.CKKS, poly_modulus_degree=8192, coeff_mod_bit_sizes=[60, 40, 40],
                              encryption_type=ts.ENCRYPTION_TYPE.SYMMETRIC, n_threads=1)
        self.ctx.global_scale = 2 ** 40
        self.server_ctx = ts.context_from(self.ctx.serialize(save_secret_key=False), n_threads=1)

    def round(self, spec: ModelSpec, updates: dict[str, LocalUpdate], rnd: int) -> dict:
        enc, srv, up, acc = [], 0.0, 0, None
        for u in updates.values():
            t = time.perf_counter()
            blobs = {name: ts.ckks_vector(self.ctx, v).serialize() for name, v in u.modules.items()}
            enc.append(time.perf_counter() - t)
            up = sum(map(len, blobs.values()))
            t = time.perf_counter()
            vecs = {name: ts.ckks_vector_from(self.server_ctx, b) for name, b in blobs.items()}
            if acc is None:
                acc = vecs
            else:
                for name, v in vecs.items():
                    acc[name] += v
            srv += time.perf_counter() - t
            del blobs, vecs
        t = time.perf_counter()
        sums = {name: v.serialize() for name, v in acc.items()}
        srv += time.perf_counter() - t
        t = time.perf_counter()
        dec = {name: np.array(ts.ckks_vector_from(self.ctx, b).decrypt()) for name, b in sums.items()}
        dt = time.perf_counter() - t
        err = max(float(np.max(np.abs(dec[m.name] - sum(u.modules[m.name] for u in updates.values()))))
                  for m in spec.modules)
        return dict(encrypt_s=statistics.median(enc), server_s=srv, decrypt_s=dt,
                    server_envelope_s_per_client=0.0, upload_bytes=up,
                    upload_ciphertext_bytes=up, upload_flower_message_bytes=0, download_bytes=sum(map(len, sums.values())), max_abs_error=err)


def _machine() -> dict:
    cpu = ""
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import os

    import cryptography
    import pydantic
    return dict(platform=platform.platform(), python=sys.version.split()[0], cpu=cpu, cpu_count=os.cpu_count(),
                tenseal=ts.__version__, numpy=np.__version__, cryptography=cryptography.__version__,
                pydantic=pydantic.__version__)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_convention(ap, quick_help="n = 5, P = 1e5")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    ns, ps = ((5,), (100_000,)) if args.quick else ((5, 10, 20), (100_000, 1_000_000))
    configs = [CkksPreset.ADD_ONLY_128.value, CkksPreset.ADD_ONLY_128_COMPACT.value, "nvflare_default_tenseal"]
    rows = []
    for p in ps:
        spec = _spec(p)
        for n in ns:
            runners = {CkksPreset.ADD_ONLY_128.value: Ours(CkksPreset.ADD_ONLY_128, n),
                       CkksPreset.ADD_ONLY_128_COMPACT.value: Ours(CkksPreset.ADD_ONLY_128_COMPACT, n),
                       "nvflare_default_tenseal": Nvflare()}
            samples: dict[str, list[dict]] = {c: [] for c in configs}
            for rep in range(args.reps):
                updates = _updates(spec, n, np.random.default_rng(rep))
                for c in configs:  # interleaved
                    samples[c].append(runners[c].round(spec, updates, rep))
                print(f"P={p} n={n} rep {rep + 1}/{args.reps}", file=sys.stderr, flush=True)
            for c in configs:
                med = {k: statistics.median(s[k] for s in samples[c]) for k in samples[c][0]}
                med["round_s"] = med["encrypt_s"] + med["server_s"] + med["decrypt_s"]
                med["upload_bytes_per_param"] = med["upload_bytes"] / p
                med["upload_ciphertext_bytes_per_param"] = med["upload_ciphertext_bytes"] / p
                med["upload_flower_message_bytes_per_param"] = med["upload_flower_message_bytes"] / p
                med["download_bytes_per_param"] = med["download_bytes"] / p
                rows.append(dict(config=c, n=n, P=p, reps=args.reps, **med))
            base = {r["config"]: r for r in rows if r["n"] == n and r["P"] == p}
            for c in configs[:2]:
                base[c]["round_ratio_vs_nvflare"] = base[c]["round_s"] / base["nvflare_default_tenseal"]["round_s"]
                base[c]["upload_ratio_vs_nvflare"] = base[c]["upload_bytes"] / base["nvflare_default_tenseal"]["upload_bytes"]
    result = dict(benchmark="secure_aggregation_ckks", quick=args.quick, machine={**machine(("pydantic",)), **_machine()},
                  notes=("medians over reps; ours = CkksClient/CkksServer end to end incl. signing and the wire "
                         "envelope (ciphertexts as raw envelope attachments, secure/wire.py: compare upload_bytes with "
                         "upload_ciphertext_bytes; upload_flower_message_bytes is the same envelope inside the Flower "
                         "message our Flower transport sends, 0 for the anchor); "
                         "anchor = tenseal.ckks_vector with NVFLARE's default context, n_threads=1, no envelope; "
                         "round_s = encrypt_s + server_s + decrypt_s (hospitals in parallel)"),
                  rows=rows)
    emit(result, out=out_path(__file__, args))


if __name__ == "__main__":
    main()
