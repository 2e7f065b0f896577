"""Threshold CKKS (the ``ckks_threshold`` mode's cryptography) beside TenSEAL's single-key ``ckks``
(ADD_ONLY_128) and the ``masked`` mode, in one process.

    python -m benchmarks.secure_aggregation_cost.threshold_ckks            # P in {1e4, 1e5, 1e6} x n in {3, 10, 20}, 3 reps
    python -m benchmarks.secure_aggregation_cost.threshold_ckks --quick    # P = 1e4, n = 3, 1 rep (prints, writes _quick)
    python -m benchmarks.secure_aggregation_cost.threshold_ckks --ps 100000 --ns 10 --t 6 --out threshold_ckks_p1e5_n10_t6

``--t T`` runs the threshold side t-of-N; default t = N (N-of-N, which the mode also sets up by
re-sharing); ``--t -1`` a majority for each n. Every holder re-shares its key share at set-up, in
process (Shamir deals to each holder, pairwise seeds).

Same values for every side, the three interleaved in each repetition, medians over repetitions.
Hospitals work in parallel, so ``round_s`` is the critical path: one hospital's part (median
over hospitals) plus the server's.

* Single key (``ckks`` at the cryptographic layer): every hospital encrypts (seeded symmetric,
  SEAL's zstd bytes), the server loads and adds, one hospital decrypts.
* Threshold (the mode's own functions: :mod:`clinograph.secure.ckks.threshold_sum` and
  :mod:`clinograph.secure.ckks.threshold_upload`): every hospital expands the commitment set's
  common polynomials, encrypts under its own key share and packs the rounded c0; the server
  parses and adds the c0 and builds the :class:`~clinograph.secure.ckks.threshold_sum.SumCombiner`;
  each of the t holders asked makes its share of the members' sum (Lagrange-scaled per-member
  Shamir shares, zero-sharing mask, smudging, canary); the combiner checks the canary and decodes.
  The Ed25519 signatures and verifications (~0.1 ms each), the envelopes and the commit stage's
  message round are left out, as envelopes are on the single-key side. ``round_s`` = encode +
  server + holder + combine.
* Masked: the ``masked`` mode's whole round driven by hand in process
  (:func:`.secure_aggregation_masked.party_seconds`, envelopes and signatures included);
  ``round_s`` = the server's seconds + the slowest hospital's.

Bytes per parameter: the upload (threshold: the c0 parts; single key: SEAL's bytes; masked:
its vector envelope), and for threshold each holder's decryption share (a holder downloads no
ciphertext: the request names the set). Key generation (once per federation) is reported separately. Writes
benchmarks/secure_aggregation_cost/results/threshold_ckks.json. Asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from clinograph.secure.ckks import threshold_upload as U  # noqa: E402
from clinograph.secure.ckks.presets import CkksPreset  # noqa: E402
from clinograph.secure.ckks.threshold import CollectivePublicKey, ThresholdParty, ThresholdPreset  # noqa: E402
from clinograph.secure.ckks.threshold_messages import commitments_digest  # noqa: E402
from clinograph.secure.ckks.threshold_reshare import in_process_reshare  # noqa: E402
from clinograph.secure.ckks.threshold_sum import SumCombiner, round_polys, sum_share  # noqa: E402
from clinograph.secure.hazmat.ckks_context import CkksSecretContext  # noqa: E402

from benchmarks.secure_aggregation_cost.secure_aggregation_masked import (  # noqa: E402
    _Ours,
    party_seconds,
    vector_upload_bytes,
)
from research._common import add_convention, emit, machine, out_path  # noqa: E402

FED = "bench"


def _values(n: int, p: int, rng: np.random.Generator) -> tuple[list[np.ndarray], list[np.ndarray], list[float]]:
    """Weighted updates w_i * d_i (what both CKKS sides encrypt), and the d_i, w_i the masked side takes."""
    deltas = [rng.normal(0.0, 0.05, p).astype(np.float32) for _ in range(n)]
    weights = [float(rng.uniform(0.2, 1.0)) for _ in range(n)]
    return [w * d.astype(np.float64) for d, w in zip(deltas, weights, strict=True)], deltas, weights


def single_key(values: list[np.ndarray]) -> dict:
    """TenSEAL/SEAL single-key ckks, the existing preset (what ``ckks`` mode runs)."""
    ctx = CkksSecretContext.generate(CkksPreset.ADD_ONLY_128.params)
    enc, up, acc, srv = [], 0, None, 0.0
    for v in values:
        t = time.perf_counter()
        cts = ctx.encrypt(v)
        enc.append(time.perf_counter() - t)
        up = sum(map(len, cts))
        t = time.perf_counter()
        loaded = [ctx.load_ciphertext(c) for c in cts]
        if acc is None:
            acc = loaded
        else:
            for a, b in zip(acc, loaded, strict=True):
                ctx.add_inplace(a, b)
        srv += time.perf_counter() - t
    t = time.perf_counter()
    out = ctx.decrypt(acc or [], len(values[0]))
    dec = time.perf_counter() - t
    return dict(encrypt_s=statistics.median(enc), server_s=srv, decrypt_s=dec,
                round_s=statistics.median(enc) + srv + dec, upload_bytes_per_param=up / len(values[0]),
                max_abs_error=float(np.max(np.abs(out - sum(values)))))


def masked(deltas: list[np.ndarray], weights: list[float]) -> dict:
    """The ``masked`` mode's round, hand-driven in process (envelopes and signatures included)."""
    ours = _Ours(len(deltas), len(deltas[0]), deltas, weights)
    t = party_seconds(ours, "masked")
    return dict(server_s=t["server"], client_median_s=t["client_median"], client_max_s=t["client_max"],
                round_s=t["server"] + t["client_max"],
                upload_bytes_per_param=vector_upload_bytes(ours, "masked")["envelope_bytes_per_parameter"])


