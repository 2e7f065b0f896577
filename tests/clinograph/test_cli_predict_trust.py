"""`clinograph predict` trusts only what is anchored: a model is loaded as safetensors weights whose
SHA-256 is named by a description signed with the hospital's key (--trusted-key). A TorchScript
file is refused and never loaded (torch.jit.load is not called, even with the insecure option),
a changed weight byte or another key is exit 2 with the file named, risks that are not
probabilities are an error and no output, and --insecure-untrusted-model warns."""

from __future__ import annotations

import base64
import os
import re
import warnings

import pandas as pd
import pytest
import tomli_w
import torch
from clinograph.sdk.config import NSFLConfig
from clinograph.sdk.datasets.alarm import DICTIONARY_PATH
from clinograph.sdk.model.export import export_model
from clinograph.sdk.model.nsfl import NSFLModel
from clinograph.secure.policy import InsecureOptionWarning
from sdk_helpers import raw_tables, small_tables
from typer.testing import CliRunner

from clinograph.cli import app
from clinograph.core.identity import Identity

runner = CliRunner()
NORTH = Identity.generate("north")


def exported(tmp_path, *, nan=False, torchscript=False):
    t = small_tables()[0]
    m = NSFLModel(len(t.dictionary.node_ids()), NSFLConfig(hidden=8))
    if nan:
        with torch.no_grad():
            m.head.bias.fill_(float("nan"))
    path, _ = export_model(m, tmp_path / "model.safetensors", dictionary=t.dictionary, signer=NORTH,
                           torchscript=torchscript)
    return path


def predict(tmp_path, model, *extra):
    df, schema = raw_tables()[0]
    df.drop(columns=[schema.label]).head(10).to_csv(tmp_path / "new.csv", index=False)
    (tmp_path / "schema.toml").write_text(tomli_w.dumps(schema.model_dump(mode="json", exclude_none=True)))
    return runner.invoke(app, ["predict", "--model", str(model), "--table", str(tmp_path / "new.csv"),
                               "--schema", str(tmp_path / "schema.toml"), "--dictionary", str(DICTIONARY_PATH),
                               "--out", str(tmp_path / "risks.csv"), *extra])


def test_a_signed_model_predicts_and_says_who_signed_it(tmp_path):
    res = predict(tmp_path, exported(tmp_path), "--trusted-key", NORTH.public.b64(), "--insecure-untrusted-model")
    assert res.exit_code == 0, res.output
    assert f"site 'north', signature checked against key {NORTH.public.fingerprint[:16]}" in res.output
    assert len(pd.read_csv(tmp_path / "risks.csv")) == 10


def test_a_torchscript_file_is_refused_and_never_loaded(tmp_path, monkeypatch):
    path = exported(tmp_path, torchscript=True)
    script = path.with_name(path.name + ".torchscript.pt")
    assert script.exists()  # the optional artefact for other runtimes
    script.with_name(script.name + ".json").write_bytes(path.with_name(path.name + ".json").read_bytes())
    calls = []
    monkeypatch.setattr(torch.jit, "load", lambda *a, **k: calls.append("jit.load"))
    monkeypatch.setattr(torch, "load", lambda *a, **k: calls.append("torch.load"))
    for extra in (("--trusted-key", NORTH.public.b64(), "--insecure-untrusted-model"), ("--insecure-untrusted-model",)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", InsecureOptionWarning)
            res = predict(tmp_path, script, *extra)
        assert res.exit_code == 2, res.output
        assert "model.safetensors.torchscript.pt is a zip archive (TorchScript or torch.save)" in res.output
        assert "never runs a model file" in res.output and "Traceback" not in res.output
    assert calls == [] and not (tmp_path / "risks.csv").exists()


def test_a_flipped_byte_or_another_key_or_no_key_is_exit_2(tmp_path):
    path = exported(tmp_path)
    res = predict(tmp_path, path)
    assert res.exit_code == 2 and "no trusted key to check its description's signature" in res.output
    res = predict(tmp_path, path, "--trusted-key", Identity.generate("north").public.b64(), "--insecure-untrusted-model")
    assert res.exit_code == 2 and "signature does not verify under the trusted key" in res.output
    res = predict(tmp_path, path, "--trusted-key", "not-a-key", "--insecure-untrusted-model")
    assert res.exit_code == 2 and "--trusted-key: the value given is not base64" in res.output
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x10
    path.write_bytes(bytes(data))
    res = predict(tmp_path, path, "--trusted-key", NORTH.public.b64(), "--insecure-untrusted-model")
    assert res.exit_code == 2 and f"Model {path}: SHA-256" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "risks.csv").exists()


