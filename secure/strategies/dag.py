"""DAG voting as a server strategy (F-CMs section 4.2.1), wrapping a parameter strategy.

Each hospital's vote -- :func:`clinograph.secure.dag_voting.encode_vote` over its view's
adjacency -- is one more shared module of its update, :data:`~clinograph.secure.dag_voting.VOTE_MODULE`,
weighted by the hospital's aggregation weight ``alpha_k = w_k`` like every other module. So
votes travel through the round's secure mode exactly like parameters: under ``masked`` the
server learns the tally and nothing about any single vote.

The vote module's global value is the *accumulated* tally (the sum of every round's summed
votes, section 4.2.2: the federation is monotone, a concept once supported stays). A round's
``apply``:

- hands every other module to the inner strategy (``fedavg`` by default) unchanged;
- adds the round's summed votes to the tally held in the state;
- decides the DAG on the accumulated tally (:func:`~clinograph.secure.dag_voting.decide_from_sum`,
  a deterministic function of the tally, the task, the seed and the round; the tally is
  rounded to :data:`~clinograph.secure.dag_voting.TALLY_RESOLUTION` first, so the masked
  mode's fixed-point error cannot change the decision).

Hospitals recover the tally from the signed global model, so in ``ckks`` mode (server blind)
they apply this same strategy to the sums they decrypted and reach the same DAG.

The decision is offered to the server's audit hook (:meth:`audit_records`): one
``dag_outcome`` entry a round, also published as the artefact ``round-<r>/dag_outcome.json``.

What this strategy does not do: change the model's architecture. The ModelSpec is fixed for
a federation; adapting the concept modules to a new DAG (F-CMs E1/E2) happens outside the
protocol (docs/concepts.md, "What runs inside the protocol").
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from clinograph.core.errors import ConfigError

from ..aggregation.base import ModuleSums
from ..dag_voting import VOTE_MODULE, DagOutcome, decide_from_sum, vote_length
from .base import Strategy
from .fedavg import FedAvg, FedSGD


def _concept_list(concepts: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The concept list from a comma-separated string or a TOML array of strings (an array was read as
    its Python repr before: ``["a", "b"]`` became the names "['a'" and "'b']")."""
    if isinstance(concepts, list | tuple) and all(isinstance(c, str) for c in concepts):
        concepts = ",".join(concepts)
    if not isinstance(concepts, str):
        raise ConfigError(f"dag_voting: concepts must be a comma-separated string or an array of strings, got a "
                          f"{type(concepts).__name__}. Set [federation.strategy_options] concepts = \"c1,c2,...,task\".")
    names = tuple(c.strip() for c in concepts.split(",") if c.strip())
    problems = []
    if len(names) < 2:
        problems.append(f"needs at least 2 names, got {len(names)}")
    if len(set(names)) != len(names):
        problems.append("repeats a name")
    if problems:
        raise ConfigError(f"dag_voting: concepts = {concepts[:200]!r} {' and '.join(problems)}. Set "
                          "[federation.strategy_options] concepts = \"c1,c2,...,task\" (comma-separated, in one "
                          "fixed order).")
    return names


class DagVoting(Strategy):
    """Module-wise inner strategy for the parameters + DAG voting on :data:`VOTE_MODULE`.

    Args:
        concepts: the federation's global concept list, task included, comma-separated or an
            array of strings (the order every hospital encodes its vote in; a plan option, public).
        task: the task node (always given a parent when active), or ``""`` for none.
        seed: public seed of the tie-break (decisions are deterministic per seed and round).
        inner: ``fedavg`` (default) or ``fedsgd`` for every module but the vote.
        server_lr: FedSGD's server learning rate (only with ``inner = "fedsgd"``).
    """

    name = "dag_voting"
    server_reads_sum = True  # the M-step / the DAG decision reads the sum

    def __init__(self, concepts: str | list[str], task: str = "", seed: int = 0, inner: str = "fedavg",
                 server_lr: float = 1.0):
        self.concepts = _concept_list(concepts)
        self.task = str(task) or None
        if self.task is not None and self.task not in self.concepts:
            raise ConfigError(f"dag_voting: task {self.task!r} is not in the concept list; add it to `concepts`.")
        self.seed = int(seed)
        if inner == "fedavg":
            self.inner: FedSGD = FedAvg()
        elif inner == "fedsgd":
            self.inner = FedSGD(server_lr=server_lr)
        else:
            raise ConfigError(f"dag_voting: unknown inner strategy {inner!r}. Registered: fedavg, fedsgd.")
        self._inner_name = inner
        self._round = 0
        self.outcome: DagOutcome | None = None
        self._pending: list[tuple[str, dict]] = []

    def constructor_options(self) -> dict[str, float | int | str | bool]:
        opts: dict[str, float | int | str | bool] = {"concepts": ",".join(self.concepts), "task": self.task or "",
                                                     "seed": self.seed, "inner": self._inner_name}
        if self._inner_name == "fedsgd":
            opts["server_lr"] = self.inner.server_lr
        return opts

    def observe(self, *, round_: int, metrics: Mapping[str, Mapping[str, float]]) -> None:
        """The server calls this before :meth:`apply` each round; the round seeds the tie-break."""
        self._round = int(round_)

    def apply(self, state: Mapping[str, np.ndarray], sums: ModuleSums) -> dict[str, np.ndarray]:
        """Inner strategy on the parameters; the vote module becomes the accumulated tally."""
        params = ModuleSums(sums={k: v for k, v in sums.sums.items() if k != VOTE_MODULE},
                            weights={k: v for k, v in sums.weights.items() if k != VOTE_MODULE},
                            counts={k: v for k, v in sums.counts.items() if k != VOTE_MODULE},
                            contributors=sums.contributors)
        out = self.inner.apply(state, params)
        if VOTE_MODULE not in state:
            raise ConfigError(f"dag_voting needs the module {VOTE_MODULE!r} in the ModelSpec (length "
                              f"{vote_length(len(self.concepts))}); build the initial model with votes.")
        tally = np.asarray(state[VOTE_MODULE], dtype=np.float64).ravel().copy()
        if VOTE_MODULE in sums.sums and sums.weights.get(VOTE_MODULE, 0.0) > 0:
            tally = tally + np.asarray(sums.sums[VOTE_MODULE], dtype=np.float64).ravel()
        out[VOTE_MODULE] = tally.reshape(np.shape(state[VOTE_MODULE]))
        self.outcome = decide_from_sum(concepts=self.concepts, summed=tally, task=self.task, seed=self.seed,
                                       round_=self._round)
        self._pending.append(("dag_outcome", self.outcome.model_dump(mode="json")))
        return out

    def audit_records(self, round_: int) -> list[tuple[str, dict]]:
        """The server's audit hook: ``(kind, payload)`` pairs for ``round_``, each handed out once."""
        out, self._pending = self._pending, []
        return out
