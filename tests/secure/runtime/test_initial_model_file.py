"""secure/runtime/models.py: the ServerApp's initial model file is read as a bounded regular file."""

from __future__ import annotations

import os

import pytest
from clinograph.secure.runtime import models

from clinograph.core.errors import ConfigError


@pytest.mark.parametrize("kind", ["fifo", "directory", "huge"])
def test_an_initial_model_that_is_no_regular_file_or_too_large_is_refused_before_reading(tmp_path, kind, monkeypatch):
    """serverapp read server.toml's initial_model with Path.read_bytes(): a FIFO hung the ServerApp,
    /dev/zero read until memory ran out (the size bound was checked after the read)."""
    path = tmp_path / "initial_model.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        monkeypatch.setattr(models, "MAX_INITIAL_MODEL_BYTES", 1024)
        with path.open("wb") as fh:
            fh.truncate(4096)
    with pytest.raises(ConfigError) as err:
        models.run_models_from_file(path)
    assert str(path) in str(err.value)
    assert {"fifo": "a FIFO", "directory": "a directory", "huge": "over the limit of 1024 bytes"}[kind] in str(err.value)
