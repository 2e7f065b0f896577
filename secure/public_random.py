"""Public randomness: uniform streams fixed by their definition (SHAKE-256), for public choices.

Some server-side steps are public post-processing that needs random draws: the FedNSL M-step
samples rules from the published mixture, the concept-DAG vote breaks exact ties. An auditor must
be able to recompute them on their own machine, with any library, years later. numpy's
generators do not promise that (a PCG64 stream may change across releases), so these draws come
from SHAKE-256 over ``(domain, seed, label)``: the stream is the hash's output, nothing else.

Never for a secret: the seed is public by construction. Secret randomness (masks, keys, DP
noise) comes from the OS CSPRNG through ``secure/hazmat``.
"""

from __future__ import annotations

import hashlib

import numpy as np


def public_uniforms(domain: bytes, seed: int, *, label: str, n: int) -> np.ndarray:
    """``n`` public uniforms in [0, 1): 53-bit words of SHAKE-256(domain ‖ 0 ‖ "seed:label")."""
    raw = hashlib.shake_256(domain + b"\x00" + f"{int(seed)}:{label}".encode()).digest(8 * n)
    return (np.frombuffer(raw, dtype=">u8") >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def public_index(domain: bytes, seed: int, *, label: str, k: int) -> int:
    """One public uniform draw from ``range(k)`` (``k`` ≥ 1), by inverse CDF of one 53-bit uniform.

    Bias: at most k / 2^53 per outcome, far below anything a tie-break could show."""
    if k < 1:
        raise ValueError("public_index needs k >= 1")
    u = float(public_uniforms(domain, seed, label=label, n=1)[0])
    return min(int(u * k), k - 1)
