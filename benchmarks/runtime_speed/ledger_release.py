"""One private release's ledger check on a long privacy ledger: re-verifying the file every time
(before) against re-verifying it only when it changed on disk (now), same ledger, same process.

    python -m benchmarks.runtime_speed.ledger_release           # 1 000 rounds, writes results/ledger_release.json
    python -m benchmarks.runtime_speed.ledger_release --quick   # 100 rounds, writes results/ledger_release_quick.json

The ledger (:class:`~clinograph.sdk.privacy.PrivacyLedger`, signed, with its high-water mark) is
built through the API: every round one selection release (σ_s = 50) and one DP-SGD step
(σ = 1, q = 0.01), i.e. ``rounds`` releases and ``rounds`` report entries. Then, interleaved in
every repetition, ``calls`` calls of each arm, each call projecting one more release than the last
(the ε cache misses, as in a run):

- ``check_before``: :meth:`~PrivacyLedger.reload` then :meth:`~PrivacyLedger.check_release` -- what
  ``check_release`` did before (its ``refresh`` re-read, parsed and re-verified the whole file);
- ``check_after``: :meth:`~PrivacyLedger.check_release` (two ``stat`` calls while the file is unchanged);
- ``release_before`` / ``release_after``: a whole release, check then
  :meth:`~PrivacyLedger.commit_release` (which rewrites and re-signs the file, so its cost still
  grows with the ledger); *before* also makes the commit re-read the file under its lock first,
  as every commit did (the file object's pins dropped).

Reported: per arm the median seconds a call (the median over repetitions of each repetition's
median), the ratios before / after, the file's size, and the load before and after. Asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research._common import add_convention, emit, machine, median, out_path  # noqa: E402

SIGMA, Q, SIGMA_S, DELTA, BUDGET = 1.0, 0.01, 50.0, 1e-5, 100.0


def build(state_dir: Path, rounds: int):  # noqa: ANN201 - a PrivacyLedger
    """A signed ledger of ``rounds`` rounds, each one release and one DP-SGD step."""
    from clinograph.sdk.privacy import PrivacyLedger

    from clinograph.core.identity import Identity

    ledger = PrivacyLedger(state_dir, site="bench", budget_epsilon=BUDGET, delta=DELTA,
                           signer=Identity.generate("bench"))
    for r in range(rounds):
        ledger.check_release(round_=r, noise_multiplier=SIGMA_S, purpose="selection")
        ledger.commit_release(round_=r, noise_multiplier=SIGMA_S, purpose="selection")
        ledger.commit(round_=r, history=[*ledger.history, (SIGMA, Q, 1)], noise_multiplier=SIGMA, sample_rate=Q,
                      clip_norm=1.0)
    return ledger


def arms(ledger, *, round_: int) -> dict:  # noqa: ANN001
    """Each arm as a function of the call's extra release count."""
    def check(count: int) -> None:
        ledger.check_release(round_=round_, noise_multiplier=SIGMA_S, purpose="selection", count=count)

    def check_before(count: int) -> None:
        ledger.reload()
        check(count)

    def release_after(count: int) -> None:
        check(1)
        ledger.commit_release(round_=round_, noise_multiplier=SIGMA_S, purpose="selection")

    def release_before(count: int) -> None:
        check_before(1)
        ledger._file.forget()  # the commit re-reads under its lock, as before
        ledger.commit_release(round_=round_, noise_multiplier=SIGMA_S, purpose="selection")

    return {"check_before": check_before, "check_after": check, "release_before": release_before,
            "release_after": release_after}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_convention(ap)
    ap.add_argument("--rounds", type=int, default=None, help="ledger length (default 1000; 100 with --quick)")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 5; 3 with --quick)")
    a = ap.parse_args()
    rounds = a.rounds or (100 if a.quick else 1000)
    reps, calls = a.reps or (3 if a.quick else 5), 20
    info = machine()
    with tempfile.TemporaryDirectory(prefix="ledger_bench_") as tmp:
        t0 = time.perf_counter()
        ledger = build(Path(tmp), rounds)
        build_s = time.perf_counter() - t0
        fns, extra = arms(ledger, round_=rounds), 0
        per_rep: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(reps):
            for name, fn in fns.items():  # interleaved
                times = []
                for _ in range(calls):
                    extra += 1
                    t = time.perf_counter()
                    fn(extra)
                    times.append(time.perf_counter() - t)
                per_rep[name].append(median(times))
        size = ledger.path.stat().st_size
        entries, verifications = len(ledger.entries), ledger._file.verifications
    med = {k: median(v) for k, v in per_rep.items()}
    emit({"benchmark": "ledger_release", "machine": info, "rounds": rounds, "entries": entries,
          "ledger_bytes": size, "reps": reps, "calls_per_rep": calls, "build_seconds": build_s,
          "verifications_total": verifications,
          "median_seconds": med, "per_rep_median_seconds": per_rep,
          "ratio_check_before_over_after": med["check_before"] / med["check_after"],
          "ratio_release_before_over_after": med["release_before"] / med["release_after"]},
         out=out_path(__file__, a))


if __name__ == "__main__":
    main()
