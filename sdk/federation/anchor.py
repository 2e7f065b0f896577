"""A hospital's anchor on the server's history: the latest signed plan (audit head, round) it saw.

``clinograph audit verify`` proves an audit directory is one unbroken, server-signed chain, but
not that it is the *latest* one: an operator (or an attacker with the server's disk) can put
back an earlier valid copy of the audit directory and the crash journal, and the server would
replay rounds -- hospitals would train and spend privacy budget again on rounds already run.
Hospitals see every plan, and each plan carries, signed by the server, the audit trail's head
at the time (``audit.seq``, ``audit.head``: :meth:`clinograph.secure.server.FederationServer.open_round`).
So each hospital keeps the latest verified plan in ``<state_dir>/audit_anchor.json`` (atomic
writes, one record per federation and server key) and refuses -- with its signed refusal
(:mod:`clinograph.secure.refusals`) -- a plan that presents an older head, a different entry
at the same position, no head after one was seen, or a later head it cannot prove extends the
anchored one: the plan must carry the audit entries between them (``audit.proof``,
:mod:`clinograph.secure.audit.consistency`), which must hash-link the anchored head to the new
one. So a fork -- a server rolled back to an earlier copy that then ran past the anchored
sequence number -- is refused whatever number it reaches. Rounds are the replay guard's
(:meth:`HospitalClient._check_fresh`), which the anchor seeds after a hospital restart.

The anchor is written *before* training (write-ahead): a hospital that trained for a round the
server then lost (a crash, an aborted round) has that round on record and refuses to train for
the same number again, across its own restarts too. The kept plan is the server's signed
statement; an operator can hand it to ``audit verify`` as an out-of-band head.

The anchor also keeps a copy of each refusal the hospital signs of a plan that passed this
check, or of a stage or round-end message of the round it anchored
(:meth:`HospitalAnchor.note_refusal`), and a later plan must prove that the server logged
it (its ``hospital_refused`` entry, or that of a later refusal naming it as missing, among the
proof's entries): otherwise :class:`RefusalOmitted` (SECURITY.md, "Audited artefacts").

Guarantees: a server rolled back behind any hospital's last plan is refused by that hospital
with a reason naming both heads. Does not guarantee: detection of a rollback no hospital has
seen past (roll back before any plan was sent after the copy), or anything if the hospital's
own state directory is rolled back with it.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from clinograph.secure.audit.consistency import PROOF, PROOF_FROM, check_extension
from clinograph.secure.messages import RoundPlan
from clinograph.secure.runtime.journal import decode_state, encode_state
from clinograph.secure.wire import parse_envelope

from clinograph.core.errors import ClinographError, IntegrityError, ProtocolError
from clinograph.core.fileio import atomic_write, read_regular
from clinograph.core.identity import PublicIdentity

FILENAME = "audit_anchor.json"
FORMAT = "clinograph-anchor/1"
#: bound on the anchor file read back (a few records a federation, each a few hundred bytes)
MAX_ANCHOR_BYTES = 64 * 2**20
#: bound on a blob kept beside it (a global model or checkpoint; as an exported model's weights)
MAX_BLOB_BYTES = 2 * 2**30


class RollbackDetected(ProtocolError):
    """The server presents an older history than this hospital has seen (rolled back or forked)."""


class RefusalOmitted(ProtocolError):
    """The server's audit log, as a later plan proves it, lacks this hospital's signed refusal.
    ``owed``: the digests of the refusals missing (the refusal of this plan discloses them)."""

    def __init__(self, message: str, owed: tuple[str, ...] = ()):
        super().__init__(message)
        self.owed = owed


@dataclass(frozen=True)
class Anchor:
    """The latest plan a hospital verified for one federation and server key."""

    round: int
    audit_seq: int | None
    audit_head: str | None
    plan: bytes  # the signed plan envelope, as received


def _key(federation_id: str, server: PublicIdentity) -> str:
    return f"{federation_id}/{server.b64()}"


def _head(plan: RoundPlan) -> tuple[int | None, str | None]:
    seq, head = plan.options.get("audit.seq"), plan.options.get("audit.head")
    if isinstance(seq, bool) or not isinstance(seq, int) or not isinstance(head, str):
        return None, None
    return seq, head


class HospitalAnchor:
    """The anchors in one hospital's state directory (see the module docstring)."""

    def __init__(self, state_dir: Path, *, server: PublicIdentity):
        self.path = Path(state_dir) / FILENAME
        self.server = server
        self._records: dict[str, dict] = {}
        if self.path.exists():
            try:  # a regular file of bounded size, a JSON object of records (never a traceback)
                data = json.loads(read_regular(self.path, limit=MAX_ANCHOR_BYTES).decode("utf-8"))
                if not isinstance(data, dict) or data.get("format") != FORMAT or \
                        not isinstance(data.get("anchors"), dict):
                    raise ValueError("format")
                if not all(isinstance(r, dict) and isinstance(r.get("round"), int) for r in data["anchors"].values()):
                    raise ValueError("record")
                self._records = dict(data["anchors"])
            except (OSError, ValueError, RecursionError):
                raise IntegrityError(f"Audit anchor {self.path} is not a Clinograph anchor file; it was altered or "
                                     "is from another version. Restore it from the hospital's backup (deleting it "
                                     "gives up rollback detection for past rounds).") from None

    def get(self, federation_id: str) -> Anchor | None:
        """The latest plan this hospital verified for ``federation_id`` from this server key."""
        rec = self._records.get(_key(federation_id, self.server))
        if rec is None:
            return None
        return Anchor(round=int(rec["round"]), audit_seq=rec.get("audit_seq"), audit_head=rec.get("audit_head"),
                      plan=base64.b64decode(rec["plan"]))

    def check(self, plan: RoundPlan) -> None:
        """RollbackDetected unless ``plan`` (verified) comes after the anchored one."""
        last = self.get(plan.federation_id)
        if last is None:
            return
        seq, head = _head(plan)
        fix = ("Refused; nothing was trained. Fix (server operator): restore the server's latest audit directory and "
               "journal -- this hospital's audit_anchor.json holds the server-signed plan it last saw; check a copy "
               "with `clinograph audit verify`.")
        seen = f"round {last.round} at audit entry {last.audit_seq} ({(last.audit_head or '')[:12]}…)"
        if last.audit_seq is not None and seq is None:
            raise RollbackDetected(f"Plan for round {plan.round} of federation {plan.federation_id!r} carries no audit "
                                   f"head, but this hospital saw {seen}. {fix}")
        if seq is not None and last.audit_seq is not None:
            if seq < last.audit_seq or (seq == last.audit_seq and head != last.audit_head):
                raise RollbackDetected(
                    f"Plan for round {plan.round} of federation {plan.federation_id!r} presents audit entry {seq} "
                    f"({(head or '')[:12]}…), but this hospital already saw {seen}: the server's audit trail was "
                    f"rolled back to an earlier copy (or forked). {fix}")
            entries = []
            if seq > last.audit_seq:
                try:
                    entries = check_extension(anchored_seq=last.audit_seq, anchored_head=str(last.audit_head), seq=seq,
                                    head=str(head), proof=plan.options.get(PROOF),
                                    proof_from=plan.options.get(PROOF_FROM), server=self.server)
                except IntegrityError as exc:
                    raise RollbackDetected(
                        f"Plan for round {plan.round} of federation {plan.federation_id!r} presents audit entry {seq} "
                        f"({(head or '')[:12]}…), but does not prove it extends {seen}: {exc}. The server's audit "
                        f"trail forked from the one this hospital saw (or the plan is malformed). {fix}") from None
            self._check_refusals_logged(plan, entries)

    def _refusals(self, federation_id: str) -> list[dict]:
        rec = self._records.get(_key(federation_id, self.server), {})
        kept = rec.get("refusals", [])
        if not isinstance(kept, list) or not all(
                isinstance(r, dict) and type(r.get("round")) is int and isinstance(r.get("digest"), str)
                and len(r["digest"]) == 64 and isinstance(r.get("discloses", []), list)
                and all(isinstance(d, str) for d in r.get("discloses", [])) for r in kept):
            raise IntegrityError(f"Audit anchor {self.path} holds malformed refusal records; it was altered. Restore "
                                 "it from the hospital's backup.")
        return kept

    def _check_refusals_logged(self, plan: RoundPlan, entries: list) -> None:
        """RefusalOmitted unless every refusal this hospital signed for a plan of an earlier round
        (:meth:`note_refusal`) is in the audit proof ``entries`` (the entries after the anchored
        head, which every such refusal follows): its own ``hospital_refused`` entry, or the entry
        of a later refusal of this hospital that named it as omitted (a server that lost an entry
        honestly -- a crash, a refusal that came after the stage timed out -- is followed again
        once the log holds the hospital's signed statement that the entry is missing). An entry counts
        only with the envelope it names stored before it (an ``envelope`` entry of that digest from this
        hospital) and naming this hospital: an entry that names the digest alone leaves the refusal's
        words out of the log."""
        kept = self._refusals(plan.federation_id)
        logged = _logged_refusals(entries, kept)
        disclosed = {d for r in kept if r["digest"] in logged for d in r.get("discloses", [])}
        owed = [r for r in kept if r.get("logged_at") is None and r["round"] < plan.round
                and r["digest"] not in logged and r["digest"] not in disclosed]
        if owed:
            rounds = ", ".join(str(r["round"]) for r in owed)
            digests = ", ".join(f"{r['digest'][:16]}…" for r in owed)
            raise RefusalOmitted(
                f"Plan for round {plan.round} of federation {plan.federation_id!r}: the server's audit log, as this "
                f"plan proves it, does not hold the refusal(s) this hospital signed of the plan of round(s) {rounds} "
                f"(refusal digest(s) {digests}): the server left them out. Refused; nothing was trained. This "
                f"refusal names them, so a server that lost them in a crash is followed again once it logs this "
                f"one; this hospital keeps its refusals in {self.path.name} for the federation's auditor.",
                owed=tuple(r["digest"] for r in owed))

    def note_refusal(self, federation_id: str, round_: int, refusal: bytes, *, discloses: tuple[str, ...] = ()) -> None:
        """Keep a copy of the signed refusal (an envelope) this hospital sent for the plan of
        ``round_`` -- a plan that verified and extended the anchored history -- so that a later plan
        must prove the server logged it (:meth:`check`); ``discloses``: the digests of earlier
        refusals it names as left out (:class:`RefusalOmitted`). Nothing is kept before a plan of
        the federation was anchored (there is no history to prove it in)."""
        key = _key(federation_id, self.server)
        if key not in self._records:
            return
        digest = parse_envelope(refusal).digest()
        kept = [r for r in self._refusals(federation_id) if r["digest"] != digest]
        kept.append({"round": int(round_), "digest": digest, "logged_at": None, "discloses": list(discloses),
                     "envelope": base64.b64encode(refusal).decode("ascii")})
        self._records[key]["refusals"] = kept
        atomic_write(self.path, json.dumps({"format": FORMAT, "anchors": self._records}, indent=1,
                                          sort_keys=True).encode())

    def keep(self, plan: RoundPlan, plan_bytes: bytes) -> None:
        """Anchor ``plan`` (call after :meth:`check`, before training); atomic and durable."""
        seq, head = _head(plan)
        key = _key(plan.federation_id, self.server)
        old = self._records.get(key, {})
        if old.get("refusals"):  # every one of an earlier round is in the log up to this plan's head (check)
            old = {**old, "refusals": [r if r.get("logged_at") is not None or r["round"] >= plan.round
                                       else {**r, "logged_at": seq} for r in self._refusals(plan.federation_id)]}
        self._records[key] = {"round": plan.round, "audit_seq": seq, "audit_head": head,
                              "plan": base64.b64encode(plan_bytes).decode("ascii"),
                              **{k: v for k, v in old.items() if k not in ("round", "audit_seq", "audit_head", "plan")}}
        atomic_write(self.path, json.dumps({"format": FORMAT, "anchors": self._records}, indent=1,
                                          sort_keys=True).encode())

    def keep_model(self, federation_id: str, state: Mapping[str, np.ndarray]) -> None:
        """Keep the global model this hospital just loaded (resumed after a restart)."""
        self.keep_blob(federation_id, "model", encode_state(sorted(state), state), prefix="global_model")

    def keep_blob(self, federation_id: str, label: str, data: bytes, *, prefix: str | None = None) -> None:
        """Keep ``data`` beside the anchor of ``federation_id`` under ``label``, its SHA-256 in the
        anchor record (checked by :meth:`blob`); nothing before a plan of it was anchored."""
        key = _key(federation_id, self.server)
        if key not in self._records:
            return
        name = f"{prefix or label}.{hashlib.sha256(key.encode()).hexdigest()[:16]}.bin"
        atomic_write(self.path.parent / name, data)
        self._records[key].update({label: name, f"{label}_sha256": hashlib.sha256(data).hexdigest()})
        atomic_write(self.path, json.dumps({"format": FORMAT, "anchors": self._records}, indent=1,
                                          sort_keys=True).encode())

    def blob(self, federation_id: str, label: str, *, what: str) -> bytes | None:
        """What :meth:`keep_blob` kept under ``label`` (None: nothing); IntegrityError if altered."""
        rec = self._records.get(_key(federation_id, self.server), {})
        if label not in rec:
            return None
        name = str(rec[label])
        try:  # a plain file beside the anchor, of bounded size (a record naming /dev/zero reads nothing)
            data = b"" if Path(name).name != name else read_regular(self.path.parent / name, limit=MAX_BLOB_BYTES)
        except OSError:
            data = b""
        if hashlib.sha256(data).hexdigest() != rec.get(f"{label}_sha256"):
            raise IntegrityError(f"The {what} kept in {self.path.parent} is missing or altered. Restore the "
                                 "hospital's state directory from its backup.")
        return data

    def model(self, federation_id: str, *, names: list[str]) -> dict[str, np.ndarray] | None:
        """The kept global model (None if none was kept); IntegrityError if it was altered."""
        data = self.blob(federation_id, "model", what="global model")
        if data is None:
            return None
        state = decode_state(data)
        if sorted(state) != sorted(names):
            raise IntegrityError(f"The global model kept in {self.path.parent} has other modules than this "
                                 "hospital's model; the state directory belongs to another model version.")
        return state

    def __repr__(self) -> str:
        return f"HospitalAnchor(path={str(self.path)!r}, federations={len(self._records)})"


