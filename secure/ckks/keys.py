"""The CKKS key ceremony, once per federation and separate from rounds.

Who holds what:

* one hospital, the *dealer*, generates the secret context (:class:`CkksKeyDealer`) -- never
  the server or an operator;
* every other hospital creates a one-off X25519 key (:class:`CkksRecipientKey`), sends the
  signed request, and opens the dealer's signed, wrapped package with
  :meth:`CkksKeyring.unwrap`;
* the server gets :class:`CkksServerContext`: SEAL parameters only, no key at all.

Guarantees: a package opens only with the recipient's X25519 private key, only if every byte
is intact and only if it verifies under the dealer's Ed25519 identity; the context digest
binds preset, key id and parameters, and every round message carries it.
Does not guarantee: anything against a dishonest hospital. Every hospital holds the secret
key (encryption is symmetric), so a hospital that colludes with the server can read every
individual update; CKKS protects the updates from the server, not from the federation.

Flow::

    req = CkksRecipientKey.generate(identity=bob, federation_id="fed")       # at Bob
    dealer = CkksKeyDealer.create(preset=CkksPreset.ADD_ONLY_128, identity=alice, federation_id="fed")
    pkg = dealer.wrap_for(request=req.request(), requester=bob.public)       # at Alice
    ring = CkksKeyring.unwrap(package=pkg, recipient_key=req, dealer=alice.public)  # at Bob
    ring.save(path); CkksKeyring.load(path, federation_id="fed")                     # 0600 file, next rounds
    ctx = CkksServerContext.load(data=dealer.public_context(), dealer=alice.public, federation_id="fed")
    plan options: ckks_plan_options(ctx)
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from clinograph.core.errors import ConfigError, IntegrityError, ProtocolError
from clinograph.core.identity import Identity, PublicIdentity
from clinograph.core.labels import HASH_CKKS_CONTEXT, KDF_CKKS_KEY_WRAP, MAC_CKKS_CONTRIBUTOR_TAG

from ..hazmat import ckks_keywrap
from ..hazmat.ckks_context import CkksEvaluator, CkksSecretContext, pack_fields, unpack_fields
from ..wire import open_envelope, parse_envelope, seal
from .messages import CkksKeyPackage, CkksKeyRequest, CkksPublicContext
from .presets import CkksPreset, preset_named

PRESET_OPTION = "ckks.preset"
_KEYRING_MAGIC = b"clinograph/v1/ckks-keyring"
DIGEST_OPTION = "ckks.context_digest"


def context_digest(*, preset: CkksPreset, key_id: str, parms: bytes) -> str:
    """SHA-256 binding preset, key id and SEAL parameters (hex); travels in plan and messages."""
    return hashlib.sha256(pack_fields([HASH_CKKS_CONTEXT, preset.value.encode(), key_id.encode(), parms])).hexdigest()


class CkksRecipientKey:
    """A hospital's one-off X25519 key for receiving the CKKS key. Redacted; refuses to pickle."""

    __slots__ = ("identity", "federation_id", "_sk")

    def __init__(self, *, identity: Identity, federation_id: str):
        self.identity = identity
        self.federation_id = federation_id
        self._sk = X25519PrivateKey.generate()

    @classmethod
    def generate(cls, *, identity: Identity, federation_id: str) -> CkksRecipientKey:
        """A fresh key (OS randomness) for ``identity`` in ``federation_id``."""
        return cls(identity=identity, federation_id=federation_id)

    @property
    def public(self) -> bytes:
        """The 32 X25519 public bytes."""
        return ckks_keywrap.x25519_public_bytes(self._sk)

    def request(self) -> bytes:
        """The sealed :class:`CkksKeyRequest` to send to the dealer."""
        msg = CkksKeyRequest(federation_id=self.federation_id, requester=self.identity.name, x25519_public=self.public)
        return seal(msg, self.identity)

    def __repr__(self) -> str:
        return f"CkksRecipientKey(identity={self.identity.name!r}, private=<redacted>)"

    def __reduce__(self) -> Any:  # noqa: D105
        raise TypeError("CkksRecipientKey holds a private key and refuses to be pickled.")


