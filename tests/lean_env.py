"""The lean server install, built for real: a venv at ``<repo>/.venv-server`` with ``.[server]``.

``lean_server_python`` (a session-scoped pytest fixture) returns that venv's python. Use it
from any test file with ``from lean_env import lean_server_python  # noqa: F401`` (tests/
is on pytest's pythonpath), then take ``lean_server_python`` as an argument::

    @pytest.mark.slow
    def test_something_on_the_server(lean_server_python):
        subprocess.run([str(lean_server_python), "-m", "clinograph.cli", ...], check=True)

The console scripts are beside it (``lean_server_python.parent / "clinograph"``).

What it guarantees: ``pip install -e '<repo>[server]'`` (done by uv when the full install has it,
as ``make setup`` gives it; pip otherwise) into a fresh venv, with torch,
torch_geometric, opacus and pgmpy all failing to import there (checked on every session, so
a dependency that starts pulling one of them in fails the tests). The install is editable so
that the venv always runs the working tree's code; only the dependencies are frozen, and the
venv is rebuilt from scratch (not upgraded) whenever pyproject.toml or setup.py change, as
recorded in its stamp file. Building it takes a few seconds with uv (25 s to a minute with pip); reusing
it takes a second. A file lock lets concurrent test
sessions share it. ``make lean`` builds it by running this file; ``make test`` leaves it to the first test
that needs it (the other workers go on meanwhile).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-server"
STAMP = VENV / ".clinograph-stamp"
LOCK = ROOT / ".venv-server.lock"
MUST_BE_ABSENT = ("torch", "torch_geometric", "opacus", "pgmpy")
BUILD_TIMEOUT_S = 1800


class LeanEnvError(RuntimeError):
    """The server install could not be built, or it can import something it must not."""


def stamp() -> str:
    """What the venv was built from: a hash of pyproject.toml and setup.py."""
    h = hashlib.sha256()
    for name in ("pyproject.toml", "setup.py"):
        h.update(name.encode() + b"\0" + (ROOT / name).read_bytes() + b"\0")
    return h.hexdigest()


def python_path() -> Path:
    """The lean venv's interpreter (it may not exist yet: see :func:`ensure`)."""
    return VENV / "bin" / "python"


@contextmanager
def _locked() -> Iterator[None]:
    with LOCK.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(cmd: list[str], *, what: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, env=env)
    if out.returncode != 0:
        raise LeanEnvError(f"{what} failed (exit {out.returncode}): {' '.join(cmd)}\n"
                           f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")


def _build(log: bool) -> float:
    t0 = time.perf_counter()
    shutil.rmtree(VENV, ignore_errors=True)
    if log:
        print(f"building {VENV} (pip install -e '.[server]') ...", file=sys.stderr, flush=True)
    # Created from this interpreter's base Python, without system site-packages: nothing of
    # the full install is visible in it.
    _run([sys.executable, "-m", "venv", str(VENV)], what="creating the venv")
    # uv (installed beside this interpreter by the Makefile) resolves and installs in seconds; pip
    # took 25 s to a minute of CPU, most of it parsing index pages. Either way the build is
    # isolated (the venv's own setuptools is older than build-system.requires).
    uv = Path(sys.executable).parent / "uv"
    if uv.exists():
        _run([str(uv), "pip", "install", "-q", "--python", str(python_path()), "-e", f"{ROOT}[server]"],
             what="uv pip install -e '.[server]'")
    else:
        pip = [str(python_path()), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        _run(pip + ["-e", f"{ROOT}[server]"], what="pip install -e '.[server]'")
    STAMP.write_text(stamp() + "\n")
    return time.perf_counter() - t0


def check_absent(python: Path) -> None:
    """Raise :class:`LeanEnvError` unless every module in MUST_BE_ABSENT fails to import."""
    code = ("import importlib, sys\nbad = []\n"
            f"for m in {MUST_BE_ABSENT!r}:\n"
            "    try:\n        importlib.import_module(m)\n    except ImportError:\n        continue\n"
            "    bad.append(m)\n"
            "print(','.join(bad))\nsys.exit(1 if bad else 0)\n")
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise LeanEnvError(f"The server install at {VENV} can import {out.stdout.strip() or '?'}; it must not "
                           f"(something in the [server] extra or the base dependencies pulls it in). "
                           f"{out.stderr[-2000:]}")


def ensure(*, log: bool = False) -> Path:
    """Build the venv if its stamp is missing or stale, check it, return its python."""
    with _locked():
        current = STAMP.read_text().strip() if STAMP.exists() else None
        if current != stamp() or not python_path().exists():
            seconds = _build(log)
            if log:
                print(f"built {VENV} in {seconds:.0f} s", file=sys.stderr)
        elif log:
            print(f"{VENV} is up to date", file=sys.stderr)
        check_absent(python_path())
    return python_path()


@pytest.fixture(scope="session")
def lean_server_python() -> Path:
    """Path of ``.venv-server/bin/python``: clinograph with only the ``server`` extra."""
    return ensure()


if __name__ == "__main__":  # make lean
    try:
        ensure(log=True)
    except LeanEnvError as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(1) from None