def _logged_refusals(entries: list, kept: list[dict]) -> set[str]:
    """The digests of this hospital's kept refusals that ``entries`` log in full: a ``hospital_refused``
    entry naming the digest and this hospital (the kept envelope's sender), after an ``envelope`` entry
    that stored that envelope (kind ``hospital_refusal``, that digest, that sender) with its signature
    recorded as valid under this hospital's enrolled key -- what ``clinograph audit verify`` requires of
    it (an ``invalid`` or ``unknown_sender`` copy is not the hospital's word in the log: an auditor
    reads it as a forgery, and the verifier reports the ``hospital_refused`` entry that names it)."""
    me = {r["digest"]: _sender(r) for r in kept}
    stored: set[str] = set()
    logged: set[str] = set()
    for e in entries:
        p = e.payload
        if e.kind == "envelope" and p.get("kind") == "hospital_refusal" and me.get(p.get("digest")) == p.get("sender") \
                and p.get("signature") == "valid":
            stored.add(p["digest"])
        elif e.kind == "hospital_refused" and p.get("refusal_sha256") in stored and p.get("signed") is True \
                and p.get("client") == me.get(p["refusal_sha256"]):
            logged.add(p["refusal_sha256"])
    return logged


def _sender(record: dict) -> str | None:
    """The hospital that signed a kept refusal (None: a record without its envelope -- never logged)."""
    try:
        return parse_envelope(base64.b64decode(record["envelope"], validate=True)).sender
    except (KeyError, TypeError, ValueError, ClinographError):
        return None
