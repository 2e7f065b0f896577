"""Properties (hypothesis): for any set of surviving hospitals and any module coverage the
decrypted sums equal the plaintext sums; for any claimed contributor set other than the true
one the hospital refuses the aggregate."""

from __future__ import annotations

import numpy as np
from ckks_helpers import SERVER, ceremony, client_for, make_plan, names, relay, server_for
from clinograph.secure.aggregation import LocalUpdate
from clinograph.secure.ckks.messages import CkksAggregate, CkksUpdate
from clinograph.secure.hazmat.ckks_context import dump_ciphertext
from clinograph.secure.wire import open_envelope, parse_envelope, seal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clinograph.core.errors import IntegrityError, ProtocolError
from clinograph.core.spec import ModelSpec, ModuleKind, ModuleSpec

N = 5
SMALL = ModelSpec(version=1, modules=tuple(ModuleSpec(name=f"gnn/m{i}", shape=(s,), kind=ModuleKind.SHARED)
                                           for i, s in enumerate((300, 41, 7))))
FAST = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _updates(coverage: list[list[bool]], weights: list[float], seed: int) -> dict[str, LocalUpdate]:
    rng = np.random.default_rng(seed)
    out = {}
    for c, cov, w in zip(names(N), coverage, weights, strict=True):
        mods = {m.name: w * rng.normal(0, 0.1, m.size) for m, on in zip(SMALL.modules, cov, strict=True) if on}
        out[c] = LocalUpdate(modules=mods, weight=w)
    return out


@FAST
@given(alive=st.sets(st.sampled_from(names(N)), min_size=2),
       coverage=st.lists(st.lists(st.booleans(), min_size=3, max_size=3), min_size=N, max_size=N),
       weights=st.lists(st.floats(0.01, 50.0), min_size=N, max_size=N), seed=st.integers(0, 2**16))
def test_decrypted_sums_equal_plaintext_sums(alive, coverage, weights, seed):
    cer = ceremony(N)
    plan = make_plan(cer, N, spec=SMALL, min_clients=2)
    updates = {c: u for c, u in _updates(coverage, weights, seed).items() if c in alive}
    results, rejected = relay(server_for(cer, plan), {c: client_for(cer, plan, c, u) for c, u in updates.items()})
    assert rejected == {} and set(results) == alive
    for got in results.values():
        assert got.contributors == tuple(sorted(alive))
        for m in SMALL.modules:
            who = [c for c in alive if m.name in updates[c].modules]
            if not who:
                assert m.name not in got.sums
                continue
            assert got.counts[m.name] == len(who)
            np.testing.assert_allclose(got.weights[m.name], sum(updates[c].weight for c in who), rtol=0, atol=1e-7)
            np.testing.assert_allclose(got.sums[m.name], sum(updates[c].modules[m.name] for c in who),
                                       rtol=0, atol=1e-7)


@FAST
@given(added=st.sets(st.sampled_from(names(N)), min_size=1),
       claimed=st.sets(st.sampled_from(names(N)), min_size=1))
def test_any_wrong_contributor_claim_is_refused(added, claimed):
    cer = ceremony(N)
    plan = make_plan(cer, N, spec=SMALL, min_clients=2)
    updates = _updates([[True, True, True]] * N, [1.0] * N, 0)
    clients = {c: client_for(cer, plan, c, u) for c, u in updates.items()}
    ev = cer.context.evaluator
    acc = None
    for c in sorted(added):
        msg = open_envelope(parse_envelope(clients[c].first_message()), sender=clients[c].identity.public,
                            model=CkksUpdate)
        cts = [ev.load_ciphertext(b) for b in msg.ciphertexts]
        if acc is None:
            acc = cts
        else:
            for a, b in zip(acc, cts, strict=True):
                ev.add_inplace(a, b)
    forged = seal(CkksAggregate(federation_id=plan.federation_id, round=plan.round, spec_digest=plan.spec.digest(),
                                context_digest=cer.context.digest, contributors=tuple(sorted(claimed)),
                                ciphertexts=tuple(dump_ciphertext(ct) for ct in acc)), SERVER)
    receiver = clients["hosp00"]
    if claimed == added and len(added) >= plan.min_clients:
        receiver.handle(forged)
        assert receiver.decrypted_result().contributors == tuple(sorted(added))
    else:
        try:
            receiver.handle(forged)
        except (IntegrityError, ProtocolError):
            return
        raise AssertionError("a wrong or too small contributor set was accepted")
