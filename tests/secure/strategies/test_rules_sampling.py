"""FedNSL's server M-step samples from a public stream fixed by its definition (SHAKE-256),
per round: reproducible by an auditor with any library and after a server restart."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from clinograph.secure.strategies.rules import (
    PUBLIC_SAMPLING,
    categorical_counts,
    public_uniforms,
    round_seed,
)


def test_uniforms_are_the_documented_shake256_stream():
    raw = hashlib.shake_256(PUBLIC_SAMPLING + b"\x00" + b"7:head:0").digest(16)
    words = [int.from_bytes(raw[i:i + 8], "big") >> 11 for i in (0, 8)]
    assert public_uniforms(7, label="head:0", n=2).tolist() == [w * 2.0 ** -53 for w in words]


def test_streams_differ_by_seed_round_and_label_and_stay_in_unit_interval():
    a = public_uniforms(round_seed(0, 1), label="head:0", n=1000)
    assert np.all((a >= 0) & (a < 1))
    for other in (public_uniforms(round_seed(0, 2), label="head:0", n=1000),
                  public_uniforms(round_seed(1, 1), label="head:0", n=1000),
                  public_uniforms(round_seed(0, 1), label="head:1", n=1000)):
        assert not np.array_equal(a, other)


def test_categorical_counts_follow_the_probabilities():
    p = np.array([0.5, 0.0, 0.3, 0.2])
    counts = categorical_counts(p, public_uniforms(3, label="x", n=20_000))
    assert counts.sum() == 20_000 and counts[1] == 0
    assert counts / 20_000 == pytest.approx(p, abs=0.015)
