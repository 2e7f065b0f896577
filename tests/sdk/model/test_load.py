"""Loading an export as data (sdk/model/load.py, sdk/model/description.py): the round trip gives
the in-memory model's risks; a changed weight byte, a swapped or re-signed description, a
missing or unknown key, a code file and out-of-range outputs are each refused with a pinned
message; the insecure option warns and still checks the digest."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from clinograph.sdk.config import NSFLConfig
from clinograph.sdk.model.description import ModelDescription
from clinograph.sdk.model.export import export_model, star_risk
from clinograph.sdk.model.load import (
    check_probabilities,
    check_survival,
    code_kind,
    load_exported,
    predict_exported,
)
from clinograph.sdk.model.nsfl import NSFLModel
from clinograph.secure.policy import InsecureOptionWarning
from sdk_helpers import small_tables

from clinograph.core.errors import ConfigError, IntegrityError, SecurityPolicyError
from clinograph.core.identity import Identity

NORTH = Identity.generate("north")


def model(seed: int = 0) -> NSFLModel:
    torch.manual_seed(seed)
    return NSFLModel(len(small_tables()[0].dictionary.node_ids()), NSFLConfig(hidden=8, init_seed=seed))


def export(tmp_path, name="m.safetensors", m=None, signer=NORTH):
    t = small_tables()[0]
    return export_model(m or model(), tmp_path / name, dictionary=t.dictionary, signer=signer)


def resign(sidecar, edit, signer=NORTH):
    """Re-sign the description in ``sidecar`` after ``edit(dict)`` (what a key holder could write)."""
    env = json.loads(sidecar.read_text())
    d = json.loads(env["description"])
    edit(d)
    text = json.dumps(d, sort_keys=True, separators=(",", ":"))
    import base64

    from clinograph.core.labels import SIG_MODEL_DESCRIPTION

    env["description"] = text
    env["signature"] = base64.b64encode(signer.sign(text.encode(), context=SIG_MODEL_DESCRIPTION)).decode()
    sidecar.write_text(json.dumps(env))


def test_round_trip_gives_the_in_memory_models_risks(tmp_path):
    t = small_tables()[0]
    m = model()
    path, sidecar = export(tmp_path, m=m)
    assert path.read_bytes()[8:9] == b"{"  # safetensors: an 8-byte header length, then JSON
    loaded = load_exported(path, trusted=NORTH.public, insecure_untrusted_model=True)
    np.testing.assert_array_equal(predict_exported(loaded, t), star_risk(m, t, dictionary=t.dictionary))
    assert json.loads(sidecar.read_text())["signer"] == "north"


def test_a_flipped_weight_byte_is_refused(tmp_path):
    path, _ = export(tmp_path)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # a byte of a tensor, not of the header: safetensors alone would load it
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"SHA-256 [0-9a-f]{16}… of the weights, but its description "
                                             r"m\.safetensors\.json names [0-9a-f]{16}…\. The weights were changed"):
        load_exported(path, trusted=NORTH.public, insecure_untrusted_model=True)


def test_a_swapped_description_is_refused(tmp_path):
    path, sidecar = export(tmp_path, "a.safetensors", m=model(0))
    _, other = export(tmp_path, "b.safetensors", m=model(1))
    sidecar.write_bytes(other.read_bytes())  # validly signed by the same hospital, for other weights
    with pytest.raises(IntegrityError, match="or the description belongs to another export"):
        load_exported(path, trusted=NORTH.public, insecure_untrusted_model=True)


def test_a_description_signed_by_another_key_or_unsigned_is_refused(tmp_path):
    path, sidecar = export(tmp_path, signer=Identity.generate("north"))  # same name, another key
    with pytest.raises(IntegrityError, match=r"signature does not verify under the trusted key of 'north'"):
        load_exported(path, trusted=NORTH.public, insecure_untrusted_model=True)
    path, sidecar = export(tmp_path)
    env = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps({**env, "signature": ""}))
    with pytest.raises(IntegrityError, match="signature does not verify"):
        load_exported(path, trusted=NORTH.public, insecure_untrusted_model=True)
    del env["signature"]
    sidecar.write_text(json.dumps(env))
    with pytest.raises(IntegrityError, match=r"is not a signed model description .*signature: Field required"):
        load_exported(path, trusted=NORTH.public, insecure_untrusted_model=True)


def test_an_edited_description_breaks_the_signature(tmp_path):
    path, sidecar = export(tmp_path)
    env = json.loads(sidecar.read_text())
    env["description"] = env["description"].replace('"a":1.0', '"a":40.0')
    assert '"a":40.0' in env["description"]
    sidecar.write_text(json.dumps(env))
    with pytest.raises(IntegrityError, match="signature does not verify"):
        load_exported(path, trusted=NORTH.public, insecure_untrusted_model=True)


def test_a_missing_or_unknown_key_in_a_signed_description_is_refused(tmp_path):
    path, sidecar = export(tmp_path)
    resign(sidecar, lambda d: d.pop("calibration"))
    with pytest.raises(IntegrityError, match=r"is signed but not a valid .* description: calibration: Field required"):
        load_exported(path, trusted=NORTH.public, insecure_untrusted_model=True)
    path, sidecar = export(tmp_path)
    resign(sidecar, lambda d: d.update(loader="torch.jit.load"))
    with pytest.raises(IntegrityError, match="loader: Extra inputs are not permitted"):
        load_exported(path, trusted=NORTH.public, insecure_untrusted_model=True)
    path, sidecar = export(tmp_path)
    resign(sidecar, lambda d: d["model"].update(hidden=16))  # signed, digest right, weights of another shape
    with pytest.raises(IntegrityError, match=r"weights do not fit the architecture its description gives"):
        load_exported(path, trusted=NORTH.public, insecure_untrusted_model=True)


def test_a_torchscript_file_is_refused_and_never_loaded(tmp_path, monkeypatch):
    # the worst case: a key holder signs a description whose digest is a TorchScript file's
    marker = tmp_path / "ran"

    class Hostile(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    path, sidecar = export(tmp_path)
    torch.jit.save(torch.jit.script(Hostile()), str(path))
    import hashlib

    resign(sidecar, lambda d: d.update(weights_sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
                                       weights_bytes=path.stat().st_size))
    calls = []
    monkeypatch.setattr(torch.jit, "load", lambda *a, **k: calls.append(a) or marker.touch())
    monkeypatch.setattr(torch, "load", lambda *a, **k: calls.append(a) or marker.touch())
    with pytest.raises(IntegrityError, match=r"is a zip archive \(TorchScript or torch.save\): a file that runs code "
                                             r"when loaded\. .* never runs a model file"):
        load_exported(path, trusted=NORTH.public, insecure_untrusted_model=True)
    pickled = tmp_path / "p.safetensors"
    pickled.write_bytes(b"\x80\x04" + b"\x00" * 16)
    (tmp_path / "p.safetensors.json").write_bytes(sidecar.read_bytes())
    with warnings.catch_warnings(), pytest.raises(IntegrityError, match="is a Python pickle"):
        warnings.simplefilter("ignore", InsecureOptionWarning)
        load_exported(pickled, trusted=None, insecure_untrusted_model=True)
    assert calls == [] and not marker.exists()


def test_a_safetensors_file_is_never_taken_for_code_whatever_its_first_byte():
    # regression: a header length whose low byte is 0x80 (the pickle opcode PROTO) was refused as a pickle
    from safetensors.torch import load, save

    for pad in range(300):
        data = save({"w": torch.zeros(2)}, metadata={"pad": "x" * pad})
        if data[0] == 0x80:
            break
    assert data[0] == 0x80 and code_kind(data) is None and torch.equal(load(data)["w"], torch.zeros(2))
    assert code_kind(b"\x80\x04" + b"\x00" * 16) == "a Python pickle"
    assert code_kind(b"PK\x03\x04" + b"\x00" * 16) == "a zip archive (TorchScript or torch.save)"


def test_no_trusted_key_is_a_config_error_and_the_insecure_option_warns(tmp_path):
    path, sidecar = export(tmp_path, signer=Identity.generate("stranger"))
    with pytest.raises(ConfigError, match="no trusted key to check its description's signature"):
        load_exported(path, trusted=None)
    with pytest.warns(InsecureOptionWarning, match="insecure_untrusted_model is in use: model m.safetensors is "
                                                   "loaded without checking the signature of its description or "
                                                   "the release in an audit trail"):
        loaded = load_exported(path, trusted=None, insecure_untrusted_model=True)
    assert isinstance(loaded.description, ModelDescription)
    # a key that is given is checked, with the insecure option too
    with pytest.warns(InsecureOptionWarning), pytest.raises(IntegrityError, match="does not verify under the "
                                                                                  "trusted key of 'north'"):
        load_exported(path, trusted=NORTH.public, insecure_untrusted_model=True)
    with pytest.raises(SecurityPolicyError, match="refused because environment"):
        load_exported(path, trusted=None, insecure_untrusted_model=True, environment="production")
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x80
    path.write_bytes(bytes(data))
    with pytest.warns(InsecureOptionWarning), pytest.raises(IntegrityError, match="SHA-256"):
        load_exported(path, trusted=None, insecure_untrusted_model=True)  # the digest is still checked


def test_a_signed_model_without_an_audit_trail_is_refused_unless_insecure(tmp_path):
    """Issue 31: what Clinograph loads is bound to a verified audit trail, or named insecure. The
    hospital's signature alone does not show that the shared weights and model settings are what
    the federation's server released."""
    path, _ = export(tmp_path)
    with pytest.raises(ConfigError, match=r"no audit trail to check it against: .* Fix: pass the federation's audit "
                                          r"directory as audit_dir= and the server's public key as server= \(CLI: "
                                          r"--audit and --server-key\)"):  # the Python caller's names first
        load_exported(path, trusted=NORTH.public)
    with pytest.warns(InsecureOptionWarning, match="loaded without checking the release in an audit trail"):
        loaded = load_exported(path, trusted=NORTH.public, insecure_untrusted_model=True)
    assert loaded.released_round is None


