"""examples/flower_deployment/app/clinograph_flower_app/prepare.py, run as the deployment guide
runs it (step 5: `python -m clinograph_flower_app.prepare --out DIR ...`, DIR relative)."""

from __future__ import annotations

import re
import sys
import tomllib
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
    # Step 7 of the guide verified `/srv/clinograph/audit`, while this server.toml, in step 6's
    # `server-config` folder `/srv/clinograph/server/`, writes the trail to `.../server/audit`: an
    # operator typing step 7 got 'not a directory'. The guide's audit commands name this folder.
    readme = (Path(__file__).resolve().parents[2] / "examples" / "flower_deployment" / "README.md").read_text()
    server_config = Path(re.search(r"server-config='(/[^']+)'", readme).group(1))
    audited = {Path(a) for a in re.findall(r"clinograph audit (?:verify|report) (\S+)", readme)}
    audit_dir = tomllib.loads(Path("sites/server/server.toml").read_text())["audit_dir"]  # as written: relative
    assert audited == {server_config.parent / audit_dir}, (audited, server_config)

