"""Global model state as the server holds it: module name -> flat float64 vector."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np

from clinograph.core.codec import encode_array
from clinograph.core.errors import ProtocolError
from clinograph.core.spec import ModelSpec

State = dict[str, np.ndarray]
UNKNOWN_STATE = "0" * 64  # the plan's digest when the server holds no plaintext model (ckks)


def state_digest(state: Mapping[str, np.ndarray]) -> str:
    """SHA-256 over (name, float64 bytes) of every module in name order."""
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode() + b"\x00")
        h.update(encode_array(np.asarray(state[name]).reshape(-1), "<f8"))
    return h.hexdigest()


def check_state(spec: ModelSpec, state: Mapping[str, np.ndarray]) -> State:
    """Every shared module present with the right size; returns flat float64 copies."""
    problems = []
    out: State = {}
    for m in spec.shared:
        if m.name not in state:
            problems.append(f"module {m.name!r} missing")
            continue
        v = np.asarray(state[m.name], dtype=np.float64).reshape(-1)
        if v.size != m.size:
            problems.append(f"module {m.name!r} has {v.size} values, spec says {m.size}")
        out[m.name] = v.copy()
    extra = sorted(set(state) - set(out) - {m.name for m in spec.shared})
    if extra:
        problems.append(f"state has modules not shared in the spec: {extra[:5]}")
    if problems:
        raise ProtocolError("Global state does not match ModelSpec v%d: %s." % (spec.version, "; ".join(problems)))
    return out
