"""`clinograph model init`: what it does to a file that is already there."""

from __future__ import annotations

from clinograph.sdk.datasets.alarm import DICTIONARY_PATH
from typer.testing import CliRunner

from clinograph.cli import app


def test_model_init_refuses_to_overwrite_without_force(tmp_path):
    """An existing initial_model.json (the one a running server's server.toml names, perhaps) is
    not replaced silently: refused by name with the two fixes, the file untouched; `--force`
    replaces it."""
    config, out = tmp_path / "hospital.toml", tmp_path / "initial_model.json"
    config.write_text(f'dictionary = "{DICTIONARY_PATH}"\n[privacy]\nenabled = true\nepsilon_budget = 3.0\n')
    out.write_bytes(b"the model a server runs from")
    res = CliRunner().invoke(app, ["model", "init", "--config", str(config), "--out", str(out)])
    said = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert str(out) in said and "already exists" in said and "--force" in said and "Traceback" not in said
    assert out.read_bytes() == b"the model a server runs from"
    res = CliRunner().invoke(app, ["model", "init", "--config", str(config), "--out", str(out), "--force"])
    assert res.exit_code == 0, res.output
    assert out.read_bytes().startswith(b"{") and f"written to {out}" in " ".join(res.output.split())


def test_model_init_into_a_path_it_cannot_write_is_a_clear_error(tmp_path):
    """Was 'internal error (FileNotFoundError)', exit 3."""
    config = tmp_path / "hospital.toml"
    config.write_text(f'dictionary = "{DICTIONARY_PATH}"\n[privacy]\nenabled = true\nepsilon_budget = 3.0\n')
    (tmp_path / "a_file").write_text("")
    out = tmp_path / "a_file" / "initial_model.json"
    res = CliRunner().invoke(app, ["model", "init", "--config", str(config), "--out", str(out)])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and f"Cannot write --out {out}" in said and "internal error" not in said, said


def test_a_bad_config_is_refused_before_torch_loads(tmp_path):
    """A typo'd config path or key said so after ~10 s of imports (torch, PyG, the SDK)."""
    import subprocess
    import sys

    config = tmp_path / "hospital.toml"
    config.write_text("[training]\nlrr = 0.1\n")
    probe = ("import sys; from typer.testing import CliRunner; from clinograph.cli import app; "
             f"r = CliRunner().invoke(app, ['model', 'init', '--config', {str(config)!r}, '--out', "
             f"{str(tmp_path / 'm.json')!r}]); print(r.exit_code, 'torch' in sys.modules, 'lrr' in r.output)")
    got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert got.stdout.split() == ["2", "False", "True"], got.stdout + got.stderr[-2000:]


def test_model_init_names_a_model_feature_the_dictionary_lacks(tmp_path):
    """`[model] features = ["nope"]` was written into an initial model without a word (exit 0); every
    hospital then refused it at its first training. The hospital's loader now names the id
    (sdk/federation/node.py load_dictionary, shared with the SuperNode). Found by a config mutator."""
    config, out = tmp_path / "hospital.toml", tmp_path / "initial_model.json"
    config.write_text(f'dictionary = "{DICTIONARY_PATH}"\n[model]\nfeatures = ["heart_rate", "nope"]\n')
    res = CliRunner().invoke(app, ["model", "init", "--config", str(config), "--out", str(out)])
    said = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert "[model] features names 1 id(s)" in said and "'nope'" in said and "Traceback" not in said
    assert not out.exists()