def test_the_trusted_key_may_be_a_file(tmp_path):
    (tmp_path / "north.pub").write_text(NORTH.public.b64() + "\n")
    res = predict(tmp_path, exported(tmp_path), "--trusted-key", str(tmp_path / "north.pub"), "--insecure-untrusted-model")
    assert res.exit_code == 0, res.output


def test_risks_that_are_not_probabilities_are_an_error_not_output(tmp_path):
    res = predict(tmp_path, exported(tmp_path, nan=True), "--trusted-key", NORTH.public.b64(), "--insecure-untrusted-model")
    assert res.exit_code == 2 and "gave risks that are not probabilities" in res.output
    assert not (tmp_path / "risks.csv").exists()


def test_the_insecure_option_warns_and_says_so(tmp_path):
    path = exported(tmp_path)
    with pytest.warns(InsecureOptionWarning, match="insecure_untrusted_model is in use"):
        res = predict(tmp_path, path, "--insecure-untrusted-model")
    assert res.exit_code == 0, res.output
    assert "signature NOT checked (no --trusted-key, --insecure-untrusted-model)" in res.output
    assert "release NOT checked against an audit trail (no --audit, --insecure-untrusted-model)" in res.output


@pytest.fixture(scope="module")
def federation_export(tmp_path_factory):
    """A hospital's export after a 2-round masked federation, with the run's audit directory."""
    from clinograph.sdk.config import SimulationConfig
    from clinograph.sdk.federation.simulate import simulate

    tmp = tmp_path_factory.mktemp("fed_export")
    tables = small_tables()
    cfg = SimulationConfig.model_validate({
        "federation": {"rounds": 2, "secure_mode": "masked", "min_clients": 2, "local_epochs": 1},
        "model": {"hidden": 8}, "graph": {"k_similar": 0}, "output": str(tmp / "out")})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureOptionWarning)
        res = simulate(tables, tables[0].dictionary, cfg, audit_dir=tmp / "audit", choose=False)
    client = res.hospitals[tables[0].site].client
    return client.model_path, client.identity.public, client.server, res.audit_dir


def test_audit_checks_the_shared_modules_against_the_released_global_model(tmp_path, federation_export):
    path, hospital, server, audit = federation_export
    res = predict(tmp_path, path, "--trusted-key", hospital.b64(), "--audit", str(audit), "--server-key", server.b64())
    assert res.exit_code == 0, res.output
    assert ("shared weights and model settings checked against the global model and plan the server released "
            "for round") in res.output
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureOptionWarning)
        res = predict(tmp_path, path, "--insecure-untrusted-model", "--audit", str(audit), "--server-key", server.b64())
    assert res.exit_code == 0, res.output  # the settings are the server's word now, signature or not
    assert "signature NOT checked" in res.output and "shared weights and model settings checked" in res.output
    res = predict(tmp_path, path, "--trusted-key", hospital.b64())  # the hospital's signature alone: refused
    assert res.exit_code == 2 and "no audit trail to check it against" in res.output, res.output
    with pytest.warns(InsecureOptionWarning, match="without checking the release in an audit trail"):
        res = predict(tmp_path, path, "--trusted-key", hospital.b64(), "--insecure-untrusted-model")
    assert res.exit_code == 0 and "release NOT checked against an audit trail (no --audit" in res.output
    other = Identity.generate("server").public.b64()
    res = predict(tmp_path, path, "--trusted-key", hospital.b64(), "--audit", str(audit), "--server-key", other)
    assert res.exit_code == 2 and "does not verify under the server key" in res.output
    res = predict(tmp_path, path, "--trusted-key", hospital.b64(), "--audit", str(audit))
    assert res.exit_code == 2 and "needs both" in res.output


def _predict_unsigned(tmp_path, forged, env, desc, *, audit, server):
    """Write ``desc`` (unsigned) beside ``forged`` and run `predict --insecure-untrusted-model --audit`."""
    import json

    env["description"] = json.dumps(desc, sort_keys=True, separators=(",", ":"))
    forged.with_name(forged.name + ".json").write_text(json.dumps(env))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureOptionWarning)
        return predict(tmp_path, forged, "--insecure-untrusted-model", "--audit", str(audit), "--server-key",
                       server.b64())


