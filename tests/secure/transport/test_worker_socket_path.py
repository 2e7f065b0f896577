"""A hospital's state directory may be longer than a local socket path allows (100 characters): its
worker then listens in a private per-user directory (mode 0700, this user's own, not a link), at a
path the ClientApp computes from the same ``state-dir``; anything else there is refused."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from clinograph.secure.transport.flower.ipc import MAX_SOCKET_PATH, call
from clinograph.secure.transport.flower.worker import HospitalWorker, socket_path

from clinograph.core.errors import ConfigError
from clinograph.core.identity import Identity


@pytest.fixture
def runtime():
    """A short runtime directory (``$XDG_RUNTIME_DIR``), whatever pytest's temporary root."""
    path = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _long_state(tmp_path: Path) -> Path:
    state = tmp_path / ("s" * 60) / ("t" * 60) / "state"
    assert len(str(state / "flower-worker.sock")) > MAX_SOCKET_PATH
    return state


def test_a_long_state_directory_listens_in_a_private_directory(tmp_path, monkeypatch, runtime):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    key = tmp_path / "h1.pem"
    Identity.generate("h1").save(key)
    state = _long_state(tmp_path)
    worker = HospitalWorker(node_config={"hospital": "h1", "state-dir": str(state), "key-file": str(key)},
                            factory=lambda **_: None)
    path = worker.start()
    try:
        assert path == socket_path(state) and len(str(path)) <= MAX_SOCKET_PATH
        assert path.parent == runtime / f"clinograph-{os.getuid()}"
        assert (path.parent.stat().st_mode & 0o777) == 0o700 and (path.stat().st_mode & 0o777) == 0o600
        answer, _ = call(str(path), header={"stage": "plan", "round": 0, "run_id": 1, "node_id": 1}, parts={},
                         timeout=10)
        assert not answer["ok"] and "before the hello" in answer["error"]  # the worker answers there
    finally:
        worker.stop()
    assert not path.exists()


@pytest.mark.parametrize("problem", ["open to others", "a link"])
def test_a_private_directory_that_is_not_private_is_refused(tmp_path, monkeypatch, problem, runtime):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    target = runtime / f"clinograph-{os.getuid()}"
    if problem == "a link":
        (runtime / "elsewhere").mkdir(mode=0o700, exist_ok=True)
        target.symlink_to(runtime / "elsewhere")
    else:
        target.mkdir(mode=0o700)
        os.chmod(target, 0o777)
    with pytest.raises(ConfigError, match="mode 0700 \\(not a link\\)"):
        socket_path(_long_state(tmp_path), create=True)


def test_a_short_state_directory_keeps_its_socket_inside(tmp_path):
    state = Path("/tmp") / f"cg-{os.getpid()}"
    assert socket_path(state) == state.resolve() / "flower-worker.sock"
