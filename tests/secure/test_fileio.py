"""clinograph/core/fileio.py: the one atomic writer (ledgers, anchors, the audit trail)."""

from __future__ import annotations

import os
import stat

import pytest

from clinograph.core.fileio import atomic_write


def test_atomic_write_replaces_whole_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "ledger.json"
    atomic_write(path, "first")
    atomic_write(path, b"second")
    assert path.read_bytes() == b"second"
    assert os.listdir(path.parent) == ["ledger.json"]


def test_private_files_are_owner_only_published_files_world_readable(tmp_path):
    atomic_write(tmp_path / "private", b"x")
    atomic_write(tmp_path / "public", b"x", private=False)
    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "public").stat().st_mode) == 0o644


def test_failed_write_keeps_old_content_and_removes_temporary(tmp_path, monkeypatch):
    path = tmp_path / "anchor.json"
    atomic_write(path, b"old")

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, b"new")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["anchor.json"]