def test_out_of_range_risks_are_an_error_not_output(tmp_path):
    with pytest.raises(IntegrityError, match=r"not probabilities \(not finite or outside \[0, 1\]\) for 1 of 3 "
                                             r"patient\(s\); nothing was written"):
        check_probabilities(np.array([0.2, 83.0, 0.4]), source="m", what="risks")
    check_probabilities(np.array([0.0, 1.0, 0.5]), source="m", what="risks")  # the bounds themselves pass
    m = model()
    with torch.no_grad():
        m.head.bias.fill_(float("nan"))  # validly signed, but the weights give no probability
    path, _ = export(tmp_path, m=m)
    loaded = load_exported(path, trusted=NORTH.public, insecure_untrusted_model=True)
    with pytest.raises(IntegrityError, match=r"gave risks that are not probabilities .* for \d+ of \d+ patient"):
        predict_exported(loaded, small_tables()[0])


def test_survival_outputs_must_be_monotone():
    h = np.full((2, 3), 0.1)
    s = np.array([[0.9, 0.8, 0.7], [0.9, 0.95, 0.7]])  # the second curve rises
    with pytest.raises(IntegrityError, match="survival curves that rise in time for 1 of 2 patient"):
        check_survival(h, s, np.array([[0.1, 0.2], [0.1, 0.2]]), source="m")
    with pytest.raises(IntegrityError, match="risks that fall at a later horizon for 1 of 2"):
        check_survival(h, s[:1].repeat(2, 0), np.array([[0.1, 0.2], [0.3, 0.2]]), source="m")
    check_survival(h, s[:1].repeat(2, 0), np.array([[0.1, 0.2], [0.1, 0.2]]), source="m")


