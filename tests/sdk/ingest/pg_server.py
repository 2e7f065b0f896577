"""A throwaway PostgreSQL server for tests: initdb + pg_ctl in a temporary cluster on 127.0.0.1.

Uses Debian's `postgresql` package (`make postgres` installs it). As root the server runs as
`nobody` (initdb refuses root); otherwise as the current user. Trust authentication, a free port,
its own socket directory; stopped and deleted on exit.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from listen_port import reserve_port  # not port 0: see tests/listen_port.py


def pg_bin() -> Path | None:
    """The newest installed PostgreSQL server bin/ folder, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


@contextlib.contextmanager
def postgres_server(user: str = "clinograph"):
    """Yield an SQLAlchemy URL of a fresh server (database ``postgres``, superuser ``user``)."""
    bindir = pg_bin()
    assert bindir is not None, "PostgreSQL server binaries are not installed (make postgres)"
    root = Path(tempfile.mkdtemp(prefix="clinograph-pg-"))
    os.chmod(root, 0o755)
    run_as = {}
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        os.chown(root, nobody.pw_uid, nobody.pw_gid)
        run_as = {"user": nobody.pw_uid, "group": nobody.pw_gid}
    data, port = root / "data", reserve_port()
    env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}

    def run(*args):
        subprocess.run([str(a) for a in args], check=True, capture_output=True, cwd=root, env=env, **run_as)

    run(bindir / "initdb", "-D", data, "-U", user, "--auth=trust", "-E", "UTF8", "--no-sync")
    try:
        run(bindir / "pg_ctl", "-D", data, "-l", root / "server.log", "-w", "-t", "60", "start", "-o",
            f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off")
        yield f"postgresql+psycopg://{user}@127.0.0.1:{port}/postgres"
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            run(bindir / "pg_ctl", "-D", data, "-w", "-m", "fast", "stop")
        shutil.rmtree(root, ignore_errors=True)
