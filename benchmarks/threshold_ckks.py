"""Threshold CKKS (secure/ckks/threshold.py) beside TenSEAL's single-key ``ckks`` (ADD_ONLY_128).

    python -m benchmarks.threshold_ckks            # P in {1e4, 1e5, 1e6}, n in {3, 10, 20}, 3 reps
    python -m benchmarks.threshold_ckks --quick    # P = 1e4, n = 3, 1 rep

Both in one process, one core (OMP_NUM_THREADS=1 recommended), medians over repetitions, both
at the cryptographic layer (no envelopes or signatures: those cost the same in both modes).
Single key: every hospital encrypts (seeded symmetric, SEAL's zstd bytes), the server loads and
adds, one hospital decrypts. Threshold: every hospital encrypts under the collective public key
(SEAL's ``Encryptor``), the server loads and adds, the combiner (server) builds the decryption
request (the aggregate's ``c1`` halves and one canary), every key holder answers with its
decryption share, the combiner checks every canary and decodes. Hospitals work in parallel, so
``round_s`` = per-hospital encrypt + server + (threshold: per-party share + combine) + decrypt.
Bytes per parameter: the update upload (SEAL bytes), and for threshold also the decryption-share
upload and the request download per party. The ``ckks_threshold`` mode's check that a request
is the aggregate (:mod:`clinograph.secure.ckks.threshold_check`) is measured per key holder:
``verify_s_per_party`` (SHA-256 over every contributor's ciphertexts, what checking their
signatures hashes, plus loading and adding them with SEAL and reading the sum's ``c1``; the n
Ed25519 verifications, ~0.1 ms each, are left out) and ``verify_download_bytes_per_param`` (the
n contributors' updates that ride with the request); ``mode_round_s`` adds the check to the round. Key generation (once per federation) is reported
separately. Writes benchmarks/secure_aggregation_cost/results/threshold_ckks.json (full run).
Asserts nothing about time.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import time
from pathlib import Path

import numpy as np
import tenseal.sealapi as sealapi
from clinograph.secure.ckks.presets import CkksPreset
from clinograph.secure.ckks.threshold import (
    CollectivePublicKey,
    Combiner,
    ThresholdParty,
    ThresholdPreset,
)
from clinograph.secure.hazmat import threshold_ckks as T
from clinograph.secure.hazmat.ckks_context import CkksSecretContext

from research._common import add_convention, emit, machine, out_path

FED = "bench"


def _values(n: int, p: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [float(rng.integers(200, 5000)) / 1000.0 * rng.normal(0, 0.05, p) for _ in range(n)]


def single_key(values: list[np.ndarray]) -> dict:
    """TenSEAL/SEAL single-key ckks, the existing preset (what ``ckks`` mode runs)."""
    ctx = CkksSecretContext.generate(CkksPreset.ADD_ONLY_128.params)
    enc, up, acc = [], 0, None
    srv = 0.0
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
    p = len(values[0])
    return dict(encrypt_s=statistics.median(enc), server_s=srv, decrypt_s=dec,
                round_s=statistics.median(enc) + srv + dec, upload_bytes_per_param=up / p,
                max_abs_error=float(np.max(np.abs(out - sum(values)))))


class Threshold:
    """One federation: collective key generation once, then rounds."""

    def __init__(self, n: int):
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

    def verify(self, uploads: list[list[bytes]], comb: Combiner) -> float:
        """Seconds for one key holder's aggregate check."""
        return _verify(self.public, uploads, comb)

    def round(self, values: list[np.ndarray], rnd: int) -> dict:
        enc, up, acc, srv = [], 0, None, 0.0
        ev = None
        uploads = []
        for v in values:
            t = time.perf_counter()
            cts = self.public.encrypt(v)
            enc.append(time.perf_counter() - t)
            uploads.append(cts)
            up = sum(map(len, cts))
            t = time.perf_counter()
            loaded = [self.public.load(c) for c in cts]
            if acc is None:
                acc, ev = loaded, sealapi.Evaluator(self.public._c.context)
            else:
                for a, b in zip(acc, loaded, strict=True):
                    ev.add_inplace(a, b)
            srv += time.perf_counter() - t
        t = time.perf_counter()
        comb = Combiner(public=self.public, round=rnd, aggregate=acc or [], contributions=len(values),
                        canary_seed=os.urandom(32))
        request_s = time.perf_counter() - t
        share_times, shares = [], {}
        for name, party in self.parties.items():
            t = time.perf_counter()
            shares[name] = party.decryption_share(comb.request)
            share_times.append(time.perf_counter() - t)
        t = time.perf_counter()
        out = comb.combine(shares, length=len(values[0]))
        combine_s = time.perf_counter() - t
        verify_s = self.verify(uploads, comb)
        p = len(values[0])
        share_s = statistics.median(share_times)
        return dict(encrypt_s=statistics.median(enc), server_s=srv, request_s=request_s, share_s_per_party=share_s,
                    combine_s=combine_s, round_s=statistics.median(enc) + srv + request_s + share_s + combine_s,
                    upload_bytes_per_param=up / p,
                    share_upload_bytes_per_param=sum(map(len, next(iter(shares.values())).shares)) / p,
                    request_download_bytes_per_param=sum(map(len, comb.request.c1)) / p,
                    verify_s_per_party=verify_s, verify_download_bytes_per_param=sum(map(len, sum(uploads, []))) / p,
                    mode_round_s=statistics.median(enc) + srv + request_s + verify_s + share_s + combine_s,
                    max_abs_error=float(np.max(np.abs(out - sum(values)))))


