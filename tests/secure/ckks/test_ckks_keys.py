"""The key ceremony: wrapped packages open only for their recipient, intact, from the dealer;
the server's context carries no key and cannot decrypt."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import tenseal.sealapi as seal_api
from ckks_helpers import FED, identity
from clinograph.secure.ckks import (
    CkksKeyDealer,
    CkksKeyring,
    CkksPreset,
    CkksRecipientKey,
    CkksServerContext,
)
from clinograph.secure.ckks.messages import CkksKeyPackage, CkksPublicContext
from clinograph.secure.hazmat.ckks_context import CkksEvaluator, CkksSecretContext
from clinograph.secure.wire import Envelope, open_envelope, parse_envelope, seal

from clinograph.core.errors import ConfigError, IntegrityError, ProtocolError

ALICE, BOB, CAROL = identity("alice"), identity("bob"), identity("carol")


@pytest.fixture(scope="module")
def dealer():
    return CkksKeyDealer.create(preset=CkksPreset.ADD_ONLY_128, identity=ALICE, federation_id=FED)


def _package(dealer, who=BOB):
    rk = CkksRecipientKey.generate(identity=who, federation_id=FED)
    return rk, dealer.wrap_for(request=rk.request(), requester=who.public)


def _reseal(pkg: bytes, signer, **changes) -> bytes:
    msg = open_envelope(parse_envelope(pkg), sender=ALICE.public, model=CkksKeyPackage)
    return seal(msg.model_copy(update=changes), signer)


def test_unwrapped_keyring_decrypts_what_the_dealer_encrypts(dealer):
    rk, pkg = _package(dealer)
    ring = CkksKeyring.unwrap(package=pkg, recipient_key=rk, dealer=ALICE.public)
    assert ring.context_digest == dealer.keyring().context_digest
    assert ring.contributor_tag(round_=3, client="x") == dealer.keyring().contributor_tag(round_=3, client="x")
    x = np.linspace(-1, 1, 5000)
    cts = [ring.context.load_ciphertext(b) for b in dealer.keyring().context.encrypt(x)]
    np.testing.assert_allclose(ring.context.decrypt(cts, 5000), x, atol=1e-7)


def test_wrong_recipient_key(dealer):
    _, pkg = _package(dealer)
    other = CkksRecipientKey.generate(identity=BOB, federation_id=FED)  # Bob's, but not the one requested
    with pytest.raises(IntegrityError, match="wrapped to another X25519 key"):
        CkksKeyring.unwrap(package=pkg, recipient_key=other, dealer=ALICE.public)
    # even if the header is rewritten to name that key (and re-signed by the dealer), AEAD refuses
    forged = _reseal(pkg, ALICE, recipient_x25519_public=other.public)
    with pytest.raises(IntegrityError, match="does not open for 'bob'.*AEAD tag does not verify"):
        CkksKeyring.unwrap(package=forged, recipient_key=other, dealer=ALICE.public)


def test_package_for_someone_else(dealer):
    _, pkg = _package(dealer, CAROL)
    rk = CkksRecipientKey.generate(identity=BOB, federation_id=FED)
    with pytest.raises(ProtocolError, match="package is for 'carol'.*this is 'bob'"):
        CkksKeyring.unwrap(package=pkg, recipient_key=rk, dealer=ALICE.public)


@pytest.mark.parametrize("where", ["wrapped", "nonce", "ephemeral_public"])
def test_flipped_bit_in_wrapped_key(dealer, where):
    rk, pkg = _package(dealer)
    msg = open_envelope(parse_envelope(pkg), sender=ALICE.public, model=CkksKeyPackage)
    raw = bytearray(getattr(msg, where))
    raw[len(raw) // 2] ^= 0x04
    with pytest.raises(IntegrityError, match="does not open for 'bob'"):
        CkksKeyring.unwrap(package=_reseal(pkg, ALICE, **{where: bytes(raw)}), recipient_key=rk, dealer=ALICE.public)


def test_flipped_bit_on_the_wire_breaks_the_signature(dealer):
    rk, pkg = _package(dealer)
    env = parse_envelope(pkg)
    payload = bytearray(env.payload)
    payload[len(payload) // 2] ^= 0x01
    tampered = Envelope(sender=env.sender, kind=env.kind, payload=bytes(payload), signature=env.signature)
    with pytest.raises(IntegrityError, match="Signature by 'alice' does not verify"):
        CkksKeyring.unwrap(package=tampered.to_bytes(), recipient_key=rk, dealer=ALICE.public)


def test_wrong_signer(dealer):
    rk, pkg = _package(dealer)
    by_carol = _reseal(pkg, CAROL)
    with pytest.raises(IntegrityError, match="claims sender 'carol' but is checked against 'alice'"):
        CkksKeyring.unwrap(package=by_carol, recipient_key=rk, dealer=ALICE.public)
    env = parse_envelope(by_carol)
    spoofed = Envelope(sender="alice", kind=env.kind, payload=env.payload, signature=env.signature)
    with pytest.raises(IntegrityError, match="Signature by 'alice' does not verify"):
        CkksKeyring.unwrap(package=spoofed.to_bytes(), recipient_key=rk, dealer=ALICE.public)
    # and the dealer refuses a request not signed by the requester
    req = CkksRecipientKey.generate(identity=BOB, federation_id=FED).request()
    with pytest.raises(IntegrityError):
        dealer.wrap_for(request=req, requester=CAROL.public)


def test_server_context_holds_no_key_and_cannot_decrypt(dealer):
    ctx = CkksServerContext.load(data=dealer.public_context(), dealer=ALICE.public, federation_id=FED)
    assert ctx.has_secret_key is False
    assert ctx.digest == dealer.keyring().context_digest
    assert type(ctx.evaluator) is CkksEvaluator and not isinstance(ctx.evaluator, CkksSecretContext)
    assert not hasattr(ctx.evaluator, "decrypt")
    # nothing reachable from the server context is a SEAL key object
    key_types = (seal_api.SecretKey, seal_api.PublicKey, seal_api.RelinKeys, seal_api.GaloisKeys)
    seen = [ctx, *vars(ctx).values(), *vars(ctx.evaluator).values()]
    assert not any(isinstance(o, key_types) for o in seen)
    # the public context message carries the SEAL parameters and nothing else
    msg = open_envelope(parse_envelope(dealer.public_context()), sender=ALICE.public, model=CkksPublicContext)
    assert set(CkksPublicContext.model_fields) == {"kind", "federation_id", "dealer", "preset", "key_id", "parms"}
    assert len(msg.parms) < 200 < len(dealer.keyring().context.secret_key_bytes())
    # a key made from the public parameters does not decrypt the hospitals' ciphertexts
    x = np.full(4096, 0.25)
    ct = ctx.evaluator.load_ciphertext(dealer.keyring().context.encrypt(x)[0])
    guess_sk = seal_api.KeyGenerator(ctx.evaluator.context).secret_key()
    pt = seal_api.Plaintext()
    seal_api.Decryptor(ctx.evaluator.context, guess_sk).decrypt(ct, pt)
    wrong = np.array(seal_api.CKKSEncoder(ctx.evaluator.context).decode_double(pt))
    assert np.max(np.abs(wrong - x)) > 1.0


def test_public_context_from_wrong_dealer_or_federation(dealer):
    with pytest.raises(IntegrityError):
        CkksServerContext.load(data=dealer.public_context(), dealer=BOB.public, federation_id=FED)
    with pytest.raises(ProtocolError, match="for federation 'fed-ckks', not 'other'"):
        CkksServerContext.load(data=dealer.public_context(), dealer=ALICE.public, federation_id="other")


def test_secrets_are_redacted_and_unpicklable(dealer):
    rk, pkg = _package(dealer)
    ring = CkksKeyring.unwrap(package=pkg, recipient_key=rk, dealer=ALICE.public)
    for obj in (ring, rk, ring.context, dealer):
        assert "redacted" in repr(obj)
    for obj in (ring, rk, ring.context):
        with pytest.raises(TypeError, match="refuses to be pickled"):
            pickle.dumps(obj)


def test_keyring_saves_with_0600_and_loads(dealer, tmp_path):
    rk, pkg = _package(dealer)
    ring = CkksKeyring.unwrap(package=pkg, recipient_key=rk, dealer=ALICE.public)
    path = tmp_path / "keys" / "ckks.keyring"
    ring.save(path)
    assert path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(FileExistsError):
        ring.save(path)
    again = CkksKeyring.load(path, federation_id=FED)
    assert again.context_digest == ring.context_digest
    assert again.contributor_tag(round_=1, client="x") == ring.contributor_tag(round_=1, client="x")
    x = np.linspace(0, 1, 100)
    np.testing.assert_allclose(again.context.decrypt([again.context.load_ciphertext(b) for b in ring.context.encrypt(x)], 100),
                               x, atol=1e-7)
    with pytest.raises(ConfigError, match="is for federation 'fed-ckks', not 'other'"):
        CkksKeyring.load(path, federation_id="other")
    bad = tmp_path / "bad"
    bad.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ConfigError, match="Cannot load the CKKS keyring"):
        CkksKeyring.load(bad, federation_id=FED)


@pytest.mark.parametrize("low", [bytes(32), (1).to_bytes(32, "little"), (2**255 - 19).to_bytes(32, "little")],
                         ids=["u=0", "u=1", "u=p"])
def test_a_low_order_x25519_key_never_wraps_or_unwraps_a_key(dealer, low):
    """The X25519 twin of the small-order Ed25519 keys (commit 77fa23b): a request naming a low-order
    point (u = 0, 1, or p: 0 again) would make the wrapping key HKDF(0...0), which anyone can derive.
    The dealer refuses it by name; a package whose ephemeral key is such a point does not open."""
    from clinograph.secure.ckks.messages import CkksKeyRequest

    request = seal(CkksKeyRequest(federation_id=FED, requester="bob", x25519_public=low), BOB)
    with pytest.raises(ProtocolError, match="CKKS key request from 'bob'.*low order"):
        dealer.wrap_for(request=request, requester=BOB.public)
    rk, pkg = _package(dealer)
    with pytest.raises(IntegrityError, match="does not open for 'bob'.*low order"):
        CkksKeyring.unwrap(package=_reseal(pkg, ALICE, ephemeral_public=low), recipient_key=rk, dealer=ALICE.public)