class CkksKeyring:
    """A hospital's copy of the federation's secret CKKS context. Redacted; refuses to pickle."""

    __slots__ = ("federation_id", "preset", "key_id", "context", "_tag_key")

    def __init__(self, *, federation_id: str, preset: CkksPreset, key_id: str,
                 context: CkksSecretContext, tag_key: bytes):
        self.federation_id = federation_id
        self.preset = preset
        self.key_id = key_id
        self.context = context
        self._tag_key = tag_key

    @property
    def context_digest(self) -> str:
        """The public context's digest (must equal the plan's ``ckks.context_digest``)."""
        return context_digest(preset=self.preset, key_id=self.key_id, parms=self.context.parms_bytes)

    def contributor_tag(self, *, round_: int, client: str) -> float:
        """A per-round, per-client value in [1024, 2048) the server cannot compute
        (HMAC-SHA256 under a key only hospitals hold); see :mod:`.layout`."""
        mac = hmac.new(self._tag_key, pack_fields([MAC_CKKS_CONTRIBUTOR_TAG, self.federation_id.encode(),
                                                   str(round_).encode(), client.encode()]), hashlib.sha256)
        return 1024.0 + 1024.0 * (int.from_bytes(mac.digest()[:7], "big") / 2.0 ** 56)

    def _bundle(self) -> bytes:
        return pack_fields([self.preset.value.encode(), self.key_id.encode(), self.context.parms_bytes,
                            self.context.secret_key_bytes(), self._tag_key])

    @classmethod
    def unwrap(cls, *, package: bytes, recipient_key: CkksRecipientKey, dealer: PublicIdentity) -> CkksKeyring:
        """Verify the dealer's signature, check the package is for this hospital and this
        ceremony key, decrypt it and rebuild the keyring.

        Raises:
            IntegrityError: bad signature, wrong signer, wrong X25519 key, any flipped bit.
            ProtocolError: the package is for another hospital or federation.
        """
        msg = open_envelope(parse_envelope(package), sender=dealer, model=CkksKeyPackage)
        me = recipient_key.identity.name
        if msg.recipient != me or msg.federation_id != recipient_key.federation_id or msg.dealer != dealer.name:
            raise ProtocolError(f"CKKS key package is for {msg.recipient!r} in federation {msg.federation_id!r}; "
                                f"this is {me!r} in {recipient_key.federation_id!r}. Ask the dealer for your own package.")
        if msg.recipient_x25519_public != recipient_key.public:
            raise IntegrityError(f"CKKS key package for {me!r} was wrapped to another X25519 key than this "
                                 "request's. Send a fresh request and use the key that made it.")
        try:
            bundle = ckks_keywrap.unwrap(msg.wrapped, recipient=recipient_key._sk, ephemeral_public=msg.ephemeral_public,
                                         nonce=msg.nonce, label=KDF_CKKS_KEY_WRAP, context=_wrap_context(msg))
            ring = cls._from_bundle(msg.federation_id, bundle)
        except ValueError as exc:
            raise IntegrityError(f"CKKS key package from {dealer.name!r} does not open for {me!r} ({exc}).") from None
        if ring.preset.value != msg.preset or ring.key_id != msg.key_id or ring.context_digest != msg.context_digest:
            raise IntegrityError(f"CKKS key package from {dealer.name!r}: wrapped context does not match its header.")
        return ring

    def save(self, path: Path) -> None:
        """Write the keyring (secret key included) with file mode 0600; refuses to overwrite.
        Protection at rest is the file's permissions only, as for :meth:`Identity.save`."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pack_fields([_KEYRING_MAGIC, self.federation_id.encode(), self._bundle()]))

    @classmethod
    def load(cls, path: Path, *, federation_id: str) -> CkksKeyring:
        """Read a keyring written by :meth:`save` for ``federation_id``."""
        try:
            magic, fed, bundle = unpack_fields(Path(path).read_bytes(), 3)
            if magic != _KEYRING_MAGIC:
                raise ValueError("not a Clinograph CKKS keyring")
            ring = cls._from_bundle(fed.decode(), bundle)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"Cannot load the CKKS keyring from {path}: {exc}. Redo the key ceremony "
                              "(CkksKeyring.unwrap) and save it again.") from None
        if ring.federation_id != federation_id:
            raise ConfigError(f"CKKS keyring {path} is for federation {ring.federation_id!r}, not {federation_id!r}.")
        return ring

    @classmethod
    def _from_bundle(cls, federation_id: str, bundle: bytes) -> CkksKeyring:
        preset_b, key_id_b, parms, sk, tag_key = unpack_fields(bundle, 5)
        preset = preset_named(preset_b.decode())
        return cls(federation_id=federation_id, preset=preset, key_id=key_id_b.decode(),
                   context=CkksSecretContext(preset.params, parms, sk), tag_key=tag_key)

    def __repr__(self) -> str:
        return f"CkksKeyring(preset={self.preset.value}, key_id={self.key_id}, secret=<redacted>)"

    def __reduce__(self) -> Any:  # noqa: D105
        raise TypeError("CkksKeyring holds a secret key and refuses to be pickled.")


def _wrap_context(msg: CkksKeyPackage) -> bytes:
    return pack_fields([msg.federation_id.encode(), msg.dealer.encode(), msg.recipient.encode(),
                        msg.recipient_x25519_public, msg.preset.encode(), msg.key_id.encode(),
                        msg.context_digest.encode()])


class CkksKeyDealer:
    """Runs at one hospital: generates the secret context and hands it out, wrapped."""

    def __init__(self, *, identity: Identity, federation_id: str, keyring: CkksKeyring):
        self.identity = identity
        self.federation_id = federation_id
        self._keyring = keyring

    @classmethod
    def create(cls, *, preset: CkksPreset, identity: Identity, federation_id: str) -> CkksKeyDealer:
        """Generate a fresh secret key, tag key and key id for ``preset``."""
        ring = CkksKeyring(federation_id=federation_id, preset=preset, key_id=os.urandom(16).hex(),
                           context=CkksSecretContext.generate(preset.params), tag_key=os.urandom(32))
        return cls(identity=identity, federation_id=federation_id, keyring=ring)

    def keyring(self) -> CkksKeyring:
        """The dealer hospital's own keyring."""
        return self._keyring

    def wrap_for(self, *, request: bytes, requester: PublicIdentity) -> bytes:
        """Verify ``requester``'s signed request and return the sealed key package for it."""
        req = open_envelope(parse_envelope(request), sender=requester, model=CkksKeyRequest)
        if req.federation_id != self.federation_id or req.requester != requester.name:
            raise ProtocolError(f"CKKS key request from {requester.name!r} is for federation {req.federation_id!r}, "
                                f"this ceremony is for {self.federation_id!r}.")
        ring = self._keyring
        header = dict(federation_id=self.federation_id, dealer=self.identity.name, recipient=requester.name,
                      recipient_x25519_public=req.x25519_public, preset=ring.preset.value, key_id=ring.key_id,
                      context_digest=ring.context_digest)
        ctx = _wrap_context(CkksKeyPackage(**header, ephemeral_public=bytes(32), nonce=bytes(12), wrapped=bytes(16)))
        try:
            eph, nonce, wrapped = ckks_keywrap.wrap(ring._bundle(), recipient_public=req.x25519_public,
                                                    label=KDF_CKKS_KEY_WRAP, context=ctx)
        except ValueError as exc:
            raise ProtocolError(f"CKKS key request from {requester.name!r}: {exc}.") from None
        return seal(CkksKeyPackage(**header, ephemeral_public=eph, nonce=nonce, wrapped=wrapped), self.identity)

    def public_context(self) -> bytes:
        """The sealed :class:`CkksPublicContext` for the server (parameters, no key)."""
        ring = self._keyring
        msg = CkksPublicContext(federation_id=self.federation_id, dealer=self.identity.name,
                                preset=ring.preset.value, key_id=ring.key_id, parms=ring.context.parms_bytes)
        return seal(msg, self.identity)

    def __repr__(self) -> str:
        return f"CkksKeyDealer(dealer={self.identity.name!r}, keyring=<redacted>)"


