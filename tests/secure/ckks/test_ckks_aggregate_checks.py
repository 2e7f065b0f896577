"""Hospital-side checks on the server's aggregate: a dishonest server cannot make a hospital
accept an aggregate over fewer contributors than it claims, or than plan.min_clients."""

from __future__ import annotations

import numpy as np
import pytest
import tenseal.sealapi as seal_api
from ckks_helpers import SERVER, ceremony, client_for, identity, make_plan, make_updates
from clinograph.secure.ckks.layout import SlotLayout
from clinograph.secure.ckks.messages import CkksAggregate, CkksUpdate
from clinograph.secure.hazmat.ckks_context import dump_ciphertext
from clinograph.secure.wire import open_envelope, parse_envelope, seal

from clinograph.core.errors import IntegrityError, ProtocolError

N = 3


@pytest.fixture(scope="module")
def setting():
    cer = ceremony(N)
    plan = make_plan(cer, N, min_clients=2)
    updates = make_updates(plan, seed=5)
    clients = {c: client_for(cer, plan, c, u) for c, u in updates.items()}
    first = {c: open_envelope(parse_envelope(cl.first_message()), sender=identity(c).public, model=CkksUpdate)
             for c, cl in clients.items()}
    return cer, plan, updates, first


def _forge(cer, plan, first, *, add: list[str], claimed: tuple[str, ...],
           signer=SERVER, round_=None, plain_offset: dict[int, float] | None = None) -> bytes:
    """A dishonest server: sum the listed hospitals' ciphertexts (repeats allowed), optionally
    add a plaintext of its choosing, claim ``claimed``, sign as ``signer``."""
    ev = cer.context.evaluator
    acc = [ev.load_ciphertext(b) for b in first[add[0]].ciphertexts]
    for c in add[1:]:
        for a, b in zip(acc, first[c].ciphertexts, strict=True):
            ev.add_inplace(a, ev.load_ciphertext(b))
    if plain_offset:
        layout = SlotLayout.from_plan(plan)
        vec = np.zeros(len(acc) * ev.params.slot_count)
        for i, v in plain_offset.items():
            vec[i] = v
        encoder, evaluator = seal_api.CKKSEncoder(ev.context), seal_api.Evaluator(ev.context)
        for k, ct in enumerate(acc):
            pt = seal_api.Plaintext()
            encoder.encode(vec[k * 4096:(k + 1) * 4096].tolist(), ct.scale, pt)
            evaluator.add_plain_inplace(ct, pt)
        assert layout.length <= len(vec)
    msg = CkksAggregate(federation_id=plan.federation_id, round=plan.round if round_ is None else round_,
                        spec_digest=plan.spec.digest(), context_digest=cer.context.digest,
                        contributors=claimed, ciphertexts=tuple(dump_ciphertext(ct) for ct in acc))
    return seal(msg, signer)


def _client(setting, name="hosp00"):
    cer, plan, updates, _ = setting
    return client_for(cer, plan, name, updates[name])


def test_honest_aggregate_is_accepted(setting):
    cer, plan, updates, first = setting
    client = _client(setting)
    client.handle(_forge(cer, plan, first, add=["hosp00", "hosp01", "hosp02"], claimed=("hosp00", "hosp01", "hosp02")))
    got = client.decrypted_result()
    assert got.contributors == ("hosp00", "hosp01", "hosp02")
    name = plan.spec.shared[0].name
    ref = sum(u.modules[name] for u in updates.values())
    assert np.linalg.norm(got.sums[name] - ref) / np.linalg.norm(ref) < 1e-5


def test_server_adding_one_ciphertext_but_claiming_three_is_refused(setting):
    cer, plan, _, first = setting
    client = _client(setting)
    forged = _forge(cer, plan, first, add=["hosp00"], claimed=("hosp00", "hosp01", "hosp02"))
    with pytest.raises(IntegrityError, match="claims 3 contributor.*decrypted tags show 1"):
        client.handle(forged)
    with pytest.raises(ProtocolError, match="No CKKS aggregate"):
        client.decrypted_result()


def test_aggregate_over_fewer_than_min_clients_is_refused_even_if_claimed_honestly(setting):
    cer, plan, _, first = setting
    forged = _forge(cer, plan, first, add=["hosp01"], claimed=("hosp01",))
    with pytest.raises(ProtocolError, match="covers 1 hospital.*needs at least 2"):
        _client(setting, "hosp01").handle(forged)


def test_ciphertext_added_twice_is_detected(setting):
    cer, plan, _, first = setting
    forged = _forge(cer, plan, first, add=["hosp00", "hosp01", "hosp01"], claimed=("hosp00", "hosp01", "hosp02"))
    with pytest.raises(IntegrityError, match="contributor slot of 'hosp01' holds neither 0 nor its tag"):
        _client(setting).handle(forged)


def test_server_cannot_fake_an_absent_contributor_by_adding_a_plaintext(setting):
    cer, plan, _, first = setting
    layout = SlotLayout.from_plan(plan)
    guess = {layout.tag_offset + 2: 1536.0, layout.count_offset: 1.0}  # hosp02's slot, a tag-range guess
    forged = _forge(cer, plan, first, add=["hosp00", "hosp01"], claimed=("hosp00", "hosp01", "hosp02"),
                    plain_offset=guess)
    with pytest.raises(IntegrityError, match="contributor slot of 'hosp02' holds neither 0 nor its tag"):
        _client(setting).handle(forged)


def test_forged_count_slot_is_detected(setting):
    cer, plan, _, first = setting
    layout = SlotLayout.from_plan(plan)
    forged = _forge(cer, plan, first, add=["hosp00", "hosp01"], claimed=("hosp00", "hosp01"),
                    plain_offset={layout.count_offset + 1: 5.0})
    with pytest.raises(IntegrityError, match="count slot of module 'gnn/layer1/has_feature'"):
        _client(setting).handle(forged)


def test_aggregate_signed_by_someone_else_or_stale(setting):
    cer, plan, _, first = setting
    everyone = ("hosp00", "hosp01", "hosp02")
    with pytest.raises(IntegrityError, match="Envelope claims sender"):
        _client(setting).handle(_forge(cer, plan, first, add=list(everyone), claimed=everyone, signer=identity("hosp01")))
    with pytest.raises(ProtocolError, match="round 3; this is 'fed-ckks' round 4"):
        _client(setting).handle(_forge(cer, plan, first, add=list(everyone), claimed=everyone, round_=3))
