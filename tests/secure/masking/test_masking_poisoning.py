"""A hospital that runs the real masked protocol with hostile slot values (SECURITY.md, "Masked-
mode poisoning"). The server cannot see any single vector, so it checks the unmasked aggregate
against everything the plan fixes: weight sums (the published weights, or (0, n * weight.max]),
contributor counts (0..survivors), and each module's values (|sum| <= count * clip). A violation
aborts the round (audited as ``round_aborted``); nothing is applied or published.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from clinograph.secure.audit import verify_audit_dir
from clinograph.secure.masking import MaskingClient
from clinograph.secure.masking.messages import MaskedInput
from clinograph.secure.runtime import run_round

from clinograph.core.errors import ProtocolError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hostile_helpers import audit_entries, federation  # noqa: E402


class PoisoningClient(MaskingClient):
    """Runs the real protocol, then adds ``shift(layout, params, plan)`` (ring words) to its
    masked vector: masks are additive mod 2^32, so this is exactly the plaintext x_u + shift."""

    def __init__(self, *, shift, **kw):
        super().__init__(**kw)
        self._shift = shift

    def _masked_input(self, msg):
        honest = super()._masked_input(msg)
        y = np.frombuffer(honest.words, dtype="<u4").astype(np.uint32)
        y += self._shift(self._layout, self.params, self.plan)
        return MaskedInput(**self._header(), words=y.astype("<u4").tobytes())


def words(values, scale):
    return np.rint(np.asarray(values, dtype=np.float64) * scale).astype(np.int64).astype(np.uint32)


def weight_slots(layout):
    m, nv = len(layout.names), layout.n_values
    return slice(nv, nv + m)


def count_slots(layout):
    m, nv = len(layout.names), layout.n_values
    return slice(nv + m, nv + 2 * m)


def attacked(tmp_path, shift, *, strategy="fedavg"):
    server, transport, _ = federation(tmp_path, strategy=strategy,
                                      hospitals={"h3": {"mode_client": PoisoningClient,
                                                        "mode_client_kw": {"shift": shift}}})
    before = {k: v.copy() for k, v in server.state.items()}
    return server, transport, before


def assert_aborted(tmp_path, server, transport, before, match):
    with pytest.raises(ProtocolError, match=match):
        run_round(server, transport)
    for k, v in before.items():
        np.testing.assert_array_equal(server.state[k], v)  # nothing applied
    kinds = [e["kind"] for e in audit_entries(tmp_path)]
    assert "round_aborted" in kinds and "aggregate" not in kinds
    assert not any(e["kind"] == "artefact" and e["payload"]["kind"] == "global_model" for e in audit_entries(tmp_path))
    assert verify_audit_dir(tmp_path / "audit").ok


def test_weight_slots_cancelling_the_published_weights_abort_the_round(tmp_path):
    """dq_weighted publishes each hospital's weight (1/4 in round 0). h3 sets its weight slots so the
    weight sum is 1e-3 instead of 1: unchecked, every parameter moves ~1000x (with a sum closer to
    zero, ~2e9x)."""
    def shift(layout, params, plan):
        d = np.zeros(layout.length, dtype=np.uint32)
        d[weight_slots(layout)] = words(np.full(len(layout.names), -(1.0 - 1e-3)), params.weight_scale)
        return d

    server, transport, before = attacked(tmp_path, shift, strategy="dq_weighted")
    assert server.strategy.client_weights(round_=0, participants=("h0", "h1", "h2", "h3"))  # weights are published
    assert_aborted(tmp_path, server, transport, before, match="weight")


def test_negative_weight_sum_aborts_instead_of_skipping_every_module(tmp_path):
    def shift(layout, params, plan):
        d = np.zeros(layout.length, dtype=np.uint32)
        d[weight_slots(layout)] = words(np.full(len(layout.names), -3.9), params.weight_scale)
        return d

    server, transport, before = attacked(tmp_path, shift)
    assert_aborted(tmp_path, server, transport, before, match="weight")


def test_forged_count_slots_cannot_inflate_module_coverage(tmp_path):
    def shift(layout, params, plan):
        d = np.zeros(layout.length, dtype=np.uint32)
        d[count_slots(layout)] = 5  # claims 9 contributors out of 4
        return d

    server, transport, before = attacked(tmp_path, shift)
    assert_aborted(tmp_path, server, transport, before, match="count")


def test_negative_count_cannot_hide_a_module(tmp_path):
    def shift(layout, params, plan):
        d = np.zeros(layout.length, dtype=np.uint32)
        d[count_slots(layout)] = np.uint32(2**32 - 4)  # count 0: honest weights and values left stranded
        return d

    server, transport, before = attacked(tmp_path, shift)
    assert_aborted(tmp_path, server, transport, before, match="count|weight")


def test_values_beyond_count_times_clip_abort_the_round(tmp_path):
    """Counts and weights made consistent (1 contributor, weight <= weight.max), values of 3 x clip."""
    def shift(layout, params, plan):
        d = np.zeros(layout.length, dtype=np.uint32)
        d[count_slots(layout)] = np.uint32(2**32 - 3)  # 4 - 3 = 1 contributor claimed
        d[weight_slots(layout)] = words(np.full(len(layout.names), -2.0), params.weight_scale)  # ~2.8 -> ~0.8
        d[:layout.n_values] = words(np.full(layout.n_values, 3.0 * params.clip), params.scale)
        return d

    server, transport, before = attacked(tmp_path, shift)
    assert_aborted(tmp_path, server, transport, before, match="clip")


def test_an_in_bound_poisoner_is_not_detected(tmp_path):
    """What remains possible (SECURITY.md): any aggregate the plan's bounds admit goes through."""
    def shift(layout, params, plan):
        d = np.zeros(layout.length, dtype=np.uint32)
        d[:layout.n_values] = words(np.full(layout.n_values, 0.5 * params.clip), params.scale)
        return d

    server, transport, _ = attacked(tmp_path, shift)
    outcome = run_round(server, transport)
    assert outcome.result.contributors == ("h0", "h1", "h2", "h3")
