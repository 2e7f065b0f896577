"""One hospital across a whole federation run: the client of the candidate being trained, and the
one the federation kept (:mod:`clinograph.secure.runtime.run`).

A :class:`FederationMember` is the hospital's :class:`~clinograph.secure.runtime.RoundParticipant`
in every deployment and simulation. With one candidate it is its :class:`~.client.HospitalClient`
under another name. With several (``[selection] candidates`` and ``restarts`` of the hospital's
own config), the server's signed ``run/start`` names the next one: the hospital trains it only if
its own config lists a candidate of that name with the same overrides (digest), so a server
cannot make a hospital train anything its operator did not configure. ``run/chosen`` names the
kept candidate; from then on :attr:`client` (prediction, export) is that candidate's.

Before the candidates, the run's set-up sums (``setup/sum``, ``setup/result``; :mod:`.setup`) go
to the member's :class:`~.setup.HospitalSetup`, and so do the plans, stages and model of each
sum's round; the candidates it builds afterwards use what the sums derived (the rescaled table
and dictionary, the shared feature list). ``run/start`` is refused while a sum the hospital's
own config asks for has not run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clinograph.secure.runtime.models import RunChosen, RunStart, overrides_digest, run_id
from clinograph.secure.runtime.participant import part
from clinograph.secure.wire import open_envelope, parse_envelope

from clinograph.core.errors import IntegrityError, ProtocolError
from clinograph.core.fileio import read_regular
from clinograph.core.identity import Identity, PublicIdentity

from .client import HospitalClient

if TYPE_CHECKING:
    from .setup import HospitalSetup

POSITION_FORMAT = "clinograph-member-position-v1"


@dataclass(frozen=True)
class MemberCandidate:
    """A candidate as the hospital knows it: name, canonical overrides JSON, and a builder of its
    client: ``build(federation_id, rounds)`` (``rounds``: the run's planned training rounds from
    the signed ``run/start``, None when the server sent none)."""

    name: str
    overrides: str
    build: Callable[[str, int | None], HospitalClient]


def with_horizon(config: Any, rounds: int | None) -> Any:
    """``config`` for a run of ``rounds`` training rounds: under DP, σ is calibrated for the plan's
    rounds when the hospital set no ``[privacy] planned_rounds``; a hospital that calibrated for
    fewer refuses (its budget would run out before the run ends).

    Raises:
        PrivacyError: ``planned_rounds`` < ``rounds`` under DP.
    """
    from clinograph.core.errors import PrivacyError

    p = config.privacy
    if rounds is None or not p.enabled:
        return config
    if p.planned_rounds is None:
        return config.model_copy(update={"privacy": p.model_copy(update={"planned_rounds": int(rounds)})})
    if p.planned_rounds < rounds:
        raise PrivacyError(f"The server plans {rounds} training rounds; this hospital's [privacy] planned_rounds = "
                           f"{p.planned_rounds} calibrates its DP noise for fewer, so its ε budget would run out by "
                           f"round {p.planned_rounds}. Raise planned_rounds (or remove it: the plan's rounds are used), "
                           "or ask the operator for fewer rounds.")
    return config


def canonical(overrides: Mapping[str, Any]) -> str:
    """The canonical JSON of a candidate's overrides (sorted keys): what both sides hash."""
    return json.dumps(overrides, sort_keys=True, default=str)


class ActiveClient:
    """What a participant of several clients reads through to them: :attr:`active` (the client the
    current run's messages go to) and :attr:`client` (the one whose model the hospital uses)."""

    active: HospitalClient
    client: HospitalClient

    @property
    def task(self) -> Any:
        return self.client.task

    @property
    def last(self) -> Any:
        return self.active.last

    @property
    def last_train_seconds(self) -> float:
        return self.active.last_train_seconds

    def decrypted_result(self) -> Any:
        """In modes where the server never sees the sum (ckks), the aggregate the active client decrypted."""
        return self.active.decrypted_result()