def _verify(public: CollectivePublicKey, uploads: list[list[bytes]], comb: Combiner) -> float:
    """One key holder's check that ``comb``'s request is the sum of ``uploads`` (seconds)."""
    t = time.perf_counter()
    for cts in uploads:
        for raw in cts:
            hashlib.sha256(raw).digest()
    c1 = [T.read_ciphertext(ct)[1].astype("<u8").tobytes() for ct in public.add(uploads)]
    got = list(comb.request.c1)
    if not any(got[:k] + got[k + 1:] == c1 for k in range(len(got))):
        raise RuntimeError("the request is not the aggregate")
    return time.perf_counter() - t


def _median_rows(rows: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_convention(ap, quick_help="P = 1e4, n = 3, 1 rep")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ps", default="10000,100000,1000000")
    ap.add_argument("--ns", default="3,10,20")
    args = ap.parse_args()
    ps = (10_000,) if args.quick else tuple(int(float(x)) for x in args.ps.split(","))
    ns = (3,) if args.quick else tuple(int(x) for x in args.ns.split(","))
    reps = 1 if args.quick else args.reps
    rng = np.random.default_rng(0)  # benchmark data only, nothing secret
    rows = []
    for n in ns:
        fed = Threshold(n)
        for p in ps:
            single, thr = [], []
            for r in range(reps):
                values = _values(n, p, rng)
                single.append(single_key(values))  # interleaved, same values
                thr.append(fed.round(values, r))
            s, t = _median_rows(single), _median_rows(thr)
            rows.append(dict(n=n, p=p, reps=reps, single_key_add_only_128=s, threshold_128=t, threshold_keygen=fed.keygen,
                             upload_ratio=t["upload_bytes_per_param"] / s["upload_bytes_per_param"],
                             upload_with_shares_ratio=(t["upload_bytes_per_param"] + t["share_upload_bytes_per_param"])
                             / s["upload_bytes_per_param"],
                             round_ratio=t["round_s"] / s["round_s"],
                             mode_round_ratio=t["mode_round_s"] / s["round_s"]))
            print(f"n={n} P={p}: upload x{rows[-1]['upload_ratio']:.2f} (with shares "
                  f"x{rows[-1]['upload_with_shares_ratio']:.2f}), round x{rows[-1]['round_ratio']:.2f}, with the aggregate check "
                  f"x{rows[-1]['mode_round_ratio']:.2f} (check {rows[-1]['threshold_128']['verify_s_per_party']:.3f} s, "
                  f"{rows[-1]['threshold_128']['verify_download_bytes_per_param']:.0f} B/param down)", flush=True)
    here = Path(__file__).resolve().parent / "secure_aggregation_cost" / "threshold_ckks.py"
    emit(dict(benchmark="threshold_ckks", rows=rows, machine=machine()), out=out_path(here, args))


if __name__ == "__main__":
    main()
