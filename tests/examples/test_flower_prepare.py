"""examples/flower_deployment/app/clinograph_flower_app/prepare.py, run as the deployment guide
runs it (step 5: `python -m clinograph_flower_app.prepare --out DIR ...`, DIR relative)."""

from __future__ import annotations

import sys
from pathlib import Path

from clinograph.secure.runtime import ServerConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "flower_deployment" / "app"))
from clinograph_flower_app import prepare as module  # noqa: E402


class Models:  # the initial models are not what is checked here (and cost seconds to build)
    def to_bytes(self) -> bytes:
        return b"{}"


def test_a_relative_out_gives_a_server_toml_whose_audit_dir_is_the_server_folders(tmp_path, monkeypatch):
    monkeypatch.setattr(module, "run_models", lambda config, dictionary: Models())
    monkeypatch.chdir(tmp_path)
    module.prepare(Path("sites"), hospitals=["h1", "h2"], patients=20, dp=False, federation_id="fed-x")
    config = ServerConfig.from_toml("sites/server/server.toml")  # relative paths: from the file's folder
    assert config.audit_dir.resolve() == tmp_path / "sites" / "server" / "audit"
    assert config.initial_model.resolve() == tmp_path / "sites" / "server" / "initial_model.json"
