"""One set-up round that sums a vector of non-negative counts over the hospitals through the
secure mode, before training: the federated histograms of :mod:`.scaling` and the feature
coverage of :mod:`.coverage`.

Run by the one round loop (:func:`clinograph.secure.runtime.run_rounds`), never by a loop of
its own. Each hospital writes ``c · counts`` and ``c`` as the weighted update of one shared
module (``c`` a public scale that keeps every value inside the masked mode's fixed-point range;
counts above ``cap`` are capped). Its aggregation weight is 1 at every hospital, so the weight
reveals nothing. The round runs FedSGD at server learning rate 1 under the federation's secure
mode (``masked``; or ``insecure_plaintext`` by name): the global module moves by
``c · (Σ_k v_k, K) / K`` (K contributors), so the server learns the sum only, never a hospital's
vector, and every hospital decodes ``Σ_k v_k`` from the signed global model and the round's
public contributor count.

Not wired: CKKS (the hospitals would decrypt the sum), DP (the sum is exact), Flower.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from clinograph.secure.audit import AuditTrail
from clinograph.secure.errors import ConfigError, ProtocolError
from clinograph.secure.identity import Identity, PublicIdentity
from clinograph.secure.runtime import InProcessTransport, build_server, run_rounds
from clinograph.secure.runtime.build import InitialModel
from clinograph.secure.runtime.config import FederationSection
from clinograph.secure.spec import ModuleKind
from torch import nn

from ..config import ReleaseSection
from ..model.modules import ModuleMap, Piece
from ..training.trainer import TrainOutcome
from .client import HospitalClient
from .task import TaskBase

#: the secure modes a set-up round runs under (CKKS would have the hospitals decrypt the sum: not wired)
SECURE_SUM_MODES = ("masked", "insecure_plaintext")


class SecureSumTask(TaskBase):
    """One hospital's share of a secure-sum round (implements
    :class:`~clinograph.sdk.federation.task.Task`).

    ``train`` writes ``local = global − c · (v, 1)`` so that the client's weighted delta
    ``1 · (global − local)`` is ``c · (v, 1)``; nothing is trained.
    """

    def __init__(self, vector: np.ndarray, *, name: str, module: str, cap: float):
        self.name, self.module, self.cap = name, module, float(cap)
        self._vector = np.asarray(vector, dtype=np.float64).ravel()
        if np.any(self._vector < 0) or not np.all(np.isfinite(self._vector)):
            raise ValueError("a secure-sum vector holds finite, non-negative counts")
        self._param = nn.Parameter(torch.zeros(self._vector.size + 1, dtype=torch.float64), requires_grad=False)
        self.modules = ModuleMap()
        self.modules.add(module, ModuleKind.SHARED, [Piece(self._param)])

    def __repr__(self) -> str:
        return f"SecureSumTask(name={self.name!r}, length={self._vector.size})"

    @property
    def num_samples(self) -> int:
        return 1  # the weight: the same at every hospital, so it reveals nothing

    def train(self, *, round_: int, epochs: int, plan_options: Mapping[str, float | int | str | bool]) -> TrainOutcome:
        from ..training.selection import value_bound

        c = value_bound(plan_options) / self.cap
        vec = np.concatenate([np.minimum(self._vector, self.cap), [1.0]]) * c
        with torch.no_grad():
            self._param.sub_(torch.from_numpy(vec))
        return TrainOutcome(loss=0.0, used_similar_to=False)

    def trained_modules(self, outcome: TrainOutcome) -> list[str]:
        return [self.module]

    def after_round(self) -> None:
        return None

    def summed(self, *, contributors: int) -> np.ndarray:
        """``Σ_k v_k`` decoded from the loaded global module (flat).

        FedSGD publishes the weighted *mean* ``c · (Σ_k v_k, K) / K`` (weights 1), so the ratio
        to the scale slot is ``Σ_k v_k / K``; ``contributors`` = K, the round's contributor count
        (public: the audit trail lists the contributors).
        """
        moved = -self.modules.get(self.module)
        if not moved[-1] > 0 or contributors < 1:
            raise ProtocolError(f"The {self.name} sum carries no scale: no hospital contributed to the round.")
        return moved[:-1] / moved[-1] * contributors

    def evaluate(self, split: str) -> dict[str, float]:
        return {}

    def quality(self) -> dict[str, float]:
        raise ConfigError(f"The {self.name} round has no quality metrics; use [release] metrics = 'none'.")

    def feature_relevance(self) -> dict[str, float]:
        return {}

    def predict(self) -> np.ndarray:
        raise ConfigError(f"The {self.name} round has no model to predict with.")


def run_secure_sum(tasks: Mapping[str, SecureSumTask], *, dictionary_hash: str, federation: FederationSection,
                   server_identity: Identity, identities: Mapping[str, Identity],
                   audit: AuditTrail, first_round: int = 0) -> tuple[np.ndarray, int, int]:
    """Run one secure-sum round over ``tasks`` (one per hospital, same name, module and length),
    numbered ``first_round`` in ``audit`` (a second set-up round continues the numbering).

    Returns ``(Σ_k v_k, K contributors, the server's round counter after the round)``.

    Raises:
        ConfigError: a secure mode other than masked / insecure_plaintext.
        ProtocolError: hospitals decoded different sums (an inconsistent federation).
    """
    first = next(iter(tasks.values()))
    if federation.secure_mode not in SECURE_SUM_MODES:
        raise ConfigError(f"The {first.name} set-up round runs under secure_mode 'masked' (or insecure_plaintext); "
                          f"{federation.secure_mode!r} is not wired for it yet. Use 'masked' for this federation, "
                          "or turn off the option that needs the round.")
    publics: dict[str, PublicIdentity] = {n: i.public for n, i in identities.items()}
    clients = {n: HospitalClient(task=task, identity=identities[n], server=server_identity.public, peers=publics,
                                 dictionary_hash=dictionary_hash, federation_id=federation.id,
                                 release=ReleaseSection()) for n, task in tasks.items()}
    initial = InitialModel.create(task=first.name, dictionary_hash=dictionary_hash,
                                  spec=first.modules.spec(version=0), state=first.modules.state(ModuleKind.SHARED))
    fed = federation.model_copy(update={"rounds": 1, "strategy": "fedsgd", "server_lr": 1.0, "strategy_options": {},
                                        "local_epochs": 1})
    server = build_server(federation=fed, identity=server_identity, enrolled=publics, initial=initial, audit=audit,
                          dp_policy=None)
    server.round = first_round
    outcome = run_rounds(server, InProcessTransport(clients), rounds=1)[-1]
    k = len(outcome.result.contributors)
    sums = {n: t.summed(contributors=k) for n, t in tasks.items()}
    total = next(iter(sums.values()))
    if any(not np.allclose(s, total, atol=1e-6) for s in sums.values()):
        raise ProtocolError(f"Hospitals decoded different {first.name} sums; the federation is inconsistent.")
    return total, k, server.round

