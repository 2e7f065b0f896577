"""Output folders: one check for every command that writes one."""

from __future__ import annotations

from pathlib import Path

from clinograph.core.errors import ConfigError


def output_folder(path: Path, *, what: str) -> Path:
    """Create ``path`` as a folder (parents too) and return it; ConfigError if it is a file or
    cannot be created -- never an OS traceback."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{what} {path} exists and is not a folder; choose a folder path (it is created if missing).")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"Cannot create {what} {path}: {exc.strerror}. Choose a writable folder.") from None
    return path
