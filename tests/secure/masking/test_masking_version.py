"""Masking protocol versions (masked/2: AES-256-CTR masks) refuse each other at the first stage.

A hospital still on masked/1 (ChaCha20 masks) signs its round keys without the version label;
a masked/2 server refuses that advertisement (attributed: it is that hospital's own, validly
enveloped message), so incompatible masks never reach the sum, and the round completes
without it."""

from __future__ import annotations

from clinograph.secure.hazmat.labels import SIG_ROUND_KEYS
from clinograph.secure.hazmat.masking_prg import MASK_PRG
from clinograph.secure.masking.messages import AdvertiseKeys
from clinograph.secure.masking.stages import MASKING_VERSION, key_signing_bytes, round_context
from clinograph.secure.wire import seal
from masking_helpers import expected_sums, identity, rel_err
from test_masking_rejections import Round, only, payload


def test_version_label_names_the_prg_and_is_signed():
    rnd = Round()
    assert MASKING_VERSION == f"masked/2:{MASK_PRG}" == "masked/2:aes256-ctr"
    signed = key_signing_bytes(rnd.plan, "hosp01", b"c" * 32, b"s" * 32)
    assert signed.endswith(MASKING_VERSION.encode())
    assert signed != round_context(rnd.plan, "hosp01", b"c" * 32, b"s" * 32)  # masked/1 bytes


def test_a_masked_1_hospital_is_refused_and_the_round_completes_without_it():
    def old_version(data):
        msg = AdvertiseKeys.model_validate_json(payload(data))
        v1 = identity("hosp02").sign(round_context(rnd.plan, "hosp02", msg.c_pk, msg.s_pk), context=SIG_ROUND_KEYS)
        return seal(msg.model_copy(update={"key_signature": v1}), identity("hosp02"))

    rnd = Round()
    res = rnd.finish(tamper_at=0, tamper=only("hosp02", old_version))
    assert "'hosp02' does not verify" in rnd.server.rejected()["hosp02"]
    assert "hosp02" not in res.contributors
    for name, v in expected_sums(rnd.updates, res.contributors).items():
        assert rel_err(res.sums[name], v) < 1e-6
