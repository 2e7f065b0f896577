"""What the round loop journals at each stage boundary, and how a restarted server resumes.

:mod:`.journal` is the store and states the recovery rule; this module maps the live objects
(:class:`~clinograph.secure.server.FederationServer`, the loop's :class:`RunState`) to a
:class:`~.journal.Boundary` and back. :func:`~.loop.run_rounds` calls :func:`save` after every
stage and :func:`resume` once before its first round.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from clinograph.core.errors import ConfigError, IntegrityError

from ..messages import RoundResult
from ..server import FederationServer
from .journal import FIX as _FIX
from .journal import STATELESS_STRATEGIES, Boundary, Journal, JournalKey, decode_state, encode_state
from .liveness import Liveness

EventSink = Callable[[str, Mapping[str, Any]], None]
RESTART_REASON = "server restart"


@dataclass
class RunState:
    """The round loop's own state across rounds (journalled with the server's)."""

    liveness: Liveness | None = None
    completed: int = 0
    retired: dict[str, str] = field(default_factory=dict)  # out of the run: final refusals
    pending: dict[str, bytes] = field(default_factory=dict)  # models still owed to hospitals
    control: Any = None  # the run's RunControl (journalled through to_dict / load)
    scored: int = 0  # evaluation-only rounds the federation ran (not counted in the planned rounds)
    score_done: bool = False  # this run's evaluation-only round ran
    stopped: bool = False  # the stop rule ended this run's training
    runs: int = 1  # the federation's runs in this journal (1 + extensions)
    attribution: Any = None  # the loop's group testing (:mod:`.attribution`), kept across a paused run's calls

    @property
    def trained(self) -> int:
        """Training rounds completed in the whole federation (what ``rounds`` counts)."""
        return self.completed - self.scored
    _state_cache: tuple[object, str, bytes] | None = None  # (the state object itself, sha256, blob)
    _key: tuple[object, JournalKey] | None = None  # (the server's identity, the journal key derived from it)


def check_journalable(server: FederationServer) -> None:
    """ConfigError unless every piece of server state between rounds can be journalled."""
    strategy = server.strategy
    if strategy.name not in STATELESS_STRATEGIES and not (
            callable(getattr(strategy, "state_dict", None)) and callable(getattr(strategy, "load_state_dict", None))):
        raise ConfigError(f"Strategy {strategy.name!r} keeps server-side state between rounds that the crash journal "
                          f"cannot save (no state_dict/load_state_dict). Journalled strategies: "
                          f"{', '.join(sorted(STATELESS_STRATEGIES))}; run without a journal or use one of them.")
    if strategy.name not in STATELESS_STRATEGIES:
        strategy.state_dict()  # type: ignore[attr-defined]  # a strategy may refuse (ConfigError) before round 1


def _state_blob(server: FederationServer, run: RunState) -> tuple[str | None, dict[str, bytes]]:
    state = server.state
    if state is None:
        return None, {}
    cached = run._state_cache
    if cached is None or cached[0] is not state:  # the server replaces its state object at each close
        data = encode_state([m.name for m in server.spec.shared], state)
        cached = (state, hashlib.sha256(data).hexdigest(), data)
        run._state_cache = cached
    return cached[1], {cached[1]: cached[2]}


def _journal_key(server: FederationServer, run: RunState) -> JournalKey:
    if run._key is None or run._key[0] is not server.identity:
        run._key = (server.identity, JournalKey(server.identity))
    return run._key[1]


def save(journal: Journal, server: FederationServer, run: RunState, *, stage: str, open_round: int | None,
         run_ended: bool = False) -> None:
    """Journal the server and loop state at a boundary (one transaction, MACed under the key the
    server derives from its signing identity)."""
    sha, blobs = _state_blob(server, run)
    pending: dict[str, str] = {}
    for name, model in sorted(run.pending.items()):
        digest = hashlib.sha256(model).hexdigest()
        pending[name] = digest
        blobs[digest] = model
    head = getattr(server.audit, "head", None)
    strategy = server.strategy.state_dict() if callable(getattr(server.strategy, "state_dict", None)) else None
    live = run.liveness
    journal.save(Boundary(
        federation_id=server.federation_id, spec_digest=server.spec.digest(), secure_mode=server.mode.name,
        strategy_name=server.strategy.name, stage=stage, round=server.round,
        open_round=open_round, state=sha, history=[r.model_dump_json() for r in server.history],
        ledgers=server.ledger_view(), strategy=strategy, completed=run.completed, retired=dict(run.retired),
        liveness=None if live is None else {"missed": dict(live.missed), "suspended": dict(live.suspended)},
        pending=pending, audit_seq=None if head is None else int(head.seq),
        audit_hash=None if head is None else str(head.hash), run_ended=run_ended,
        control=None if run.control is None else run.control.to_dict(), scored=run.scored,
        score_done=run.score_done, stopped=run.stopped, runs=run.runs),
        key=_journal_key(server, run), blobs=blobs)


def resume(journal: Journal, server: FederationServer, run: RunState, *, event: EventSink,
           rounds: int | None = None) -> Boundary | None:
    """Restore ``server`` and ``run`` from the journal's last boundary (None: a new journal).

    **Authenticated**: every boundary carries a MAC under a key the server derives from its own
    signing identity (:class:`~.journal.JournalKey`), chained to the boundary before and covering
    the audit head it records. Before anything is restored, the whole chain is checked, the
    audit trail must hold that head, and what the trail holds after it must be what a crash right
    after that boundary can leave (no later round's plan, no other round's aggregate): so an
    altered journal, one from another server key, and an older copy (or one that lost its newest
    boundaries, e.g. its ``-wal`` file) are refused. A journal with no boundary beside an audit
    trail that holds round plans of this federation is refused too (it was lost or truncated; a
    new run there would restart at round 0 on the same trail); a new journal gets a ``start``
    boundary before the first plan, so this never refuses a genuine crash.

    A round open at that boundary is aborted and audited (``round_aborted``, reason ``server
    restart``); its number is spent. The abort is journalled at once, so a second crash does not
    audit it twice.

    **Extending an ended federation**: when the journal's run has ended and ``rounds`` (the
    federation's total training rounds) is more than it ran, the federation goes on: same id,
    keys, hospitals, global model, ledgers and round numbering, as a new run of the same audit
    trail, linked to the previous one by a ``run_extended`` entry (the previous run's last audit
    entry and round counts). The new run selects among its own rounds (its first scored model is
    the previous run's last global model) and ends with its own scoring round and release.

    Raises:
        ConfigError: the journal belongs to another federation or model, or its run has ended and
            ``rounds`` asks for no more than it ran.
        IntegrityError: the journal does not authenticate under this server's key, is older than
            the audit trail, is empty beside a trail with rounds of this federation, holds state
            that does not validate; or the audit trail does not hold the head the journal recorded.
    """
    if journal.empty():
        _check_new_journal(journal, server)
        save(journal, server, run, stage="start", open_round=None)  # before any plan (see above)
        return None
    seen = journal.peek()  # not authenticated: only to name another run's journal clearly
    if seen is not None:
        _check_same_run(journal, server, seen)
    b = journal.latest(key=_journal_key(server, run))
    if b is None:  # pragma: no cover - empty() said otherwise
        return None
    _check_same_run(journal, server, b)
    _check_head(journal, server, b)
    _check_after_head(journal, server, b)
    trained = b.completed - b.scored
    if b.run_ended and (rounds is None or rounds <= trained):
        raise ConfigError(f"Journal {journal.path}: the federation's run has ended after {trained} training round(s); "
                          f"{'nothing to resume' if rounds is None else f'rounds = {rounds} asks for no more'}. To go "
                          f"on, run again with rounds > {trained} (the federation's total, e.g. --run-config "
                          f"\"rounds={trained + 5}\"): the same journal and audit directory continue it.")
    _restore(journal, server, run, b)
    if b.run_ended:  # an extension: a new run of the same federation (see the docstring)
        run.score_done, run.stopped, run.runs = False, False, b.runs + 1
        payload = {"previous_audit_seq": b.audit_seq, "previous_audit_hash": b.audit_hash, "run": run.runs,
                   "rounds_completed": trained, "rounds_planned": int(rounds or 0), "next_round": b.round}
        server.audit.record("run_extended", payload)
        event("run_extended", payload)
        save(journal, server, run, stage="extended", open_round=None)
        return b
    if b.open_round is not None:
        reason = (f"{RESTART_REASON}: round {b.open_round} was open (last boundary: {b.stage}) when the server "
                  "stopped; nothing of it was applied and it is not counted. The run goes on with a new round "
                  "from the last closed round's state.")
        server.audit.record("round_aborted", {"round": b.open_round, "reason": reason})
        event("round_aborted", {"round": b.open_round, "reason": reason})
        server.round = b.open_round + 1  # the number is spent: hospitals refuse a second plan for it
        save(journal, server, run, stage="aborted", open_round=None)
    # training rounds, as run_ended and run_extended count them (run.completed also counts a scoring round)
    event("resumed", {"round": server.round, "rounds_completed": run.trained, "stage": b.stage})
    return b


def _check_same_run(journal: Journal, server: FederationServer, b: Boundary) -> None:
    mine = (server.federation_id, server.spec.digest(), server.mode.name, server.strategy.name)
    theirs = (b.federation_id, b.spec_digest, b.secure_mode, b.strategy_name)
    if mine != theirs:
        names = ("federation id", "model spec", "secure mode", "strategy")
        diff = ", ".join(f"{n} {t!r} (this server: {m!r})" for n, m, t in zip(names, mine, theirs, strict=True)
                         if m != t)
        raise ConfigError(f"Journal {journal.path} belongs to another run: its {diff}. Resume with the run's own "
                          "server.toml, or give a new run its own journal file.")


def _restore(journal: Journal, server: FederationServer, run: RunState, b: Boundary) -> None:
    """Restore from an authenticated boundary; state that does not validate is an IntegrityError
    naming the journal (never a raw validation traceback)."""
    try:
        state = decode_state(journal.blob(b.state)) if b.state is not None else None
        history = [RoundResult.model_validate_json(h) for h in b.history]
        server.restore(round_=b.round, state=state, history=history, ledgers=b.ledgers)
        if b.strategy is not None:
            server.strategy.load_state_dict(b.strategy)  # type: ignore[attr-defined]
        if not b.run_ended:
            if run.control is not None and b.control is not None:
                run.control.load(b.control)
            pending = {n: journal.blob(sha) for n, sha in b.pending.items()}
            if run.liveness is not None and b.liveness is not None:
                missed = {str(k): int(v) for k, v in b.liveness["missed"].items()}
                suspended = {str(k): int(v) for k, v in b.liveness["suspended"].items()}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        what = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}" if str(exc) else type(exc).__name__
        raise IntegrityError(f"Journal {journal.path}: its last boundary ({b.stage}, round {b.round}) authenticates "
                             f"but its state does not validate ({what}). The server's state cannot be restored "
                             f"from it. {_FIX}") from None
    run.completed, run.retired = b.completed, dict(b.retired)
    run.scored, run.score_done, run.stopped, run.runs = b.scored, b.score_done, b.stopped, b.runs
    if not b.run_ended:
        run.pending = pending
        if run.liveness is not None and b.liveness is not None:
            run.liveness.missed, run.liveness.suspended = missed, suspended


def _check_new_journal(journal: Journal, server: FederationServer) -> None:
    """A journal with no boundary is new only if the audit trail holds no round of this federation."""
    facts = getattr(server.audit, "facts", None)
    if not callable(facts):
        return
    federation, planned = None, []
    for f in facts(-1):
        if f.kind == "manifest":
            federation = f.federation_id
        elif f.kind == "round_plan" and federation == server.federation_id and f.round is not None:
            planned.append(f.round)
    if planned:
        raise IntegrityError(
            f"Journal {journal.path} holds no boundary, but the audit trail in {getattr(server.audit, 'directory', '?')} "
            f"already holds {len(planned)} round plan(s) of federation {server.federation_id!r} (rounds "
            f"{min(planned)}..{max(planned)}): the journal was lost, truncated (its -wal file lost) or replaced by a "
            f"new one, and a new journal would restart the run at round 0 on the same audit trail. {_FIX}")


def _check_head(journal: Journal, server: FederationServer, b: Boundary) -> None:
    """The audit trail holds the head the journal recorded (else the trail is behind the journal)."""
    hash_at = getattr(server.audit, "hash_at", None)
    if b.audit_seq is None or not callable(hash_at):
        return
    found = hash_at(b.audit_seq)
    if found != b.audit_hash:
        raise IntegrityError(
            f"Journal {journal.path} was written at audit entry {b.audit_seq} ({str(b.audit_hash)[:12]}…), which this "
            f"audit trail {'holds with another hash' if found else 'does not reach'}: the audit directory was "
            "replaced or rolled back behind the journal. Restore the audit directory that belongs to this journal, "
            "or start a new run with a new journal and audit directory.")


def _check_after_head(journal: Journal, server: FederationServer, b: Boundary) -> None:
    """What the trail holds after the journal's head is what a crash right after ``b`` can leave."""
    facts = getattr(server.audit, "facts", None)
    if b.audit_seq is None or not callable(facts):
        return
    federation = b.federation_id
    for f in facts(b.audit_seq):
        if f.kind == "manifest":
            federation = f.federation_id
        if federation != b.federation_id:
            continue
        later = ((f.kind == "round_plan" and (b.run_ended or b.open_round is not None or f.round != b.round))
                 or (f.kind == "aggregate" and f.round != b.open_round)
                 or (f.kind == "run_extended" and not b.run_ended))
        if later:
            raise IntegrityError(
                f"Journal {journal.path} is older than its audit trail: its last boundary ({b.stage}, round {b.round}) "
                f"recorded audit entry {b.audit_seq}, and the trail holds after it a {f.kind!r} entry"
                f"{'' if f.round is None else f' of round {f.round}'} (entry {f.seq}) that the server writes only "
                f"after a later boundary. The journal was replaced by an older copy or lost its newest boundaries "
                f"(e.g. its -wal file). {_FIX}")
