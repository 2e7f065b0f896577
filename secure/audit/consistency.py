"""Proof that a later audit head extends an earlier one (consistency over the hash chain).

A hospital anchors the audit head a signed plan presented (entry ``seq``, hash ``h_seq``:
``sdk/federation/anchor.py``). A later plan presents a head (``seq'``, ``h_seq'``) and carries,
in its options, the entries between: ``audit.proof_from`` = f and ``audit.proof`` = the exact
lines of entries f+1 .. seq' of ``audit.jsonl`` (f ≤ seq). Each line's hash is recomputed from
its content (:func:`~.entry.parse_entry`), and since every entry hashes its predecessor's hash
(``prev``), the entries seq+1 .. seq' link h_seq to h_seq' only if the trail that produced
the new head grew from the anchored one. A server rolled back to an earlier copy (a fork) cannot
present such a chain whatever sequence number it reaches, short of rewriting its log to contain
the anchored entries -- which is then no longer a rollback.

The links need no signature of their own -- they are checked against the heads, which the
server signed in the plans -- but each entry's server signature is checked too, so that any
changed byte of a proof is refused. Entries before seq+1 in the proof are ignored (the server starts the proof early enough
for every participant, :meth:`AuditTrail.segment`).
"""

from __future__ import annotations

from clinograph.core.errors import IntegrityError
from clinograph.core.identity import PublicIdentity

from .entry import AuditEntry, check_entry_signature, parse_entry

PROOF = "audit.proof"
PROOF_FROM = "audit.proof_from"
#: bound on a proof carried in a plan (the entries since the oldest participant's anchor)
MAX_PROOF_BYTES = 64 * 2**20


def check_extension(*, anchored_seq: int, anchored_head: str, seq: int, head: str, proof: object,
                    proof_from: object, server: PublicIdentity) -> list[AuditEntry]:
    """Raise :class:`IntegrityError` unless ``proof`` links entry ``anchored_seq`` (hash
    ``anchored_head``) to entry ``seq`` (hash ``head``), ``seq > anchored_seq``, through entries
    signed by ``server``; return those entries (``anchored_seq + 1`` .. ``seq``), checked."""
    if not isinstance(proof, str) or isinstance(proof_from, bool) or not isinstance(proof_from, int):
        raise IntegrityError("the plan carries no proof that its audit head extends the anchored one")
    if len(proof) > MAX_PROOF_BYTES:
        raise IntegrityError(f"its audit proof is {len(proof)} bytes, over the bound of {MAX_PROOF_BYTES}")
    if proof_from > anchored_seq:
        raise IntegrityError(f"its audit proof starts after entry {proof_from}, past the anchored entry {anchored_seq}")
    lines = proof.encode("ascii", errors="replace").split(b"\n")
    if len(lines) != seq - proof_from:
        raise IntegrityError(f"its audit proof holds {len(lines)} entries, not the {seq - proof_from} from entry "
                             f"{proof_from + 1} to {seq}")
    prev, checked = anchored_head, []
    for index, line in enumerate(lines, start=proof_from + 1):
        if index <= anchored_seq:
            continue
        entry = parse_entry(line, index=index)  # its own hash, recomputed from its content
        check_entry_signature(entry, server)
        if entry.prev != prev:
            raise IntegrityError(f"audit entry {index} of its proof does not follow entry {index - 1} "
                                 f"({prev[:12]}…) that this hospital holds")
        prev = entry.hash
        checked.append(entry)
    if prev != head:
        raise IntegrityError(f"its audit proof ends at {prev[:12]}…, not at the head {head[:12]}… it presents")
    return checked