class FederationMember(ActiveClient):
    """The hospital's participant for a whole run (module docstring)."""

    def __init__(self, *, identity: Identity, server: PublicIdentity, federation_id: str,
                 candidates: Sequence[MemberCandidate], setup: HospitalSetup | None = None,
                 position: Path | None = None, run_key: str | None = None):
        """``setup``: the hospital's set-up sums (None: its config asks for none). ``position``: a file
        where the member keeps which candidate it trains and which was chosen, so that after a
        restart within the same run (``run_key``, e.g. the Flower run id) it takes its place back;
        each candidate's client takes back its own state from the anchor (:mod:`.anchor`)."""
        if not candidates:
            raise ProtocolError("A federation member needs at least one candidate model.")
        self.name = identity.name
        self.identity = identity
        self.server = server
        self.federation_id = federation_id
        self.candidates = {c.name: c for c in candidates}
        self._order = [c.name for c in candidates]
        #: candidate name -> its client, once built (at ``run/start``, or at the first message
        #: of a server that sends none)
        self.clients: dict[str, HospitalClient] = {}
        self._active = candidates[0].name
        self.chosen: str | None = candidates[0].name if len(candidates) == 1 else None
        self.setup = setup
        self._rounds: dict[str, int | None] = {}  # candidate -> the run's planned rounds from its run/start
        self._position, self._run_key = position, run_key
        self._lost_setup = False  # restarted after set-up sums, whose results are not kept
        self._take_position()

    def __repr__(self) -> str:
        return f"FederationMember(name={self.name!r}, candidates={self._order!r})"

    @property
    def active(self) -> HospitalClient:
        """The client of the candidate being trained."""
        return self._client(self._active)

    @property
    def client(self) -> HospitalClient:
        """The client whose model this hospital uses: the kept candidate's once chosen, else the active one."""
        return self._client(self.chosen) if self.chosen is not None else self.active

    # -- what simulations and the SDK read through the member -------------------------------
    @property
    def plan(self) -> Any:
        """The last plan the active candidate's client verified (None before it was built: reading
        it builds nothing)."""
        client = self.clients.get(self._active)
        return client.plan if client is not None else None

    @property
    def last_planned_round(self) -> int | None:
        """The round of the last plan this hospital answered -- the set-up sum's client while a sum
        runs, else the active candidate's -- without building a candidate (None: none yet)."""
        setup = self.setup.client if self.setup is not None else None
        client = setup if setup is not None else self.clients.get(self._active)
        return client.last_planned_round if client is not None else None

    @property
    def outgoing(self) -> list[bytes]:
        return [b for c in self.clients.values() for b in c.outgoing]

    def predict_table(self, table):  # noqa: ANN001, ANN201 - a PatientTable -> np.ndarray
        return self.client.predict_table(table)

    # -- RoundParticipant ------------------------------------------------------------------
    def on_plan(self, plan: bytes) -> tuple[bytes, bytes]:
        return self._round_client().on_plan(plan)

    def on_stage(self, data: bytes) -> bytes | None:
        return self._round_client().on_stage(data)

    def on_refused(self, stage: str, parts: Mapping[str, bytes], refusal: bytes) -> None:
        """The refusal the transport sealed goes to the client whose plan it refused (its anchor keeps it)."""
        keep = getattr(self._round_client(), "on_refused", None)
        if callable(keep):
            keep(stage, parts, refusal)

    def on_round_end(self, global_model: bytes | None) -> bytes | None:
        if self.setup is not None and self.setup.client is not None:
            return self.setup.on_round_end(global_model)
        return self.active.on_round_end(global_model)

    def on_setup(self, step: str, parts: Mapping[str, bytes]) -> dict[str, bytes]:
        if step in ("setup/sum", "setup/result"):
            if self.setup is None:
                raise ProtocolError(f"{step}: this hospital's config asks for no set-up sum ([scaling] source = "
                                    "\"dictionary\", no [model] features = \"shared\"). Use the same hospital.toml at "
                                    "every hospital and at `clinograph model init`.")
            return self.setup.on_setup(step, parts)
        if step == "run/start":
            return self._start(part(parts, "data", "setup"))
        if step == "run/chosen":
            return self._chosen(part(parts, "data", "setup"))
        return self.active.on_setup(step, parts)

    # -- helpers -----------------------------------------------------------------------------
    def _round_client(self) -> HospitalClient:
        """The client a round's messages go to: a set-up sum's share while one runs, else the active candidate's."""
        if self.setup is not None and self.setup.client is not None:
            return self.setup.client
        return self.active

    def _take_position(self) -> None:
        """After a restart within the same run: the candidate trained and the one chosen."""
        if self._position is None or not self._position.exists():
            return
        try:
            data = json.loads(read_regular(self._position, limit=2**20).decode("utf-8"))  # a small JSON object
            ours = data.get("format") == POSITION_FORMAT and data.get("run") == self._run_key and \
                data.get("federation_id") == self.federation_id
            if not ours:
                return
            if data["active"] not in self.candidates or (data["chosen"] is not None and
                                                         data["chosen"] not in self.candidates):
                raise ValueError("candidate")
            rounds = {str(k): (None if v is None else int(v)) for k, v in dict(data["rounds"]).items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            raise IntegrityError(f"{self._position} is not this hospital's run position (altered, or written by "
                                 "another version). Delete it to sit out the rest of this run.") from None
        self._active, self.chosen, self._rounds = data["active"], data["chosen"], rounds
        self._lost_setup = self.setup is not None

    def _keep_position(self) -> None:
        if self._position is None:
            return
        from clinograph.core.fileio import atomic_write

        atomic_write(self._position, json.dumps({"format": POSITION_FORMAT, "run": self._run_key,
                                                 "federation_id": self.federation_id, "active": self._active,
                                                 "chosen": self.chosen, "rounds": self._rounds}, sort_keys=True))

    def _client(self, name: str, rounds: int | None = None) -> HospitalClient:
        if self._lost_setup:
            raise ProtocolError(f"Hospital {self.name!r} restarted after this run's set-up sums, whose results it does "
                                "not keep; it sits out the rest of this run and takes part again in the next one.")
        rounds = rounds if rounds is not None else self._rounds.get(name)
        if name not in self.clients:
            rid = run_id(self.federation_id, name, count=len(self._order))
            self.clients[name] = self.candidates[name].build(rid, rounds)
        return self.clients[name]

    def _start(self, data: bytes) -> dict[str, bytes]:
        msg = open_envelope(parse_envelope(data), sender=self.server, model=RunStart)
        if msg.federation_id != self.federation_id:
            raise ProtocolError(f"run/start for federation {msg.federation_id!r}; this hospital is in "
                                f"{self.federation_id!r}.")
        if self.setup is not None and self.setup.missing:
            raise ProtocolError(f"run/start before the set-up sum(s) this hospital's config asks for "
                                f"({', '.join(self.setup.missing)}): it trains only on the scales and features its "
                                "operator configured. Write the initial model with `clinograph model init` from the same "
                                "hospital.toml (it lists the sums).")
        mine = self.candidates.get(msg.candidate)
        if mine is None or overrides_digest(mine.overrides) != msg.overrides_sha256:
            listed = ", ".join(self._order)
            why = "is not one" if mine is None else "has other overrides than the one"
            raise ProtocolError(f"Candidate {msg.candidate!r} {why} this hospital's config lists ({listed}); it trains "
                                "only the candidates its own [selection] names. Use the same hospital.toml "
                                "[selection] at every hospital and at `clinograph model init`.")
        if msg.count != len(self._order) or msg.run_id != run_id(self.federation_id, msg.candidate, count=msg.count):
            raise ProtocolError(f"run/start names run {msg.run_id!r} of {msg.count} candidate(s); this hospital's "
                                f"config lists {len(self._order)}. Use the same [selection] everywhere.")
        self._client(msg.candidate, msg.rounds)
        self._active = msg.candidate
        self._rounds[msg.candidate] = msg.rounds
        self._keep_position()
        return {"ok": b"1"}

    def _chosen(self, data: bytes) -> dict[str, bytes]:
        msg = open_envelope(parse_envelope(data), sender=self.server, model=RunChosen)
        if msg.federation_id != self.federation_id or msg.candidate not in self.clients:
            raise ProtocolError(f"run/chosen names candidate {msg.candidate!r} of federation {msg.federation_id!r}, "
                                "which this hospital did not train.")
        self.chosen = msg.candidate
        self._active = msg.candidate
        self._keep_position()
        return {"ok": b"1"}


def member_for(*, identity: Identity, server: PublicIdentity, federation_id: str, candidates: Sequence[tuple[str, Mapping[str, Any], Any]],
               build: Callable[..., HospitalClient]) -> FederationMember:
    """A member whose candidate ``(name, overrides, config)`` is built as
    ``build(config=config, federation_id=...)``."""
    return FederationMember(identity=identity, server=server, federation_id=federation_id, candidates=[
        MemberCandidate(name=n, overrides=canonical(o),
                        build=lambda fid, rounds, cfg=cfg: build(config=with_horizon(cfg, rounds), federation_id=fid))
        for n, o, cfg in candidates])