@pytest.mark.parametrize("forgery", ["all personal", "no linear path"])
def test_audit_refuses_weights_that_leave_a_released_module_unchecked(tmp_path, federation_export, forgery):
    """Adversarial rerun of issue 31: the release check compared only the modules the rebuilt model
    has and the description does not call personal, and the description chooses both. Weights
    whose description lists every module as personal (here all set to 0.5), or drops the wide path
    (the same weights without it: another computation), passed ``--audit`` as "checked against
    the global model the server released" -- with the insecure option no signature is needed, and
    a hostile hospital can sign its own. Every weight module the server released must now be one
    the check compares."""
    import hashlib
    import json

    from safetensors.torch import load_file, save_file

    path, _, server, audit = federation_export
    forged = tmp_path / "forged.safetensors"
    env = json.loads(path.with_name(path.name + ".json").read_text())
    desc = json.loads(env["description"])
    tensors = load_file(path)
    if forgery == "all personal":
        tensors = {k: torch.full_like(v, 0.5) if v.is_floating_point() else v for k, v in tensors.items()}
        desc["release"]["personal_modules"] = ["feature_embedding/", "gnn/", "head/", "linear/"]
    else:
        tensors = {k: v for k, v in tensors.items() if not k.startswith("linear.")}
        desc["model"]["linear_path"] = False
    save_file(tensors, forged)
    desc["weights_sha256"] = hashlib.sha256(forged.read_bytes()).hexdigest()
    desc["weights_bytes"] = forged.stat().st_size
    res = _predict_unsigned(tmp_path, forged, env, desc, audit=audit, server=server)
    assert res.exit_code == 2, res.output
    assert "calls personal (or lacks)" in res.output and not (tmp_path / "risks.csv").exists()


@pytest.mark.parametrize("setting", [("deep", False), ("negative_slope", 0.9), ("value_clip", 0.1),
                                     ("features", ("heart_rate", "glucose"))])
def test_audit_refuses_the_released_weights_under_other_model_settings(tmp_path, federation_export, setting):
    """Issue 31, the last medium: the released weights, byte for byte, with one weight-free
    setting of the description changed compute other risks; `predict --audit` said "release
    check passed". The server's signed plan of the round now carries the settings' digest."""
    import json

    path, _, server, audit = federation_export
    forged = tmp_path / "forged.safetensors"
    forged.write_bytes(path.read_bytes())
    env = json.loads(path.with_name(path.name + ".json").read_text())
    desc = json.loads(env["description"])
    desc["model"][setting[0]] = setting[1]
    if setting[0] == "features":  # a subset read, consistently described
        desc["features_used"] = [f for f in desc["features"] if f in setting[1]]
    res = _predict_unsigned(tmp_path, forged, env, desc, audit=audit, server=server)
    assert res.exit_code == 2, res.output
    assert "its description's model settings ([model] deep, negative_slope, value_clip" in res.output
    assert "its signed plan names model settings" in res.output and not (tmp_path / "risks.csv").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureOptionWarning)
        res = predict(tmp_path, forged, "--insecure-untrusted-model")  # the same file, unchecked, does score
    assert res.exit_code == 0 and "release NOT checked" in res.output, res.output


def test_a_trusted_key_that_is_no_public_key_file_says_what_it_is(tmp_path):
    """Found by fuzzing `clinograph predict --trusted-key`: a folder, a FIFO, a symlink loop and ''
    were read as an inline key ('value is not the base64 ...'), a PEM private key was 'not the
    base64', and a file of two PEM public keys silently trusted the first."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from clinograph.commands.predict import hospital_key
    from clinograph.core.errors import ConfigError

    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    os.mkfifo(tmp_path / "fifo")
    key = Ed25519PrivateKey.generate()
    (tmp_path / "priv.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "two.pem").write_bytes(pub + pub)
    for value, said in ((str(tmp_path), "is a directory"), (str(tmp_path / "fifo"), "is not a regular file"),
                        (str(tmp_path / "loop1"), "is a symbolic link to no file"), ("", "is empty"),
                        (str(tmp_path / "priv.pem"), "is a PEM *private* key"),
                        (str(tmp_path / "two.pem"), "holds 2 PEM blocks"),
                        (base64.b64encode(bytes(32)).decode(), "small-order")):  # all zeros: forgeable signatures
        with pytest.raises(ConfigError, match=re.escape(said)):
            hospital_key(value)
