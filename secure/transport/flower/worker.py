"""The hospital inside the SuperNode process: one RoundParticipant per Flower run.

A :class:`HospitalWorker` loads the hospital's signing identity, builds its
:class:`~clinograph.secure.runtime.RoundParticipant` from the node config (data, state and key
paths) with a factory the operator names, and answers each relayed stage, so the hospital's
state persists across the messages of a round and across rounds of the same run. What it
guarantees: only processes of the same uid can reach it (:mod:`.ipc`); a refusal of a
``plan``, ``stage`` or ``end`` message goes back as the hospital's signed
:class:`~clinograph.secure.refusals.HospitalRefusal` (the server audits it as
``hospital_refused``); any other error sent back names the exception class and the
Clinograph message (which by house style carries no patient data or secrets) -- other
exceptions are reported by class name only.

A restarted SuperNode rejoins its run: the worker keeps the run it was last greeted for
(``flower_run.json`` in the state directory: run id, federation, run config) and, when a message
of that run arrives before any hello, rebuilds the participant with the same factory; the
participant takes back its own state (``make_hospital``'s FederationMember: the candidate it
trains and the one chosen; each client: its anchored plan, global model and checkpoint). A round
in flight when the process stopped is lost for this hospital (its secrets of that round are gone);
the next one is not.

The hospital's log (logger ``clinograph.secure.transport.flower.worker``, INFO) says, once a
line: which Flower node serves which hospital in which run, each round's answer with the ε
the hospital reports (``round 3: answered the plan (ε = 2.41 of budget 8)``), each refusal
and its reason, and each global model loaded. No data, no keys.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import socket
import stat
import tempfile
import threading
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from clinograph.core.errors import ClinographError, ConfigError, ProtocolError
from clinograph.core.fileio import read_regular
from clinograph.core.identity import Identity
from clinograph.core.logging import printable

from ...messages import ClientReport
from ...refusals import REFUSABLE_STAGES, REFUSAL_PART
from ...runtime.participant import RoundParticipant, dispatch, part, refuse
from ...wire import parse_envelope, seal
from .ipc import MAX_SOCKET_PATH, SOCKET_NAME, peer_uid, recv_frame, send_frame
from .messages import NodeHello

#: factory(node_config=..., run_config=..., run_id=..., identity=...) -> RoundParticipant
ParticipantFactory = Callable[..., RoundParticipant]
REQUIRED_NODE_KEYS = ("hospital", "state-dir", "key-file")
#: every --node-config key the SuperNode's own participant reads (a --participant-factory may read more)
NODE_KEYS = (*REQUIRED_NODE_KEYS, "data-dir", "federation-file")
#: the run this hospital was last greeted for (in its state directory)
RUN_FILE, RUN_FORMAT = "flower_run.json", "clinograph-flower-run-v1"
_log = logging.getLogger(__name__)


def load_factory(ref: str) -> ParticipantFactory:
    """Import ``'package.module:function'``; ConfigError naming the reference on failure."""
    module, _, attr = ref.partition(":")
    if not module or not attr:
        raise ConfigError(f"Factory reference {ref!r} must look like 'package.module:function'.")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"Cannot import factory {ref!r}: {type(exc).__name__}: {exc}.") from None
    if not callable(obj):
        raise ConfigError(f"Factory {ref!r} is not callable.")
    return obj


def socket_path(state_dir: Path, *, create: bool = False) -> Path:
    """Where the worker of the hospital with this state directory listens: ``<state-dir>/
    flower-worker.sock``, or, when that path is longer than a local socket's (100 characters),
    ``<runtime-dir>/clinograph-<uid>/<digest of the state directory>.sock`` -- ``$XDG_RUNTIME_DIR``
    if set, else the system's temporary directory -- in a directory that must be this user's own,
    mode 0700, not a link (``create``: make it so if absent). Both the worker and the ClientApp
    compute the same path from ``state-dir``.

    Raises:
        ConfigError: the private directory is someone else's, a link, or open to others.
    """
    path = Path(state_dir).resolve() / SOCKET_NAME
    if len(str(path)) <= MAX_SOCKET_PATH:
        return path
    root = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()) / f"clinograph-{os.getuid()}"
    if create:
        try:
            root.mkdir(mode=0o700)
        except FileExistsError:
            pass
    try:
        info = os.lstat(root)
    except FileNotFoundError:
        info = None
    if info is not None and (not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077):
        raise ConfigError(f"{root} must be a directory of this user's own with mode 0700 (not a link): the state "
                          f"directory {state_dir} is too long for a local socket, so the hospital's worker listens "
                          "there. Remove it, or use a state directory of at most 80 characters.")
    fallback = root / f"{hashlib.sha256(str(path.parent).encode()).hexdigest()[:32]}.sock"
    if len(str(fallback)) > MAX_SOCKET_PATH:
        raise ConfigError(f"State directory path is too long for a local socket ({len(str(path))} > "
                          f"{MAX_SOCKET_PATH} characters) and so is {fallback}: {state_dir}. Use a shorter path.")
    return fallback


def check_node_config(node_config: Mapping[str, Any]) -> list[str]:
    """ConfigError listing every missing key of the SuperNode's --node-config; returns (and logs as a
    warning) the keys Clinograph does not read -- a typo (``data_dir``) would otherwise go unnoticed
    until the key it was meant to be is found missing, or never (a participant factory may read its
    own keys, so they are not refused)."""
    from difflib import get_close_matches

    missing = [k for k in REQUIRED_NODE_KEYS if not isinstance(node_config.get(k), str) or not node_config.get(k)]
    if missing:
        raise ConfigError(f"--node-config lacks {missing}. Example: --node-config \"hospital='h1' "
                          "data-dir='/srv/h1/data' state-dir='/srv/h1/state' key-file='/srv/h1/keys/h1.ed25519.pem'\".")
    unknown = sorted(str(k) for k in node_config if k not in NODE_KEYS)
    for key in unknown:
        near = get_close_matches(key.replace("_", "-").lower(), NODE_KEYS, n=1, cutoff=0.6)
        _log.warning("--node-config key '%s' is not one Clinograph reads (%s)%s", printable(key), ", ".join(NODE_KEYS),
                     f"; did you mean {near[0]!r}?" if near else "; ignored unless a participant factory reads it")
    return unknown


def _epsilon(report: bytes | None) -> str:
    """`` (ε = 1.23 of budget 8)`` from the hospital's own report, or '' without a ledger."""
    try:
        ledger = ClientReport.model_validate_json(parse_envelope(report or b"").payload).ledger
    except (ClinographError, ValueError):
        return ""
    if ledger is None:
        return " (no DP ledger)"
    return f" (ε = {ledger.epsilon:.3g} of budget {ledger.budget_epsilon:g}, δ = {ledger.delta:g})"


