"""The run's set-up sums: secure sums the hospitals need before any candidate trains
(``[scaling] source = "federated"``: the federated histograms; ``[model] features = "shared"``:
the feature coverage). Driven here, by :func:`.run.run_federation`, over the run's transport --
the same in a simulation and over Flower.

Per :class:`~.models.SetupSum` of :attr:`RunModels.setup <.models.RunModels.setup>`, in order,
in the run's first audit run (the candidates' rounds are numbered after them):

1. ``announce``: the sum's public parameters are audited (kind ``sum.name``), then a signed
   :class:`~.models.SetupAnnounce` (step ``setup/sum``) asks every hospital for its share; a
   hospital builds it from its own table only if its own config asks for that very sum.
2. **One round** of FedSGD at server learning rate 1 under the federation's secure mode
   (``masked``, or ``insecure_plaintext`` by name), through :func:`.loop.run_rounds`: each
   hospital's weighted update is ``c · (v, 1)`` (weight 1 everywhere), so the global module
   moves by ``c · (Σ_k v_k, K) / K`` and the server learns the sum only, never one vector.
3. ``setup/result``: a signed :class:`~.models.SetupClose` gives the round's contributor count K;
   every hospital decodes ``Σ_k v_k`` from the delivered model, derives what it needs (the
   rescaled dictionary, the shared feature list) and answers with a signed
   :class:`~.models.SetupResult`. The server checks that every answer agrees (else a
   ProtocolError: an inconsistent federation), audits the agreed outcome (kind
   ``sum.result_kind``) and, when the sum derived a dictionary, runs the candidates on its digest:
   each hospital refuses a plan whose dictionary is not the one it derived itself.

What it does not do: CKKS (the server never sees a sum there, but the set-up result every hospital
returns and the server audits -- the derived scales, the shared features -- is a function of the
sum, so it would show the server what CKKS hides), DP (the sums are exact, outside the accountant),
a crash journal (a resumed run would repeat the sums). All three are refused before anything runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from clinograph.core.errors import ConfigError, ProtocolError
from clinograph.core.spec import ModelSpec, ModuleKind, ModuleSpec

from ..wire import open_envelope, parse_envelope, seal
from .build import InitialModel, build_server
from .loop import EventSink, run_rounds
from .models import RunModels, SetupAnnounce, SetupClose, SetupResult, SetupSum
from .transport import Restricted, Transport

#: the secure modes a set-up sum runs under (under CKKS the audited result would reveal the sum it hides)
SETUP_MODES = ("masked", "insecure_plaintext")
#: the part a hospital's signed :class:`~.models.SetupResult` travels in
RESULT_PART = "result"


def check_setup(models: RunModels, *, secure_mode: str, distributed_dp: bool, journal: bool) -> None:
    """Refuse, before anything runs, a run whose set-up sums cannot keep their promise.

    Raises:
        ConfigError: distributed DP (``dp``: the hospitals' releases are local-DP ledger entries,
            sdk/privacy/counts.py), a secure mode other than masked / insecure_plaintext, or a
            crash journal; the message names the sums and the fix.
    """
    check_setup_sums(models.setup, secure_mode=secure_mode, distributed_dp=distributed_dp, journal=journal)


def check_setup_sums(sums: Sequence[SetupSum], *, secure_mode: str, distributed_dp: bool, journal: bool) -> None:
    """:func:`check_setup` for ``sums``."""
    if not sums:
        return
    names = ", ".join(s.name for s in sums)
    fix = ("Write the initial model from a hospital.toml with [scaling] source = \"dictionary\" and [model] features "
           "listed (or \"all\")")
    if distributed_dp:
        raise ConfigError(f"The run's set-up sums ({names}) are released with local noise, accounted in each "
                          f"hospital's local-DP ledger, and this federation runs distributed DP. {fix}.")
    if secure_mode not in SETUP_MODES:
        why = ("the server never sees a sum, but the result every hospital returns and the server audits (the "
               "derived scales, the shared features) is a function of the sum" if secure_mode == "ckks" else
               "the mode decrypts only a training round's aggregate (a set-up sum is not one of its rounds)"
               if secure_mode == "ckks_threshold" else "the mode does not run set-up sums")
        raise ConfigError(f"The run's set-up sums ({names}) run under secure_mode 'masked' (or insecure_plaintext): "
                          f"under {secure_mode!r} {why}. Use 'masked', or: {fix}.")
    if journal:
        raise ConfigError(f"The run's set-up sums ({names}) are not journalled (a resumed run would repeat them). "
                          f"Run without a journal, or: {fix}.")


def sum_model(s: SetupSum, *, dictionary_hash: str) -> InitialModel:
    """The sum's one-module model, all zeros: ``length`` counts, then the public scale slot."""
    spec = ModelSpec(version=0, modules=(ModuleSpec(name=s.module, shape=(s.length + 1,), kind=ModuleKind.SHARED),))
    return InitialModel.create(task=s.name, dictionary_hash=dictionary_hash, spec=spec,
                               state={s.module: np.zeros(s.length + 1)})


def run_setup(models: RunModels, *, side: Any, transport: Transport, event: EventSink) -> RunModels:
    """Run every set-up sum of ``models`` (module docstring) in the first audit run of ``side``
    (a :class:`~.assemble.ServerSide`; its ``first_round`` moves past them). Returns the run's
    models on the dictionary the sums derived (unchanged when none did).

    Raises:
        ConfigError: :func:`check_setup`; or the hospitals agree the run cannot go on (their reason).
        ProtocolError: too few hospitals take part, or hospitals derived different results.
    """
    if not models.setup:
        return models
    derived = run_setup_sums(models.setup, dictionary_hash=models.dictionary_hash, side=side, transport=transport,
                             event=event)
    return models if derived == models.dictionary_hash else models.on_dictionary(derived)