class Threshold:
    """One federation: collective key generation once, then rounds."""

    def __init__(self, n: int, threshold: int = 0):
        self.parties = {f"h{i:02d}": ThresholdParty(preset=ThresholdPreset.THRESHOLD_128, federation_id=FED,
                                                     name=f"h{i:02d}") for i in range(n)}
        seed = os.urandom(32)
        times, shares = [], {}
        for name, party in self.parties.items():
            t = time.perf_counter()
            shares[name] = party.keygen_share(seed=seed)
            times.append(time.perf_counter() - t)
        t = time.perf_counter()
        self.public = CollectivePublicKey(preset=ThresholdPreset.THRESHOLD_128, federation_id=FED, seed=seed,
                                          shares=shares)
        self.keygen = dict(share_s_per_party=statistics.median(times), combine_s=time.perf_counter() - t,
                           share_bytes_per_party=len(next(iter(shares.values())).p0),
                           public_key_bytes=len(self.public.public_key_bytes))
        t = time.perf_counter()  # every holder deals to every holder and adopts (in process: no wrapping)
        in_process_reshare(self.parties, self.public, threshold=threshold or n)
        self.keygen["reshare_s_all_parties"] = time.perf_counter() - t
        #: the holders asked (the first t by name, as the mode's server picks)
        self.present = self.public.holders[:threshold or n]

    def round(self, values: list[np.ndarray], rnd: int) -> dict:
        pub, p, names = self.public, len(values[0]), sorted(self.parties)
        n_ct = -(-p // pub.preset.params.slot_count)
        digest = commitments_digest(tuple(os.urandom(64) for _ in names))  # the relayed commitment set's digest
        enc, uploads, polys = [], [], {}
        for name, v in zip(names, values, strict=True):
            t = time.perf_counter()
            polys[name] = round_polys(public=pub, round=rnd, commitments_sha256=digest, count=n_ct)
            uploads.append(U.encode(self.parties[name], pub, v, polys[name]))
            enc.append(time.perf_counter() - t)
        t = time.perf_counter()  # the server: parse, add, build the combiner
        c0 = [U.read_c0(pub, parts, n) for n, parts in zip(names, uploads, strict=True)]
        comb = SumCombiner(public=pub, round=rnd, commitments_sha256=digest, members=names,
                           c0=U.aggregate(pub, c0), canary_seed=os.urandom(32), present=self.present)
        server_s = time.perf_counter() - t
        share_times, shares = [], {}
        for name in comb.present:
            t = time.perf_counter()
            shares[name] = sum_share(self.parties[name], public=pub, request=comb.request, members=names,
                                     a=polys[name])
            share_times.append(time.perf_counter() - t)
        t = time.perf_counter()
        out = comb.combine(shares, length=p)
        combine_s = time.perf_counter() - t
        encode_s, holder_s = statistics.median(enc), statistics.median(share_times)
        return dict(encode_s=encode_s, server_s=server_s, holder_share_s=holder_s, combine_s=combine_s,
                    round_s=encode_s + server_s + holder_s + combine_s,
                    upload_bytes_per_param=sum(map(len, uploads[0])) / p,
                    share_upload_bytes_per_param=sum(map(len, next(iter(shares.values())).shares)) / p,
                    max_abs_error=float(np.max(np.abs(out - sum(values)))))


def _median_rows(rows: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_convention(ap, quick_help="P = 1e4, n = 3, 1 rep")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ps", default="10000,100000,1000000")
    ap.add_argument("--ns", default="3,10,20")
    ap.add_argument("--t", type=int, default=0,
                    help="t-of-N with this t (default 0: N-of-N; -1: a majority, n // 2 + 1, for each n)")
    args = ap.parse_args()
    ps = (10_000,) if args.quick else tuple(int(float(x)) for x in args.ps.split(","))
    ns = (3,) if args.quick else tuple(int(x) for x in args.ns.split(","))
    reps = 1 if args.quick else args.reps
    rng = np.random.default_rng(0)  # benchmark data only, nothing secret
    rows = []
    for n in ns:
        holders_t = n // 2 + 1 if args.t < 0 else args.t
        fed = Threshold(n, holders_t)
        for p in ps:
            single, thr, msk = [], [], []
            load_before = os.getloadavg()
            for r in range(reps):
                values, deltas, weights = _values(n, p, rng)
                single.append(single_key(values))  # interleaved, same values
                thr.append(fed.round(values, r))
                msk.append(masked(deltas, weights))
            s, t, m = _median_rows(single), _median_rows(thr), _median_rows(msk)
            rows.append(dict(n=n, p=p, reps=reps, load_average=[load_before, os.getloadavg()],
                             rule=f"{holders_t}-of-{n}" if holders_t and holders_t != n else "N-of-N",
                             single_key_add_only_128=s, threshold_128=t, masked=m, threshold_keygen=fed.keygen,
                             upload_ratio=t["upload_bytes_per_param"] / s["upload_bytes_per_param"],
                             round_ratio=t["round_s"] / s["round_s"],
                             round_ratio_to_masked=t["round_s"] / m["round_s"]))
            print(f"n={n} P={p}: upload x{rows[-1]['upload_ratio']:.2f} ({t['upload_bytes_per_param']:.1f} B/param), "
                  f"round x{rows[-1]['round_ratio']:.2f} ({t['round_s']:.3f} s vs {s['round_s']:.3f} s; masked "
                  f"{m['round_s']:.3f} s), holder share {t['share_upload_bytes_per_param']:.0f} B/param, "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    emit(dict(benchmark="threshold_ckks", rows=rows, machine=machine()), out=out_path(__file__, args))


if __name__ == "__main__":
    main()
