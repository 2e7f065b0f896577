"""Masking protocol versions refuse each other at the first stage (masked/3: every client message
names the round's starting global model; masked/2: AES-256-CTR masks, envelope signatures as key
and consistency signatures).

A hospital still on masked/1 (ChaCha20 masks) advertises its keys without the version field
and with a separate key signature; a masked/2 server refuses that advertisement as malformed
(attributed: it is that hospital's own, validly enveloped message), so incompatible masks
never reach the sum, and the round completes without it. A masked/2 hospital (no starting model in
its messages) is refused the same way, the refusal naming both versions, not only the missing field.
A client refuses a relayed advertisement of another version the same way."""

from __future__ import annotations

import json

import pytest
from clinograph.secure.hazmat.masking_prg import MASK_PRG
from clinograph.secure.masking.messages import MASKING_VERSION, KeyDirectory
from clinograph.secure.wire import Envelope, load_payload, parse_envelope, seal
from masking_helpers import expected_sums, identity, rel_err
from test_masking_rejections import SERVER, Round, only

from clinograph.core.errors import ProtocolError

_V1 = {"key_signature": "A" * 86 + "=="}  # 64 bytes, base64: the masked/1 field


def as_masked_1(data: bytes) -> bytes:
    """The same advertisement as a masked/1 client sends it: no version, a key_signature."""
    env = parse_envelope(data)
    fields = {k: v for k, v in json.loads(env.payload).items() if k != "version"} | _V1
    payload = json.dumps(fields).encode()
    from clinograph.core.labels import SIG_MESSAGE

    sig = identity(env.sender).sign(env.kind.encode() + b"\x00" + payload, context=SIG_MESSAGE)
    return Envelope(sender=env.sender, kind=env.kind, payload=payload, signature=sig).to_bytes()


def as_masked_2(data: bytes) -> bytes:
    """The same advertisement as a masked/2 client sends it: its version, no starting model digest."""
    env = parse_envelope(data)
    fields = {k: v for k, v in json.loads(env.payload).items() if k != "global_state_digest"}
    payload = json.dumps(fields | {"version": "masked/2:aes256-ctr"}).encode()
    from clinograph.core.labels import SIG_MESSAGE

    sig = identity(env.sender).sign(env.kind.encode() + b"\x00" + payload, context=SIG_MESSAGE)
    return Envelope(sender=env.sender, kind=env.kind, payload=payload, signature=sig).to_bytes()


def test_version_names_the_prg_and_travels_in_every_advertisement():
    assert MASKING_VERSION == f"masked/3:{MASK_PRG}" == "masked/3:aes256-ctr"
    rnd = Round()
    assert all(json.loads(parse_envelope(d).payload)["version"] == MASKING_VERSION for d in rnd.outgoing.values())


def test_a_masked_1_hospital_is_refused_and_the_round_completes_without_it():
    rnd = Round()
    res = rnd.finish(tamper_at=0, tamper=only("hosp02", as_masked_1))
    assert "Malformed 'masked_advertise_keys' payload signed by 'hosp02'" in rnd.server.rejected()["hosp02"]
    assert "hosp02" not in res.contributors
    for name, v in expected_sums(rnd.updates, res.contributors).items():
        assert rel_err(res.sums[name], v) < 1e-6


def test_a_masked_2_hospital_is_refused_by_name_and_the_round_completes_without_it():
    rnd = Round()
    res = rnd.finish(tamper_at=0, tamper=only("hosp02", as_masked_2))
    why = rnd.server.rejected()["hosp02"]
    assert "signed by 'hosp02'" in why and "2 error(s)" in why  # the version, and the missing model digest
    assert "first: version: Value error, masking protocol 'masked/2:aes256-ctr', this side runs " \
           "'masked/3:aes256-ctr'" in why and "upgrade the older side" in why
    assert "hosp02" not in res.contributors
    for name, v in expected_sums(rnd.updates, res.contributors).items():
        assert rel_err(res.sums[name], v) < 1e-6


def _directory_relaying_an_older_advertisement(rnd: Round, older) -> bytes:
    """hosp00's key directory with its first neighbour's advertisement replaced by ``older(advertisement)``
    (that neighbour's own signed bytes of an older protocol), sealed by the server."""
    for c, data in rnd.outgoing.items():
        rnd.server.receive_bytes(c, data)
    directory = load_payload(parse_envelope(rnd.server.next_stage()["hosp00"]), KeyDirectory)
    old = parse_envelope(older(rnd.outgoing[directory.keys[0].client]))
    relayed = directory.keys[0].model_copy(update={"payload": old.payload, "signature": old.signature})
    return seal(directory.model_copy(update={"keys": (relayed, *directory.keys[1:])}), SERVER)


def test_a_client_refuses_a_relayed_masked_1_advertisement():
    rnd = Round()
    with pytest.raises(ProtocolError, match="Malformed 'masked_advertise_keys' payload"):
        rnd.clients["hosp00"].handle(_directory_relaying_an_older_advertisement(rnd, as_masked_1))


def test_a_client_refuses_a_relayed_masked_2_advertisement_naming_the_version():
    rnd = Round()
    with pytest.raises(ProtocolError, match="masking protocol 'masked/2:aes256-ctr', this side runs 'masked/3"):
        rnd.clients["hosp00"].handle(_directory_relaying_an_older_advertisement(rnd, as_masked_2))