class HospitalWorker:
    """Answers relayed Clinograph stages for one hospital (one participant per run)."""

    def __init__(self, *, node_config: Mapping[str, Any], factory: ParticipantFactory):
        check_node_config(node_config)
        self.node_config = dict(node_config)
        self.hospital = str(node_config["hospital"])
        self.identity = Identity.load(self.hospital, Path(node_config["key-file"]))
        self.factory = factory
        self._federation_id: str | None = None
        if node_config.get("federation-file"):  # if given, the hospital only greets its own federation
            from clinograph.secure.enrolment import load_federation

            self._federation_id = load_federation(Path(str(node_config["federation-file"]))).federation_id
        self._participants: dict[int, RoundParticipant] = {}
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._inode: int | None = None
        self._thread: threading.Thread | None = None

    def redact(self, text: str) -> str:
        """``text`` with this node's own paths (``--node-config`` data-dir, state-dir, key-file,
        federation-file; as given and resolved) written as ``<data-dir>`` etc.: a refusal goes to the
        server, its audit log and the published report, which need what went wrong, not where this
        hospital keeps its files. The hospital's own log keeps the whole message."""
        found: list[tuple[str, str]] = []
        for key in ("data-dir", "state-dir", "key-file", "federation-file"):
            value = self.node_config.get(key)
            if not isinstance(value, str) or not value.strip("/"):
                continue
            forms = {value.rstrip("/")}
            try:
                forms.add(str(Path(value).resolve()))
            except (OSError, RuntimeError):
                pass
            found += [(form, f"<{key}>") for form in forms if len(form) > 1]
        for form, name in sorted(found, key=lambda f: -len(f[0])):  # the longest first: nested directories
            text = text.replace(form, name)
        return text

    # -- the protocol ------------------------------------------------------------------
    def handle(self, header: Mapping[str, Any], parts: Mapping[str, bytes]) -> dict[str, bytes]:
        """Answer one stage. Raises ClinographError on refusal."""
        stage, run_id = header.get("stage"), header.get("run_id")
        if not isinstance(run_id, int):
            raise ProtocolError("Relayed message has no run id.")
        with self._lock:
            if stage == "hello":
                return self._hello(run_id, header, parts)
            participant = self._participants.get(run_id) or self._rebuild(run_id)
            if participant is None:
                raise ProtocolError(f"Hospital {self.hospital!r} got a {stage!r} message for run {run_id} "
                                    "before the hello; the ServerApp must greet every node first.")
            round_ = header.get("round")
            round_ = round_ if isinstance(round_, int) and round_ >= 0 else 0
            # the round a delivered model closes: the hospital's last planned round (an optional
            # attribute of a participant; reading it builds nothing)
            closing = getattr(participant, "last_planned_round", None)
            closing = closing if isinstance(closing, int) and not isinstance(closing, bool) else None
            try:
                out = dispatch(participant, str(stage), parts)
            except ClinographError as exc:
                if stage not in REFUSABLE_STAGES:
                    raise
                _log.warning("round %d: refused the %s message: %s: %s", round_, stage, type(exc).__name__, exc)
                return {REFUSAL_PART: refuse(participant, self.identity, round_=round_, stage=str(stage),
                                             parts=parts, exc=exc)}
            self._log_progress(str(stage), round_, parts, out, closing=closing)
            return out

    @staticmethod
    def _log_progress(stage: str, round_: int, parts: Mapping[str, bytes], out: Mapping[str, bytes], *,
                      closing: int | None) -> None:
        """One line per round event: the model loaded, the plan answered (with ε), a stage answered.
        ``closing``: the hospital's last planned round before this message -- the round a delivered
        model closes (not ``round_ - 1``: a round aborted by a server restart spends its number)."""
        if "model" in parts:
            which = "the aggregate it decrypted" if not parts["model"] else "the new global model"
            if closing is None:  # a participant that does not say which round it planned last
                closing = round_ - 1 if stage == "plan" else round_
            _log.info("round %d closed: loaded %s", closing, which)
        if stage == "plan":
            _log.info("round %d: answered the plan%s", round_, _epsilon(out.get("report")))
        elif stage == "stage":
            _log.debug("round %d: answered a stage message", round_)

    def _hello(self, run_id: int, header: Mapping[str, Any], parts: Mapping[str, bytes]) -> dict[str, bytes]:
        federation_id = part(parts, "federation", "hello").decode(errors="replace")
        if self._federation_id is not None and federation_id != self._federation_id:
            raise ProtocolError(f"Hello for federation {federation_id!r}, but hospital {self.hospital!r} is enrolled "
                                f"in {self._federation_id!r} (its federation-file). Refusing to answer.")
        try:
            hello = NodeHello(federation_id=federation_id, hospital=self.hospital,
                              node_id=int(header["node_id"]), run_id=run_id, nonce=part(parts, "nonce", "hello"))
        except (KeyError, TypeError, ValueError):
            raise ProtocolError("Malformed hello: it needs a node id, a 32-byte nonce and a federation id.") from None
        if run_id not in self._participants:
            _log.info("Flower node %s serves hospital %r in run %d of federation %r", header.get("node_id"),
                      self.hospital, run_id, federation_id)
            self._participants.clear()  # one run at a time: drop the state of older runs
            run_config = dict(header.get("run_config") or {})
            self._participants[run_id] = self.factory(node_config=self.node_config, run_config=run_config,
                                                      run_id=run_id, identity=self.identity)
            self._keep_run(run_id, federation_id, run_config)
        return {"hello": seal(hello, self.identity)}

    def _run_file(self) -> Path:
        return Path(str(self.node_config["state-dir"])) / RUN_FILE

    def _keep_run(self, run_id: int, federation_id: str, run_config: Mapping[str, Any]) -> None:
        """The run this hospital was greeted for, so that a restarted SuperNode rejoins it (:meth:`_rebuild`)."""
        from clinograph.core.fileio import atomic_write

        atomic_write(self._run_file(), json.dumps({"format": RUN_FORMAT, "run_id": run_id,
                                                   "federation_id": federation_id, "run_config": run_config},
                                                  sort_keys=True))

    def _rebuild(self, run_id: int) -> RoundParticipant | None:
        """After a restart of this SuperNode: the participant of the run it was greeted for (the
        participant takes back its own state from the state directory), or None for another run."""
        try:
            data = json.loads(read_regular(self._run_file(), limit=2**20).decode("utf-8"))  # a small JSON object
        except (OSError, ValueError, RecursionError):
            return None
        if not isinstance(data, dict) or data.get("format") != RUN_FORMAT or data.get("run_id") != run_id or \
                (self._federation_id is not None and data.get("federation_id") != self._federation_id):
            return None
        _log.warning("rejoining run %d of federation %r after a restart: the hospital takes back its state",
                     run_id, data.get("federation_id"))
        self._participants.clear()
        self._participants[run_id] = self.factory(node_config=self.node_config,
                                                  run_config=dict(data.get("run_config") or {}), run_id=run_id,
                                                  identity=self.identity)
        return self._participants[run_id]

    # -- the local socket --------------------------------------------------------------
    def start(self) -> Path:
        """Listen on ``<state-dir>/flower-worker.sock`` in a daemon thread; returns the path."""
        state_dir = Path(self.node_config["state-dir"])
        state_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(state_dir, 0o700)
        path = socket_path(state_dir, create=True)
        if path.exists():
            path.unlink()  # a stale socket of a killed SuperNode
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        os.chmod(path, 0o600)
        self._inode = os.stat(path).st_ino
        sock.listen(8)
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name=f"clinograph-worker-{self.hospital}", daemon=True)
        self._thread.start()
        return path

    def stop(self) -> None:
        """Stop listening (the thread ends at its next accept), remove the socket file if it is
        still this worker's, and close every run's participant that holds files open."""
        if self._sock is not None:
            path = socket_path(Path(self.node_config["state-dir"]))
            try:
                mine = os.stat(path).st_ino == self._inode
            except OSError:
                mine = False
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
            self._sock = None
            if mine:  # a newer SuperNode on the same state dir may have bound its own since
                path.unlink(missing_ok=True)
        with self._lock:
            participants, self._participants = list(self._participants.values()), {}
        for participant in participants:
            close = getattr(participant, "close", None)
            if callable(close):
                close()

    def _serve(self) -> None:
        while self._sock is not None:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve_one, args=(conn,), daemon=True).start()

    def _serve_one(self, conn: socket.socket) -> None:
        with conn:
            try:
                if peer_uid(conn) != os.getuid():
                    return
                header, parts = recv_frame(conn)
                try:
                    out = self.handle(header, parts)
                    send_frame(conn, {"ok": True}, out)
                except ClinographError as exc:
                    reason = f"{type(exc).__name__}: {exc}"
                    if stage := header.get("stage"):
                        _log.warning("refused the %s message: %s", printable(str(stage)), reason)
                    send_frame(conn, {"ok": False, "error": self.redact(reason)}, {})
                except Exception as exc:  # noqa: BLE001 -- reported by class only: no data in errors
                    _log.error("hospital worker: %s at\n%s", type(exc).__name__,
                               "".join(traceback.format_tb(exc.__traceback__)))
                    send_frame(conn, {"ok": False, "error": f"{type(exc).__name__} in the hospital worker"}, {})
            except (OSError, ProtocolError):
                return
