"""The CKKS mode in the audit report's words: who holds the key, what the server holds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def describe(options: Mapping[str, Any], kinds: Mapping[str, Sequence[Mapping[str, Any]]]) -> tuple[
        str, list[tuple[str, object]]]:
    """(paragraph, rows) from the latest signed plan's ``options`` and the run's entries."""
    used = sorted({c for a in kinds.get("aggregate", ()) for c in a["contributors"]})
    holders = kinds.get("ckks_key_holders") or ()
    keys = holders[-1] if holders else None
    rows: list[tuple[str, object]] = [
        ("CKKS preset", options.get("ckks.preset", keys["preset"] if keys else "?")),
        ("context digest", options.get("ckks.context_digest", keys["context_digest"] if keys else "?")),
        ("who holds the secret key", (", ".join(keys["holders"]) + " (this run's key ceremony)") if keys
         else "the hospitals of the key ceremony (not recorded in this run)"),
        ("the server", "holds only the public parameters: no secret, public, relinearisation or Galois key"),
        ("hospitals that encrypted and decrypted under it", ", ".join(used) or "none yet"),
        ("minimum hospitals a round", options.get("min_clients", "?"))]
    return ("CKKS homomorphic encryption: the server adds ciphertexts and never sees an update, the sum or the model; "
            "the contributing hospitals decrypt the aggregate."), rows
