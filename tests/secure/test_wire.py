"""Envelopes with binary attachments (secure/wire.py): Blob fields travel raw, their hashes signed.

Negative tests: a swapped, truncated, altered, reordered, added or unreferenced attachment,
and a re-framed v1 envelope, are all refused; v1 envelopes (no blobs) are unchanged.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from clinograph.secure.masking.messages import MaskedInput
from clinograph.secure.messages import ClientUpdate, ModuleTensor
from clinograph.secure.wire import (
    MAGIC,
    MAGIC_ATTACHED,
    Envelope,
    open_envelope,
    open_signed,
    parse_envelope,
    seal,
    signed_bytes,
)

from clinograph.core.errors import ConfigError, IntegrityError, ProtocolError
from clinograph.core.identity import Identity

ALICE = Identity.generate("alice")
MALLORY = Identity.generate("mallory")
HDR = {"federation_id": "fed", "round": 3, "client": "alice", "spec_digest": "a" * 64, "dictionary_hash": "b" * 64}
MASKED_HDR = {**HDR, "global_state_digest": "e" * 64, "plan_digest": "f" * 64}  # masked/3: the starting model and plan too


def update(values: list[np.ndarray]) -> ClientUpdate:
    mods = tuple(ModuleTensor(name=f"m{i}", dtype="<f4", data=v.astype("<f4").tobytes()) for i, v in enumerate(values))
    return ClientUpdate(**HDR, weight=1.0, modules=mods)


def two_blobs() -> tuple[ClientUpdate, Envelope]:
    msg = update([np.arange(10, dtype=np.float32), -np.arange(7, dtype=np.float32)])
    return msg, parse_envelope(seal(msg, ALICE))


def reframe(env: Envelope, **changes) -> bytes:
    """The envelope's frame with fields replaced but the original signature (a tampering network)."""
    return env.model_copy(update=changes).to_bytes()


def test_blobs_travel_raw_and_round_trip():
    words = np.arange(1000, dtype="<u4").tobytes()
    data = seal(MaskedInput(**MASKED_HDR, words=words), ALICE)
    assert data[:4] == MAGIC_ATTACHED
    assert len(data) < len(words) + 600  # raw bytes plus a small header (~530 B): no base64 (+1333 B here)
    env = parse_envelope(data)
    assert env.attachments == (words,) and b"attachment" in env.payload and len(env.payload) < 500
    assert open_envelope(env, sender=ALICE.public, model=MaskedInput).words == words
    msg, env2 = two_blobs()
    assert len(env2.attachments) == 2 and open_envelope(env2, sender=ALICE.public, model=ClientUpdate) == msg


def test_message_without_blobs_is_a_v1_frame():
    from clinograph.secure.messages import ClientReport

    data = seal(ClientReport(federation_id="fed", round=1, client="alice", dictionary_hash="b" * 64), ALICE)
    env = parse_envelope(data)
    assert data[:4] == MAGIC and env.attachments == ()
    assert signed_bytes(env.kind, env.payload)[1] == env.kind.encode() + b"\x00" + env.payload


@pytest.mark.parametrize("tamper", [
    lambda e: {"attachments": e.attachments[::-1]},                                    # swapped
    lambda e: {"attachments": (e.attachments[0][:-4], e.attachments[1])},              # one truncated
    lambda e: {"attachments": (bytes([e.attachments[0][0] ^ 1]) + e.attachments[0][1:], e.attachments[1])},
    lambda e: {"attachments": (e.attachments[0],)},                                    # one removed
    lambda e: {"attachments": (*e.attachments, b"extra")},                             # one added
    lambda e: {"attachments": (e.attachments[0], e.attachments[0])},                   # hash mismatch (a copy)
], ids=["swapped", "truncated", "flipped_bit", "removed", "added", "hash_mismatch"])
def test_changed_attachments_break_the_signature(tamper):
    _, env = two_blobs()
    bad = parse_envelope(reframe(env, **tamper(env)))
    with pytest.raises(IntegrityError):
        open_envelope(bad, sender=ALICE.public, model=ClientUpdate)


