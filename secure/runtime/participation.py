"""Who did what in a round, by name, and how a run ended: the round loop's audit records.

:class:`RoundBook` follows one round through the loop (:mod:`.loop`): who was invited, who
answered the plan, who dropped at which stage and why (the transport's words, which state the
wait: ``no reply to 'stage' within 60 s (timeout 60 s)``), who refused and why. A hospital's
refusal arrives as a signed :class:`~clinograph.secure.refusals.HospitalRefusal` in the
``refusal`` part of its answer; the book checks it against the enrolled key, this round and
the message sent, keeps the envelope and writes a ``hospital_refused`` entry. When the round
closes (or aborts) it writes one ``round_participation`` entry. :func:`end_run` writes the
run's ``release`` (the model hospitals were given, published as an artefact) and
``run_ended`` entries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from clinograph.core.errors import ClinographError, ProtocolError

from ..refusals import REFUSAL_PART, check_refusal
from ..server import FederationServer

EventSink = Callable[[str, Mapping[str, Any]], None]
MAX_REASON = 4000  # the audit kinds' bound on a reason


def _cut(text: str) -> str:
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 1] + "…"


@dataclass
class RoundBook:
    """One round's participation, filled in by the round loop (see the module docstring)."""

    server: FederationServer
    round: int
    invited: tuple[str, ...]
    event: EventSink
    legacy: dict[str, str]  # RoundOutcome.dropped: name -> "stage k: reason" (refusals included)
    answered: list[str] = field(default_factory=list)
    dropped: dict[str, dict[str, str]] = field(default_factory=dict)
    refused: dict[str, dict[str, Any]] = field(default_factory=dict)

    def drop(self, name: str, stage: str, reason: str) -> None:
        """``name`` went silent or failed at ``stage`` (first reason wins)."""
        if name in self.dropped or name in self.refused:
            return
        self.dropped[name] = {"stage": stage, "reason": _cut(reason)}
        self.legacy.setdefault(name, reason if stage == "plan" else f"{stage}: {reason}")

    def screen(self, stage: str, label: str, answers: dict[str, dict[str, bytes]], failed: Mapping[str, str],
               sent: Mapping[str, Mapping[str, bytes]]) -> None:
        """Take the signed refusals out of ``answers`` and book every failure as a drop."""
        for name, reason in sorted(failed.items()):
            self.drop(name, label, reason)
        for name in sorted(answers):
            if REFUSAL_PART in answers[name]:
                data = answers.pop(name)[REFUSAL_PART]
                self._refusal(name, stage, label, data, sent.get(name, {}).get("data"))

    def _refusal(self, name: str, stage: str, label: str, data: bytes, sent: bytes | None) -> None:
        key = self.server.enrolled.get(name)
        try:
            if key is None:
                raise ProtocolError(f"{name!r} is not enrolled")
            refusal = check_refusal(data, hospital=name, key=key, round_=self.round, stage=stage, sent=sent)
        except ClinographError as exc:
            self.drop(name, label, f"sent a refusal that does not verify ({type(exc).__name__}: {exc})")
            return
        digest = self.server.audit.store_envelope(data, kind="hospital_refusal", sender=name)
        reason = _cut(f"{refusal.error}: {refusal.reason}")
        self.server.audit.record("hospital_refused", {
            "round": self.round, "stage": label, "client": name, "reason": reason, "signed": True,
            "final": refusal.final, "refusal_sha256": digest})
        self.refused[name] = {"stage": label, "reason": reason, "signed": True, "final": refusal.final}
        self.legacy.setdefault(name, f"refused at {label}: {reason}")
        self.event("refused", {"round": self.round, "hospital": name, "stage": label, "reason": reason,
                               "final": refusal.final})

    @property
    def final(self) -> dict[str, str]:
        """Hospitals whose refusal ends their part in the run (budget spent) -> reason."""
        return {n: r["reason"] for n, r in self.refused.items() if r["final"]}

    def record(self, *, contributed: tuple[str, ...], rejected: Mapping[str, str], abort: str | None) -> None:
        """Write the round's ``round_participation`` entry."""
        self.server.audit.record("round_participation", {
            "round": self.round, "secure_mode": self.server.mode.name,
            "outcome": "aborted" if abort is not None else "aggregated",
            "invited": sorted(self.invited), "answered": sorted(self.answered), "contributed": sorted(contributed),
            "dropped": dict(sorted(self.dropped.items())), "refused": dict(sorted(self.refused.items())),
            "rejected": {n: _cut(r) for n, r in sorted(rejected.items())},
            **({"abort_reason": _cut(abort)} if abort is not None else {})})


def end_run(server: FederationServer, *, status: str, reason: str, rounds_completed: int,
            rounds_planned: int) -> dict[str, Any]:
    """Write ``release`` (if a round aggregated) and ``run_ended``; returns the latter's payload.

    No event is emitted: a failed run's last event stays the ``round_aborted`` that ended it;
    the caller (the ServerApp) reports the end from this payload.
    """
    if server.history:
        last = server.history[-1]
        model_sha = None
        if server.state is not None:
            model = server.global_model_bytes()
            model_sha = server.audit.publish("release/global_model.json", model, kind="released_model",
                                             meta={"round": last.round})
        server.audit.record("release", {"round": last.round, "secure_mode": server.mode.name,
                                        "global_state_digest": last.global_state_digest, "model_sha256": model_sha,
                                        **({"ciphertext_sha256": last.ciphertext_sha256}
                                           if last.ciphertext_sha256 else {})})
    payload = {"status": status, "reason": _cut(reason), "rounds_completed": rounds_completed,
               "rounds_planned": rounds_planned}
    server.audit.record("run_ended", payload)
    return payload
