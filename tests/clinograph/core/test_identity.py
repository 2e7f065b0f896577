"""clinograph/core/identity.py: a verifying key of small order (the identity, all zeros, ...) is
refused wherever a key is enrolled, pinned or trusted -- under OpenSSL's Ed25519 verification such a
key accepts a forged signature on any message."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from clinograph.core.errors import ConfigError, IntegrityError
from clinograph.core.identity import PublicIdentity, small_order

P = 2 ** 255 - 19
IDENTITY = bytes([1]) + bytes(31)
#: small-order encodings: the identity, y = 0 (order 4, "all zeros"), y = 0 with the sign bit,
#: y = p - 1 (order 2), an order-8 point (libsodium's blocklist), the identity encoded non-canonically (y = p + 1)
SMALL = {
    "identity": IDENTITY,
    "all zeros": bytes(32),
    "y=0 signed": bytes(31) + bytes([0x80]),
    "order 2": (P - 1).to_bytes(32, "little"),
    "order 8": bytes.fromhex("26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05"),
    "order 8 signed": bytes.fromhex("26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85"),
    "identity non-canonical": (P + 1).to_bytes(32, "little"),
}


def test_why_the_identity_key_verifies_a_forged_signature_on_any_message():
    """R = the identity, S = 0: [S]B = R + [k]A holds for every message k when A is the identity."""
    forged = IDENTITY + bytes(32)
    Ed25519PublicKey.from_public_bytes(IDENTITY).verify(forged, b"an audit entry nobody signed")  # no exception


@pytest.mark.parametrize("name", sorted(SMALL))
def test_a_small_order_public_key_is_refused(name):
    assert small_order(SMALL[name])
    with pytest.raises(IntegrityError, match="small-order"):
        PublicIdentity("north", SMALL[name])


def test_real_keys_are_not_small_order():
    for _ in range(300):
        raw = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        assert not small_order(raw)
        PublicIdentity("north", raw)


def test_a_federation_file_pinning_an_all_zero_key_is_a_config_error_naming_the_hospital(tmp_path):
    from clinograph.secure.enrolment import load_federation

    good = base64.b64encode(Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw,
                                                                                   PublicFormat.Raw)).decode()
    path = tmp_path / "federation.toml"
    path.write_text('federation_id = "f"\nsuperlink_address = "127.0.0.1:9092"\n'
                    f'[server]\nname = "server"\npublic_key = "{good}"\n'
                    f'[hospitals.north]\npublic_key = "{base64.b64encode(bytes(32)).decode()}"\n'
                    'node_auth_public_key = "ecdsa-sha2-nistp256 AAAA"\n')
    with pytest.raises(ConfigError) as err:
        load_federation(path)
    assert "'north'" in str(err.value) and "small-order" in str(err.value)