class CkksServerContext:
    """What the server holds: SEAL parameters (no key of any kind), preset, key id, digest."""

    def __init__(self, *, federation_id: str, preset: CkksPreset, key_id: str, parms: bytes):
        self.federation_id = federation_id
        self.preset = preset
        self.key_id = key_id
        self.evaluator = CkksEvaluator(preset.params, parms)
        self.digest = context_digest(preset=preset, key_id=key_id, parms=parms)

    @classmethod
    def load(cls, *, data: bytes, dealer: PublicIdentity, federation_id: str) -> CkksServerContext:
        """Verify the dealer's signature on a :class:`CkksPublicContext` and load it."""
        msg = open_envelope(parse_envelope(data), sender=dealer, model=CkksPublicContext)
        if msg.federation_id != federation_id:
            raise ProtocolError(f"CKKS public context is for federation {msg.federation_id!r}, not {federation_id!r}.")
        try:
            return cls(federation_id=federation_id, preset=preset_named(msg.preset), key_id=msg.key_id, parms=msg.parms)
        except ValueError as exc:
            raise ProtocolError(f"CKKS public context from {dealer.name!r} is unusable: {exc}.") from None

    @property
    def has_secret_key(self) -> bool:
        """Always False: the server's context is parameters only."""
        return False

    def __repr__(self) -> str:
        return f"CkksServerContext(preset={self.preset.value}, digest={self.digest[:16]})"


def ckks_plan_options(context: CkksServerContext) -> dict[str, str]:
    """What the server puts in ``RoundPlan.options`` so hospitals can check the context."""
    return {PRESET_OPTION: context.preset.value, DIGEST_OPTION: context.digest}


def check_plan_options(options: Mapping[str, object], *, preset: str, digest: str, who: str) -> None:
    """Raise ConfigError unless the plan's ``ckks.*`` options name this preset and context."""
    got_p, got_d = options.get(PRESET_OPTION), options.get(DIGEST_OPTION)
    if got_p != preset or got_d != digest:
        raise ConfigError(f"The round plan's CKKS options ({PRESET_OPTION}={got_p!r}, {DIGEST_OPTION}="
                          f"{str(got_d)[:16]!r}…) do not match the context of {who} ({preset!r}, {digest[:16]!r}…). "
                          "Put ckks_plan_options(server_context) in RoundPlan.options, or redo the key ceremony.")