def test_frame_truncated_inside_an_attachment_or_with_trailing_bytes_is_refused():
    _, env = two_blobs()
    data = env.to_bytes()
    for cut in (len(data) - 65, len(data) - 100, len(data) // 2):
        with pytest.raises(ProtocolError, match="truncated"):
            parse_envelope(data[:cut])
    with pytest.raises(ProtocolError, match="trailing"):
        parse_envelope(data + b"\x00")


def test_every_cut_of_a_v1_or_v2_frame_is_refused():
    """Each length field is checked against the bytes left (parse_envelope reads by offsets)."""
    v1, v2 = seal(update([]), ALICE), two_blobs()[1].to_bytes()
    assert v1[:4] == MAGIC and v2[:4] == MAGIC_ATTACHED
    for data in (v1, v2):
        assert parse_envelope(data).to_bytes() == data
        for cut in range(len(data)):
            with pytest.raises(ProtocolError, match="truncated|trailing|bad magic"):
                parse_envelope(data[:cut])


def test_attachment_length_field_lying_is_refused():
    _, env = two_blobs()
    data = bytearray(env.to_bytes())
    head = 4 + 1 + len(env.sender) + 1 + len(env.kind) + 4 + len(env.payload) + 2
    (n,) = struct.unpack(">I", data[head:head + 4])
    data[head:head + 4] = struct.pack(">I", n + 8)  # the first attachment swallows 8 bytes of the next
    with pytest.raises((ProtocolError, IntegrityError)):
        open_envelope(parse_envelope(bytes(data)), sender=ALICE.public, model=ClientUpdate)


def test_validly_signed_but_unreferenced_or_doubly_referenced_attachments_are_refused():
    _, env = two_blobs()
    payload = env.payload.replace(b'{"attachment":1}', b'{"attachment":0}')
    for atts, pl, match in ((env.attachments, payload, "referenced twice"),
                            ((*env.attachments, b"junk"), env.payload, "not referenced")):
        hashes = tuple(__import__("hashlib").sha256(a).digest() for a in atts)
        ctx, data = signed_bytes(env.kind, pl, hashes)
        forged = Envelope(sender="alice", kind=env.kind, payload=pl, attachments=atts,
                          signature=ALICE.sign(data, context=ctx))
        with pytest.raises(ProtocolError, match=match):
            open_envelope(parse_envelope(forged.to_bytes()), sender=ALICE.public, model=ClientUpdate)


def test_v2_body_reframed_as_v1_or_signed_by_another_key_is_refused():
    _, env = two_blobs()
    as_v1 = Envelope(sender="alice", kind=env.kind, payload=env.payload, signature=env.signature)
    with pytest.raises(IntegrityError):
        open_envelope(parse_envelope(as_v1.to_bytes()), sender=ALICE.public, model=ClientUpdate)
    with pytest.raises(IntegrityError):
        open_envelope(parse_envelope(seal(update([np.zeros(3)]), MALLORY)), sender=ALICE.public, model=ClientUpdate)


def test_digest_covers_the_attachments():
    _, env = two_blobs()
    before = env.digest()
    other = env.model_copy(update={"attachments": env.attachments[::-1]})  # after the hashes were cached
    assert env.digest() == before
    assert env.digest() != other.digest()
    assert parse_envelope(env.to_bytes()).digest() == env.digest()


def test_open_signed_is_open_envelope_for_a_relayed_payload_and_signature():
    """A relayed message (payload and signature as received, no envelope): verified before it is
    parsed, under the model's kind; any other key, kind, signature or payload is refused."""
    from clinograph.secure.masking.messages import ConsistencySignature

    msg = ConsistencySignature(**MASKED_HDR, survivors_digest="c" * 64)
    env = parse_envelope(seal(msg, ALICE))
    assert open_signed(env.payload, env.signature, sender=ALICE.public, model=ConsistencySignature) == msg
    with pytest.raises(IntegrityError):  # another key
        open_signed(env.payload, env.signature, sender=MALLORY.public, model=ConsistencySignature)
    with pytest.raises(IntegrityError):  # another kind: the kind is signed
        open_signed(env.payload, env.signature, sender=ALICE.public, model=MaskedInput)
    with pytest.raises(IntegrityError):  # one byte of the payload changed
        open_signed(env.payload.replace(b"c", b"d", 1), env.signature, sender=ALICE.public, model=ConsistencySignature)
    with pytest.raises(ProtocolError, match="signature of 63 bytes"):
        open_signed(env.payload, env.signature[:63], sender=ALICE.public, model=ConsistencySignature)
    junk = b'{"kind": "masked_consistency_signature"}'  # validly signed, but not a whole message
    context, data = signed_bytes("masked_consistency_signature", junk)
    with pytest.raises(ProtocolError, match="Malformed 'masked_consistency_signature' payload"):
        open_signed(junk, ALICE.sign(data, context=context), sender=ALICE.public, model=ConsistencySignature)


@pytest.mark.parametrize("name", ["bad name", "-leading-dash", "x" * 65, "new\nline"])
def test_seal_refuses_a_sender_name_no_envelope_may_carry(name):
    msg = MaskedInput(federation_id="fed", round=1, client="hosp-a", spec_digest="0" * 64,
                      dictionary_hash="d" * 64, global_state_digest="0" * 64, plan_digest="0" * 64,
                      words=b"\x00" * 8)
    with pytest.raises(ConfigError, match="Identity name"):  # refused where an identity is made, first
        Identity.generate(name)
    ident = Identity.generate("hosp-a")
    ident.name = name  # one made around that check: seal still refuses it
    with pytest.raises(ProtocolError, match="invalid sender or kind"):
        seal(msg, ident)


def test_a_plan_carries_a_published_weight_for_each_of_a_hundred_hospitals():
    """Before: options held at most 64 entries, so a federation of about 50 hospitals under a
    strategy that publishes weights (one ``weight/<name>`` each) could not be planned."""
    from clinograph.secure.messages import RoundPlan

    from clinograph.core.spec import ModelSpec, ModuleKind, ModuleSpec

    names = tuple(f"h{i:03d}" for i in range(100))
    spec = ModelSpec(version=1, modules=(ModuleSpec(name="head", kind=ModuleKind.SHARED, shape=(2,)),))
    options = {"masked.scale": 65536.0, "selection.patience": 5, **{f"weight/{n}": 1.0 for n in names}}
    plan = RoundPlan(federation_id="fed", round=0, participants=names, spec=spec, dictionary_hash="a" * 64,
                     secure_mode="masked", strategy="dq_weighted", min_clients=2, local_epochs=1,
                     global_state_digest="b" * 64, options=options)
    assert RoundPlan.model_validate_json(plan.model_dump_json()).options["weight/h099"] == 1.0


def _signed_plan_frame(server: Identity, plan, old: bytes, new: bytes) -> bytes:
    """A v1 frame of ``plan`` whose JSON has ``old`` replaced by ``new``, validly signed by ``server``
    (what a server that means it would send: the pydantic model itself refuses to build it)."""
    payload = plan.model_dump_json().encode().replace(old, new)
    assert new in payload
    context, data = signed_bytes(plan.kind, payload)
    sig = server.sign(data, context=context)
    head = struct.pack(">B", 6) + b"server" + struct.pack(">B", len(plan.kind)) + plan.kind.encode()
    return MAGIC + head + struct.pack(">I", len(payload)) + payload + sig


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_server_signed_plan_with_a_non_finite_option_is_refused_by_the_hospital(bad):
    """RoundPlan.options took NaN and inf (JSON NaN/Infinity, 1e999): a plan's fedprox.mu = NaN passed
    the hospital's DP guard (sdk/privacy/guard.py: NaN > 0 is false) and reached the trainer."""
    from clinograph.secure.messages import RoundPlan

    from clinograph.core.spec import ModelSpec, ModuleKind, ModuleSpec

    server = Identity.generate("server")
    spec = ModelSpec(version=1, modules=(ModuleSpec(name="head", kind=ModuleKind.SHARED, shape=(2,)),))
    plan = RoundPlan(federation_id="fed", round=0, participants=("h1", "h2"), spec=spec, dictionary_hash="a" * 64,
                     secure_mode="masked", strategy="fedprox", min_clients=2, local_epochs=1,
                     global_state_digest="b" * 64, options={"fedprox.mu": 0.5})
    frame = _signed_plan_frame(server, plan, b'"fedprox.mu":0.5', b'"fedprox.mu":' + bad.encode())
    with pytest.raises(ProtocolError, match="fedprox.mu"):
        open_envelope(parse_envelope(frame), sender=server.public, model=RoundPlan)


def test_a_server_signed_plan_numbering_a_round_past_2_31_is_refused_by_the_hospital():
    """hcrypto: a plan for round 2**64 passed validation (round: ge=0 only) and the hospital's
    length-prefixed context encoding (8 bytes a number) raised OverflowError, a foreign exception."""
    from clinograph.secure.messages import RoundPlan

    from clinograph.core.spec import ModelSpec, ModuleKind, ModuleSpec

    server = Identity.generate("server")
    spec = ModelSpec(version=1, modules=(ModuleSpec(name="head", kind=ModuleKind.SHARED, shape=(2,)),))
    plan = RoundPlan(federation_id="fed", round=7, participants=("h1", "h2"), spec=spec, dictionary_hash="a" * 64,
                     secure_mode="masked", strategy="fedavg", min_clients=2, local_epochs=1,
                     global_state_digest="b" * 64)
    frame = _signed_plan_frame(server, plan, b'"round":7', b'"round":' + str(2 ** 64).encode())
    with pytest.raises(ProtocolError, match="round"):
        open_envelope(parse_envelope(frame), sender=server.public, model=RoundPlan)
