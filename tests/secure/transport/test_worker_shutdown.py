"""A SuperNode's hospital worker leaves nothing behind at shutdown: its local socket file is
removed (unless a newer SuperNode on the same state directory has bound its own) and every run's
participant that holds files open is closed."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

from clinograph.secure.transport.flower.worker import HospitalWorker, socket_path

from clinograph.core.identity import Identity


class _Participant:
    closed = 0

    def close(self) -> None:
        type(self).closed += 1


def _worker(root: Path) -> HospitalWorker:
    key = root / "h1.pem"
    Identity.generate("h1").save(key)
    cfg = {"hospital": "h1", "state-dir": str(root / "state"), "key-file": str(key)}
    return HospitalWorker(node_config=cfg, factory=lambda **_: _Participant())


def test_stop_removes_the_socket_and_closes_participants():
    with tempfile.TemporaryDirectory(prefix="cg-") as tmp:  # short: a socket path has at most 100 characters
        worker = _worker(Path(tmp))
        path = worker.start()
        assert path.exists() and socket_path(Path(tmp) / "state") == path
        worker._participants[7] = _Participant()
        before = _Participant.closed
        worker.stop()
        assert not path.exists()
        assert _Participant.closed == before + 1 and worker._participants == {}
        worker.stop()  # twice is harmless


def test_stop_leaves_a_newer_workers_socket_alone():
    with tempfile.TemporaryDirectory(prefix="cg-") as tmp:
        old = _worker(Path(tmp))
        path = old.start()
        path.unlink()  # a restarted SuperNode removed the stale file and bound its own
        newer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        newer.bind(str(path))
        try:
            old.stop()
            assert path.exists() and os.stat(path).st_ino is not None
        finally:
            newer.close()


class _Planned:
    """A participant whose last plan was round 3; it answers the next plan."""

    def __init__(self) -> None:
        self.last_planned_round = 3

    def on_round_end(self, global_model):  # noqa: ANN001, ANN201
        return None

    def on_plan(self, plan):  # noqa: ANN001, ANN201
        self.last_planned_round = 5
        return b"report", b"first"


def test_the_closed_round_is_the_hospitals_last_plan_not_the_new_plan_minus_one(caplog):
    # Round 4 was aborted by a server restart (its number is spent): the plan of round 5 carries
    # the model that closed round 3, and the hospital's log says so.
    import logging

    with tempfile.TemporaryDirectory(prefix="cg-") as tmp:
        worker = _worker(Path(tmp))
        worker._participants[9] = _Planned()
        with caplog.at_level(logging.INFO, logger="clinograph.secure.transport.flower.worker"):
            out = worker.handle({"stage": "plan", "run_id": 9, "round": 5}, {"model": b"m", "data": b"p"})
    assert out == {"report": b"report", "first": b"first"}
    lines = [r.getMessage() for r in caplog.records]
    assert "round 3 closed: loaded the new global model" in lines, lines
