"""The quantised masked mode (masked.word_bits = 16, params.py eqs. (2)-(3)): 2 bytes a parameter,
the documented error bound holds, overflowing configurations are refused when configured."""

from __future__ import annotations

import numpy as np
import pytest
from clinograph.secure.masking import MaskingParams
from clinograph.secure.masking.params import quantisation_error_bound, scale16_for, wrap_free16
from clinograph.secure.runtime.config import FederationSection
from clinograph.secure.transport import run_aggregation
from masking_helpers import SPEC, expected_sums, identities, identity, make_plan, make_updates

from clinograph.core.errors import ConfigError

SERVER = identity("server")


def run(plan, updates, drop=None, traffic=None):
    return run_aggregation(mode="masked", plan=plan, server_identity=SERVER, client_identities=identities(plan),
                           updates=updates, drop=drop, traffic=traffic)


@pytest.mark.parametrize("drop", [None, {"hosp03": 2}], ids=["all", "dropout_at_masked_input"])
def test_error_bound_holds_at_the_edge_of_the_range(drop):
    n, clip = 6, 1.0
    plan = make_plan(n, threshold=3, clip=clip, word_bits=16)
    updates = make_updates(plan, scale=0.3)
    rng = np.random.default_rng(1)
    for u in updates.values():  # push values to +-clip, where rounding and wrap would show
        for v in u.modules.values():
            v[:] = np.clip(v, -clip, clip)
            v[: v.size // 4] = rng.choice([-clip, clip], v.size // 4)
    res, _ = run(plan, updates, drop)
    bound = quantisation_error_bound(n_clients=n, clip=clip, word_bits=16)
    assert bound == pytest.approx(n * n * clip / (2 * (2**15 - 1 - n)))
    worst = 0.0
    for name, want in expected_sums(updates, res.contributors).items():
        err = float(np.max(np.abs(res.sums[name] - want)))
        assert err <= bound, f"{name}: {err} > {bound}"
        worst = max(worst, err)
    assert worst > bound / 50  # the bound is not vacuous: 16-bit rounding is visible
    for name in res.sums:  # weights stay 32-bit
        assert res.weights[name] == pytest.approx(sum(updates[c].weight for c in res.contributors
                                                       if name in updates[c].modules), abs=1e-6)


def test_sixteen_bit_upload_is_half_the_bytes():
    p32, p16 = make_plan(4, threshold=3), make_plan(4, threshold=3, word_bits=16)
    sizes = {}
    for plan in (p32, p16):
        traffic: dict[str, int] = {}
        res, _ = run(plan, make_updates(plan), traffic=traffic)
        sizes[plan.options.get("masked.word_bits", 32)] = traffic
    n_values = sum(m.size for m in SPEC.shared)
    saved = [sizes[32][c] - sizes[16][c] for c in sizes[32]]
    assert all(s == 2 * n_values for s in saved)


def test_masked_vector_of_the_wrong_width_is_refused():
    from clinograph.secure.masking.stages import Layout, from_words

    from clinograph.core.errors import ProtocolError

    plan = make_plan(4, threshold=3, word_bits=16)
    layout, params = Layout.of(plan), MaskingParams.from_plan(plan)
    with pytest.raises(ProtocolError, match="expected"):
        from_words(bytes(4 * layout.length), layout=layout, params=params, sender="hosp01")


def test_overflowing_configurations_are_refused_at_configuration_time():
    with pytest.raises(ConfigError, match="word_bits = 16 cannot hold the sum of 20000 values"):
        scale16_for(n_clients=20_000, bound=1.0)
    with pytest.raises(ConfigError, match="word_bits must be 32 or 16"):
        make_plan(4, threshold=3, word_bits=8)
    plan = make_plan(4, threshold=3, word_bits=16)
    opts = dict(plan.options)
    opts["masked.scale"] = opts["masked.scale"] * 1.1  # would wrap the 2^16 ring
    assert not wrap_free16(n_clients=4, bound=1.0, scale=opts["masked.scale"])
    with pytest.raises(ConfigError, match="would wrap the 2\\^16 ring"):
        MaskingParams.from_plan(plan.model_copy(update={"options": opts}))
    opts["masked.word_bits"] = 12
    with pytest.raises(ConfigError, match="word_bits must be 32 or 16"):
        MaskingParams.from_plan(plan.model_copy(update={"options": opts}))


def test_federation_section_names_the_option_off_by_default():
    assert FederationSection().masked_word_bits == 32
    assert FederationSection(masked_word_bits=16).masked_word_bits == 16
    with pytest.raises(ConfigError):
        FederationSection(masked_word_bits=8)
    assert "quantised" in FederationSection.model_fields["masked_word_bits"].description