def run_setup_sums(sums: Sequence[SetupSum], *, dictionary_hash: str, side: Any, transport: Transport,
                   event: EventSink) -> str:
    """:func:`run_setup` for ``sums`` over dictionary ``dictionary_hash``; returns the digest of
    the dictionary the hospitals agreed to train with afterwards."""
    check_setup_sums(sums, secure_mode=side.federation.secure_mode,
                     distributed_dp=side.dp_policy is not None and side.dp_policy.distributed is not None, journal=False)
    opened = side.audit is None
    audit = side.audit or side.open_audit()
    side.audit = None
    try:
        for index, s in enumerate(sums):
            dictionary_hash = _one_sum(s, index=index, count=len(sums), dictionary_hash=dictionary_hash,
                                       side=side, audit=audit, transport=transport, event=event)
    except BaseException:
        if opened:
            audit.close()
        else:
            side.audit = audit  # its owner (the ServerApp, a caller's trail) closes it
        raise
    side.audit = audit
    return dictionary_hash


def _one_sum(s: SetupSum, *, index: int, count: int, dictionary_hash: str, side: Any, audit: Any,
             transport: Transport, event: EventSink) -> str:
    fed = side.federation.model_copy(update={"rounds": 1, "strategy": "fedsgd", "server_lr": 1.0,
                                             "strategy_options": {}, "local_epochs": 1})
    round_ = side.first_round
    if s.announce is not None:
        audit.record(s.name, {**json.loads(s.announce), "secure_mode": fed.secure_mode})
    msg = seal(SetupAnnounce(federation_id=fed.id, sum=s, index=index, count=count, round=round_,
                             dictionary_hash=dictionary_hash, secure_mode=fed.secure_mode), side.identity)
    names = tuple(sorted(set(transport.hospitals()) & set(side.enrolled)))
    answers, failed = transport.exchange("setup", {n: {"step": b"setup/sum", "data": msg} for n in names},
                                         round_=round_)
    refused = dict(failed)
    refused.update({n: "no acknowledgement" for n in names if n not in failed and "ok" not in answers.get(n, {})})
    for name, why in sorted(refused.items()):
        event("refused", {"round": round_, "hospital": name, "stage": "setup/sum", "reason": why[:300], "final": False})
        audit.record("hospital_refused", {"round": round_, "stage": "setup", "client": name,
                                          "reason": f"setup/sum {s.name}: {why}"[:4000], "signed": False,
                                          "final": False})
    accepted = [n for n in names if n not in refused]
    need = min(fed.min_clients, len(side.enrolled))
    if len(accepted) < need:
        raise ProtocolError(f"Only {len(accepted)} hospital(s) took part in the set-up sum {s.name!r} "
                            f"({', '.join(accepted) or 'none'}); the federation needs {need}. Refused: "
                            + "; ".join(f"{n}: {why[:300]}" for n, why in sorted(refused.items())))
    server = build_server(federation=fed, identity=side.identity, enrolled=side.enrolled,
                          initial=sum_model(s, dictionary_hash=dictionary_hash), audit=audit, dp_policy=None)
    server.round = round_
    outcomes = run_rounds(server, Restricted(transport, accepted), rounds=1, on_event=event)
    if not outcomes:
        raise ProtocolError(f"The set-up sum {s.name!r} did not aggregate (too few hospitals; see run_ended).")
    result = outcomes[-1].result
    close = seal(SetupClose(federation_id=fed.id, name=s.name, round=result.round,
                            contributors=len(result.contributors)), side.identity)
    delivered = [n for n in accepted if n not in outcomes[-1].dropped]  # the hospitals that hold the summed model
    answers, failed = transport.exchange("setup", {n: {"step": b"setup/result", "data": close} for n in delivered},
                                         round_=result.round)
    agreed: dict[tuple[str, str | None, str | None], list[str]] = {}
    for name in sorted(answers):
        try:
            got = open_envelope(parse_envelope(answers[name][RESULT_PART]), sender=side.enrolled[name],
                                model=SetupResult)
            if (got.federation_id, got.name, got.round, got.client) != (fed.id, s.name, result.round, name):
                raise ProtocolError(f"a result for {got.name!r} round {got.round} from {got.client!r}")
        except (KeyError, ProtocolError, ValueError) as exc:
            failed[name] = f"its set-up result was not accepted: {exc}"[:4000]
            continue
        agreed.setdefault((got.outcome, got.dictionary_hash, got.error), []).append(name)
    for name, why in sorted(failed.items()):
        event("refused", {"round": result.round, "hospital": name, "stage": "setup/result", "reason": why[:300],
                          "final": False})
    if not agreed:
        raise ProtocolError(f"No hospital returned the result of the set-up sum {s.name!r}: "
                            + "; ".join(f"{n}: {why[:300]}" for n, why in sorted(failed.items())))
    if len(agreed) > 1:
        groups = "; ".join(f"{', '.join(who)} derived {json.dumps(key[0])[:120]}…" for key, who in agreed.items())
        raise ProtocolError(f"Hospitals derived different results from the set-up sum {s.name!r} ({groups}); the "
                            "federation is inconsistent. Use the same dictionary file, hospital.toml settings and "
                            "SDK version at every hospital.")
    ((outcome, derived, error), who), = agreed.items()
    audit.record(s.result_kind, json.loads(outcome))
    event("setup_sum", {"name": s.name, "round": result.round, "hospitals": who,
                        "contributors": len(result.contributors)})
    side.first_round = server.round
    if error is not None:
        raise ConfigError(error)
    return derived or dictionary_hash
