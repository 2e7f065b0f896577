"""Threshold CKKS safe API: who holds what, end to end, and every refusal."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
from clinograph.secure.ckks.threshold import (
    CollectivePublicKey,
    Combiner,
    DecryptionShare,
    KeyGenShare,
    ThresholdParty,
    ThresholdPreset,
)

from clinograph.core.errors import ConfigError, IntegrityError, ProtocolError

PRESET = ThresholdPreset.THRESHOLD_128
FED = "fed"


@pytest.fixture(scope="module")
def federation():
    parties = {f"h{i}": ThresholdParty(preset=PRESET, federation_id=FED, name=f"h{i}") for i in range(3)}
    seed = os.urandom(32)
    public = CollectivePublicKey(preset=PRESET, federation_id=FED, seed=seed,
                                 shares={n: p.keygen_share(seed=seed) for n, p in parties.items()})
    return parties, public, seed


def _round(federation, length=5000, round_=1):
    parties, public, _ = federation
    xs = [np.random.default_rng(i).normal(scale=10, size=length) for i in range(len(parties))]
    agg = public.add([public.encrypt(x) for x in xs])
    return xs, Combiner(public=public, round=round_, aggregate=agg, contributions=len(xs))


def test_collective_decryption_gives_the_sum(federation):
    parties, public, _ = federation
    xs, comb = _round(federation)
    shares = {n: p.decryption_share(comb.request) for n, p in parties.items()}
    y = comb.combine(shares, length=5000)
    assert np.abs(y - sum(xs)).max() < 1e-5
    assert public.holders == ("h0", "h1", "h2")
    assert len(comb.request.c1) == 3  # two aggregate chunks and the canary


def test_preset_pins_its_argued_numbers():
    assert PRESET.params.coeff_bits == (60, 60, 60) and PRESET.params.scale_bits == 96
    assert sum(PRESET.params.coeff_bits) <= 218  # HE standard, 128-bit at N = 8192 (SEAL enforces it too)
    n, b = PRESET.params.poly_modulus_degree, PRESET.noise_bound_bits
    # SD per decrypted ciphertext <= N * B / 2^(bits + 1)
    assert np.log2(n) + b - (PRESET.smudging_bits + 1) <= -PRESET.statistical_bits
    assert PRESET.statistical_bits >= 40
    assert PRESET.params.max_abs_slot == 2.0 ** 22


def test_wrong_key_share_is_refused_and_named(federation):
    parties, _, _ = federation
    _, comb = _round(federation)
    impostor = ThresholdParty(preset=PRESET, federation_id=FED, name="h1")  # a different s for h1
    shares = {n: p.decryption_share(comb.request) for n, p in parties.items()}
    shares["h1"] = impostor.decryption_share(comb.request)
    with pytest.raises(IntegrityError, match=r"of h1 are not made with their key share"):
        comb.combine(shares, length=5000)
    shares["h2"] = ThresholdParty(preset=PRESET, federation_id=FED, name="h2").decryption_share(comb.request)
    with pytest.raises(IntegrityError, match=r"of h1, h2 are not made with their key share"):
        comb.combine(shares, length=5000)


def test_a_corrupted_real_share_is_detected(federation):
    parties, _, _ = federation
    _, comb = _round(federation)
    shares = {n: p.decryption_share(comb.request) for n, p in parties.items()}
    # corrupt every non-canary share of h2 (the canary position is the combiner's secret)
    msg = shares["h2"]
    canary = comb._canary_at
    bad = tuple(s if i == canary else bytes(8) + s[8:] for i, s in enumerate(msg.shares))
    shares["h2"] = msg.model_copy(update={"shares": bad})
    with pytest.raises(IntegrityError, match="not real-valued"):
        comb.combine(shares, length=5000)


def test_missing_share_decrypts_nothing(federation):
    parties, _, _ = federation
    _, comb = _round(federation)
    shares = {n: p.decryption_share(comb.request) for n, p in parties.items() if n != "h0"}
    with pytest.raises(ProtocolError, match=r"missing from h0: .*\(N-of-N\)\. Re-run threshold key generation"):
        comb.combine(shares, length=5000)


def test_share_for_another_request_is_refused(federation):
    parties, _, _ = federation
    _, comb1 = _round(federation, round_=1)
    _, comb2 = _round(federation, round_=2)
    shares = {n: p.decryption_share(comb1.request) for n, p in parties.items()}
    shares["h0"] = parties["h0"].decryption_share(comb2.request)
    with pytest.raises(ProtocolError, match="answers another request"):
        comb1.combine(shares, length=5000)


def test_malformed_share_bytes_are_refused(federation):
    parties, _, _ = federation
    _, comb = _round(federation)
    shares = {n: p.decryption_share(comb.request) for n, p in parties.items()}
    msg = shares["h1"]
    shares["h1"] = msg.model_copy(update={"shares": (b"\xff" * len(msg.shares[0]),) + msg.shares[1:]})
    with pytest.raises(ProtocolError, match="outside"):
        comb.combine(shares, length=5000)
    shares["h1"] = msg.model_copy(update={"shares": (msg.shares[0][:-8],) + msg.shares[1:]})
    with pytest.raises(ProtocolError, match="bytes; expected"):
        comb.combine(shares, length=5000)


def test_keygen_shares_must_match_party_seed_and_federation(federation):
    parties, _, seed = federation
    good = {n: p.keygen_share(seed=seed) for n, p in parties.items()}
    other = parties["h0"].keygen_share(seed=os.urandom(32))
    with pytest.raises(ProtocolError, match="another seed"):
        CollectivePublicKey(preset=PRESET, federation_id=FED, seed=seed, shares={**good, "h0": other})
    with pytest.raises(ProtocolError, match="is from 'h1'"):
        CollectivePublicKey(preset=PRESET, federation_id=FED, seed=seed, shares={**good, "h0": good["h1"]})


def test_request_for_another_federation_is_refused(federation):
    _, public, _ = federation
    _, comb = _round(federation)
    stranger = ThresholdParty(preset=PRESET, federation_id="other", name="h0")
    with pytest.raises(ProtocolError, match="federation 'fed'"):
        stranger.decryption_share(comb.request)


def test_values_out_of_range_are_refused(federation):
    _, public, _ = federation
    with pytest.raises(ConfigError, match="below 1.311e\\+05"):
        public.encrypt(np.array([2.0 ** 17]))
    with pytest.raises(ConfigError, match="finite"):
        public.encrypt(np.array([np.nan]))


def test_secret_share_is_redacted_and_not_picklable(federation):
    parties, _, _ = federation
    p = parties["h0"]
    assert "redacted" in repr(p) and str(p._s[0, 0]) not in repr(p)
    with pytest.raises(TypeError, match="refuses to be pickled"):
        pickle.dumps(p)


def test_messages_are_strict():
    with pytest.raises(ValueError):
        KeyGenShare(federation_id=FED, party="h0", seed_sha256="0" * 64, p0=b"x" * 8, extra=1)
    with pytest.raises(ValueError):
        DecryptionShare(federation_id=FED, round=-1, party="h0", request_sha256="0" * 64, shares=(b"x",))


def test_common_polynomial_is_bound_to_the_federation(federation):
    from clinograph.secure.ckks.threshold import common_a

    _, public, seed = federation
    ring = public._c.ring
    assert np.array_equal(common_a(seed=seed, federation_id=FED, ring=ring), public.a)
    assert not np.array_equal(common_a(seed=seed, federation_id="other", ring=ring), public.a)
    with pytest.raises(ConfigError, match="32 bytes"):
        common_a(seed=b"short", federation_id=FED, ring=ring)


def test_combiner_refuses_more_contributions_than_the_noise_bound_covers(federation):
    _, public, _ = federation
    agg = public.add([public.encrypt(np.zeros(10))])
    with pytest.raises(ConfigError, match=r"sums 33 encryptions.*1\.\.32"):
        Combiner(public=public, round=1, aggregate=agg, contributions=33)