class _Canary:
    """A pickle payload: unpickling it creates ``path`` (what a hostile model file would run)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_hostile_pickle_or_torch_save_file_never_runs(tmp_path):
    """Issue 31: a model file is data. A live payload -- proved live by unpickling it once -- in a raw
    pickle and in a torch.save zip, named as the weights with a description re-signed by the
    hospital's own key for its digest, is refused and leaves no canary file, with or without the
    insecure option; a protocol-0 pickle (no magic byte) is no safetensors file either."""
    import hashlib
    import pickle

    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(_Canary(probe))).close()  # noqa: S301 - the positive control: the payload runs
    assert probe.exists()
    canary = tmp_path / "canary"
    path, sidecar = export(tmp_path)
    for kind, write in (("a Python pickle", lambda p: p.write_bytes(pickle.dumps(_Canary(canary)))),
                        ("a zip archive", lambda p: torch.save({"w": _Canary(canary)}, str(p))),
                        ("not a safetensors file", lambda p: p.write_bytes(pickle.dumps(_Canary(canary), protocol=0)))):
        write(path)
        resign(sidecar, lambda d: d.update(weights_sha256=hashlib.sha256(path.read_bytes()).hexdigest(),  # noqa: B023
                                           weights_bytes=path.stat().st_size))
        with pytest.raises(IntegrityError, match=f"is {kind}"):
            load_exported(path, trusted=NORTH.public, insecure_untrusted_model=True)
        with warnings.catch_warnings(), pytest.raises(IntegrityError, match=f"is {kind}"):  # noqa: PT012
            warnings.simplefilter("ignore", InsecureOptionWarning)
            load_exported(path, trusted=None, insecure_untrusted_model=True)
        assert not canary.exists(), kind


def test_every_missing_and_extra_description_key_is_named_at_once(tmp_path):
    """Issue 31: a sidecar with keys missing and added is one error listing each of them."""
    path, sidecar = export(tmp_path)

    def edit(d):
        for key in ("calibration", "features", "site"):
            d.pop(key)
        d.update(loader="torch.jit.load", code="import os")
        d["model"]["hook"] = "x"

    resign(sidecar, edit)
    with pytest.raises(IntegrityError, match=r"6 problem\(s\)") as info:
        load_exported(path, trusted=NORTH.public, insecure_untrusted_model=True)
    for key in ("calibration: Field required", "features: Field required", "site: Field required",
                "loader: Extra inputs", "code: Extra inputs", "model.hook: Extra inputs"):
        assert key in str(info.value), key


def test_a_description_must_agree_with_its_own_weights_size_and_feature_choice(tmp_path):
    """Adversarial rerun of issue 31: ``weights_bytes`` was never compared, and ``features_used``
    (which features the model reads) could be any subset, whatever ``model.features`` said."""
    path, sidecar = export(tmp_path)
    resign(sidecar, lambda d: d.update(weights_bytes=99))
    with pytest.raises(IntegrityError, match=r"\d+ bytes of weights, but its description m.safetensors.json names "
                                             r"99\. The description was edited"):
        load_exported(path, trusted=NORTH.public, insecure_untrusted_model=True)
    path, sidecar = export(tmp_path)
    resign(sidecar, lambda d: d.update(features_used=d["features_used"][:1]))
    with pytest.raises(IntegrityError, match="features_used must be the dictionary features that model.features "
                                             "selects"):
        load_exported(path, trusted=NORTH.public, insecure_untrusted_model=True)


def test_a_description_naming_huge_dimensions_allocates_nothing_before_it_is_refused(tmp_path, monkeypatch):
    """Adversarial rerun of issue 31: a 1.7 MB description (150 000 features at hidden 1024) made
    the loader build a 1 GB model before it compared the weights' shapes. The shapes now come from
    a model on the meta device; only weights that fit are given real memory."""
    import clinograph.sdk.model.load as load

    devices = []

    class Spy(NSFLModel):
        def __init__(self, *a, **k):
            devices.append(torch.empty(0).device.type)  # the default device the model is built on
            super().__init__(*a, **k)

    monkeypatch.setattr(load, "NSFLModel", Spy)
    path, sidecar = export(tmp_path)

    def huge(d):
        d["features"] = d["features"] + [f"x{i}" for i in range(20_000)]
        d["features_used"] = d["features"]
        d["model"]["hidden"] = 1024

    resign(sidecar, huge)
    with pytest.raises(IntegrityError, match="weights do not fit the architecture its description gives"):
        load_exported(path, trusted=NORTH.public, insecure_untrusted_model=True)
    assert devices == ["meta"]
    path, _ = export(tmp_path, name="honest.safetensors")
    load_exported(path, trusted=NORTH.public, insecure_untrusted_model=True)
    assert devices == ["meta", "meta", "cpu"]  # an honest export: shapes first, then the real model


@pytest.mark.parametrize("given", ["description", "csv"])
def test_a_file_that_is_not_safetensors_weights_is_named_with_the_fix(tmp_path, given):
    """`--model model.safetensors.json` (or a server's initial_model.json, or a CSV) was refused as
    'description model.safetensors.json.json is missing': the fix it gave, copying both files, was
    already done."""
    path, sidecar = export(tmp_path)
    wrong = sidecar if given == "description" else tmp_path / "risks.csv"
    if given == "csv":
        wrong.write_text("patient_id,risk\n1,0.5\n")
    looks = r"JSON \(a model description or a server's initial model\)" if given == "description" else \
        "not a safetensors file"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureOptionWarning)
        with pytest.raises(ConfigError, match=rf"is {looks}, not the weights of an export\. Fix: pass the "
                                              r"\.safetensors file NSFLTask\.export wrote"):
            load_exported(wrong, trusted=NORTH.public, insecure_untrusted_model=True)
