"""Research code: the F-CMs benchmark loop (Algorithm 1, appendix D.2), in one process.

**Not the federation runtime.** This loop reproduces the paper's bnlearn protocol
(research/fcm_bnlearn/fcm_bnlearn.py, numbers in docs/concepts.md): client sampling from a pool that
grows at ``join_round`` (late joiners), re-voting every round on the accumulated tally,
architecture adaptation E1/E2 with warm start, early stopping on a global validation set.
Those need the model's spec to change mid-run, which the runtime's server does not do; it
adds in plaintext, in process, with no signatures, no secure mode and no audit. Hospitals
federate concept models through :func:`clinograph.sdk.concepts.federation.run_concept_federation`
(:class:`~clinograph.sdk.concepts.task.ConceptTask` + the ``dag_voting`` strategy over the
one round loop, masked by default, audited).

Each round: sample ``|K_t|`` clients from the current pool; sum their weighted DAG votes
(:mod:`clinograph.secure.dag_voting`) and decide the shared DAG from the accumulated tally;
adapt the architecture (E1/E2, warm start); every sampled client trains only the modules it
supervises (eq. 2, random interventions) and sends ``n_k · Δ`` with the project's sign
convention ``Δ = θ_global − θ_local`` (NS-FL eq. 7); the server subtracts the weighted mean
of each module over its contributors (4.2.3), as FedAvg does in the runtime.

Differential privacy (``FederationConfig.dp``, research/fcm_bnlearn/fcm_dp.py, docs/concepts.md):

- ``mode="local"`` -- F-CMs appendix E.4: every local step of every client is a DP-SGD step
  (Poisson batch at rate q, per-patient clip C, Gaussian noise σ·C, :func:`~clinograph.sdk.concepts.dp.dp_sgd_step`);
  σ is calibrated by the caller for the client's planned steps.
- ``mode="distributed"`` -- issue 14: one DP-SGD step a round (FedSGD, NS-FL eq. 6). Each
  sampled client Poisson-samples its patients, clips each patient's gradient over the whole
  model (zeros on modules it does not train), scales by the ring's fixed-point scale s,
  rounds to integers and adds a Skellam share Sk(μ/h), μ = (σ·C·s)²
  (:func:`~clinograph.sdk.privacy.distributed.noisy_integer_sum` for the share). Research-loop
  shortcut: the client's clipped SUM (ghost clipping, :func:`~clinograph.sdk.concepts.dp.clipped_sum`)
  is rounded to the nearest integer, not each patient's vector randomly as in the NS-FL path
  (per-patient vectors and CSPRNG coins for ~3e7 coordinates a client-round were the
  bottleneck). The accountant's sensitivity bound (S) of :mod:`clinograph.secure.dp.skellam`
  still holds: rounding errors lie in [−½, ½], so two neighbouring rounded sums differ by the
  patient's scaled clipped vector plus at most 1 per coordinate. Bias ≤ ½/s per coordinate. The integer vectors are
  summed (what the masked mode computes exactly; the masking itself is not run here); the
  server divides each module by Σ q·n_k of its contributors and takes an Adam step.

``kind="opaqnn"``: the opaque baseline in the same loop -- the shared encoder and an MLP head on
the task (a C2BM task node with no parents, :mod:`clinograph.sdk.concepts.opaque`'s network
shape), trained by the clients that have task labels; concepts are not predicted.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from clinograph.sdk.concepts.adapt import adapt_model, count_changed
from clinograph.sdk.concepts.dp import (
    clipped_sum,
    dp_sgd_step,
    module_groups,
    poisson_rows,
    set_gradients,
    trainable_names,
)
from clinograph.sdk.concepts.encoders import MLPEncoder
from clinograph.sdk.concepts.graph import ConceptGraph
from clinograph.sdk.concepts.model import ConceptModel, fcm_loss, random_interventions
from clinograph.sdk.concepts.modules import GRAPH_BASED, ConceptHParams
from clinograph.sdk.concepts.params import (
    freeze_unsupervised,
    load_state_vectors,
    model_spec,
    state_vectors,
)
from clinograph.sdk.concepts.views import ClientView
from clinograph.secure.aggregation.base import LocalUpdate, ModuleSums
from clinograph.secure.dag_voting import (
    VOTE_MODULE,
    DagOutcome,
    decide_dag,
    encode_vote,
    tally_from_sum,
    vote_module_spec,
)

from clinograph.core.errors import ConfigError
from clinograph.core.spec import ModelSpec


def local_dp_steps_per_epoch(sample_rate: float) -> int:
    """DP-SGD steps a local epoch at Poisson rate q: ``max(1, round(1/q))`` (one expected pass
    over the client's data). Was ``⌈1/q⌉``, which at B = 512, n_k = 525 (q ≈ 0.975) took 2 steps
    an epoch -- twice the intended steps and privacy. The caller's accountant must count
    ``rounds × local_epochs ×`` this (:attr:`FCMFederation.dp_steps` records the steps taken)."""
    return max(1, round(1.0 / sample_rate))


@dataclass(frozen=True)
class ConceptDP:
    """Patient-level DP of a run (see the module docstring). σ is relative to ``clip``.

    ``sample_rate``: local -- each client's Poisson rate per local step
    (:func:`local_dp_steps_per_epoch` steps an epoch);
    distributed -- the rate per round. ``min_honest``/``scale``/``server_lr``: distributed only.
    ``clipping``: local only -- ``"flat"`` (eq. 4, the paper's) or ``"per_module"`` (each
    module's part of a patient's gradient clipped to C/√G over the G modules the client trains:
    the same sensitivity C; :func:`~clinograph.sdk.concepts.dp.clipped_sum` ``groups``).
    """

    mode: str
    noise_multiplier: float
    clip: float = 1.0
    sample_rate: float = 1.0
    min_honest: int = 2
    scale: float = 2.0 ** 12
    server_lr: float = 3e-3
    clipping: str = "flat"

    def __post_init__(self) -> None:
        if self.mode not in ("local", "distributed"):
            raise ValueError(f"Unknown DP mode {self.mode!r}. Registered: local, distributed.")
        if self.clipping not in ("flat", "per_module"):
            raise ValueError(f"Unknown clipping {self.clipping!r}. Registered: flat, per_module.")


@dataclass(frozen=True)
class FederationConfig:
    """Hyper-parameters of one federated run (defaults after appendix D.3).

    ``rounds`` is the maximum; with ``patience`` set, training stops once the global
    validation loss has not improved for ``patience`` rounds after the join (appendix D.3:
    up to 200 rounds, patience 10). Before ``join_round`` it never stops, so late joiners
    always arrive.
    """

    kind: str
    rounds: int = 40
    patience: int | None = None
    clients_per_round: int = 10
    n_initial: int = 10
    join_round: int = 10
    local_epochs: int = 2
    batch_size: int = 512
    lr: float = 3e-3
    gamma: float = 0.8
    p_intervention: float = 0.25
    z_dim: int = 64
    encoder_hidden: tuple[int, ...] = (128,)
    hp: ConceptHParams = field(default_factory=ConceptHParams)
    seed: int = 0
    dp: ConceptDP | None = None

    @property
    def model_kind(self) -> str:
        """The ConceptModel instantiation (``opaqnn`` is a parent-free C2BM task node)."""
        return "c2bm" if self.kind == "opaqnn" else self.kind


@dataclass
class ClientData:
    """One hospital: inputs, its labels (``-1`` where missing; only its own nodes) and its view."""

    name: str
    x: torch.Tensor
    labels: dict[str, torch.Tensor]
    view: ClientView

    @property
    def n(self) -> int:  # noqa: D102
        return int(self.x.shape[0])


@dataclass
class FederationResult:
    """The selected model and what happened along the way."""

    model: ConceptModel
    outcome: DagOutcome | None
    best_round: int
    val_loss: list[float]
    arch_changes: list[dict]
    fraction_changed_all: float | None
    fraction_changed_modules: float | None


def aggregate_module_sums(updates: Mapping[str, LocalUpdate]) -> ModuleSums:
    """Module-wise sums over contributors (plaintext, in-process): ``sum_k w_k d_k``, ``sum_k w_k``.

    Same semantics as :meth:`AggregationServer.result` of any secure mode.
    """
    sums: dict[str, np.ndarray] = {}
    weights: dict[str, float] = {}
    counts: dict[str, int] = {}
    for upd in updates.values():
        for name, vec in upd.modules.items():
            sums[name] = sums[name] + vec if name in sums else np.array(vec, dtype=np.float64)
            weights[name] = weights.get(name, 0.0) + upd.weight
            counts[name] = counts.get(name, 0) + 1
    return ModuleSums(sums=sums, weights=weights, counts=counts, contributors=tuple(sorted(updates)))


Summer = Callable[[str, ModelSpec, Mapping[str, LocalUpdate]], ModuleSums]  # (purpose, spec, updates)


def plaintext_sums(purpose: str, spec: ModelSpec, updates: Mapping[str, LocalUpdate]) -> ModuleSums:
    """The default summer: :func:`aggregate_module_sums` (``purpose`` and ``spec`` unused)."""
    return aggregate_module_sums(updates)


class FCMFederation:
    """Server and clients of one F-CMs run, in one process.

    ``summer`` adds up votes (``purpose="votes"``) and module updates (``"updates"``); the
    default is :func:`plaintext_sums` (research code: no secure mode here, see the module docstring).
    """

    def __init__(self, *, config: FederationConfig, concepts: Sequence[str], task: str,
                 cards: Mapping[str, int], clients: Sequence[ClientData], in_dim: int,
                 val: tuple[torch.Tensor, dict[str, torch.Tensor]], summer: Summer = plaintext_sums):
        self.summer = summer
        self.cfg, self.concepts, self.task, self.cards = config, tuple(concepts), task, dict(cards)
        self.clients, self.val = list(clients), val
        torch.manual_seed(config.seed)
        self.rng = np.random.default_rng(config.seed)
        self.gen = torch.Generator().manual_seed(config.seed)
        self.graph = ConceptGraph(nodes=(), cards=self.cards, parents={}, task=task)
        encoder = MLPEncoder(in_dim, config.z_dim, config.encoder_hidden)
        self.model = ConceptModel(kind=config.model_kind, encoder=encoder, graph=self.graph, z_dim=config.z_dim,
                                  hp=config.hp)
        self.tally = None
        self.known: set[str] = set()
        self.outcome: DagOutcome | None = None
        self._global_vecs: dict[str, np.ndarray] | None = None
        self._global_sd: dict[str, torch.Tensor] | None = None
        self._scratch: ConceptModel | None = None
        self._server_opt: torch.optim.Optimizer | None = None  # distributed DP: the server's Adam
        #: local DP: DP-SGD steps each client actually took (for checking the accountant's plan)
        self.dp_steps: dict[str, int] = {}

    # -- server: structure ---------------------------------------------------------------
    def vote(self, sampled: Sequence[ClientData], round_: int) -> ConceptGraph:
        """Sum the sampled clients' votes, decide the DAG on the accumulated tally, build the graph."""
        updates = {c.name: LocalUpdate(modules={VOTE_MODULE: encode_vote(
            concepts=self.concepts, local_nodes=c.view.nodes, scores=c.view.adjacency(), weight=float(c.n))},
            weight=float(c.n)) for c in sampled}
        spec = ModelSpec(version=round_, modules=(vote_module_spec(self.concepts),))
        tally = tally_from_sum(concepts=self.concepts, summed=self.summer("votes", spec, updates).sums[VOTE_MODULE])
        self.tally = tally if self.tally is None else self.tally + tally
        self.outcome = decide_dag(self.tally, task=self.task, seed=self.cfg.seed * 100_003 + round_,
                                  round_=round_, known=self.known)
        active = [c for c, a in zip(self.concepts, self.outcome.active, strict=True) if a]
        self.known.update(active)
        if self.cfg.kind == "opaqnn":
            return ConceptGraph.from_edges(nodes=[self.task] if self.task in active else [], edges=[], task=self.task,
                                           cards=self.cards)
        if self.cfg.kind in GRAPH_BASED:
            return ConceptGraph.from_edges(nodes=active, edges=self.outcome.edges(), task=self.task, cards=self.cards)
        return ConceptGraph.bipartite(concepts=[c for c in active if c != self.task], task=self.task,
                                      cards=self.cards, with_task=self.task in active)

    # -- client: module-specific local training -------------------------------------------
    def local_update(self, client: ClientData) -> LocalUpdate:
        """Train a copy of the global model on the client's supervision; return ``n_k · Δ`` with
        ``Δ = θ_global − θ_local`` (NS-FL eq. 7, the project's convention)."""
        if self._scratch is None or self._scratch.graph != self.model.graph:
            self._scratch = copy.deepcopy(self.model)  # one copy per architecture, reloaded per client
        local = self._scratch
        local.load_state_dict(self._global_sd if self._global_sd is not None else self.model.state_dict())
        for p in local.parameters():
            p.grad = None
        supervised = set(client.view.nodes) - {self.task}
        names = freeze_unsupervised(local, supervised=supervised, has_task=client.view.has_task)
        opt = torch.optim.Adam([p for p in local.parameters() if p.requires_grad], lr=self.cfg.lr)
        graph_nodes = set(local.graph.nodes)
        dp = self.cfg.dp
        if dp is not None and self._has_signal(client, graph_nodes):  # F-CMs E.4: every local step is DP-SGD
            names_p = trainable_names(local)
            groups = module_groups(local, names_p) if dp.clipping == "per_module" else None
            for _ in range(self.cfg.local_epochs * local_dp_steps_per_epoch(dp.sample_rate)):
                self.dp_steps[client.name] = self.dp_steps.get(client.name, 0) + 1
                idx = torch.as_tensor(poisson_rows(client.n, dp.sample_rate), dtype=torch.long)
                labels = {v: y[idx] for v, y in client.labels.items()}
                iv = random_interventions(labels, nodes=sorted(supervised & graph_nodes), p=self.cfg.p_intervention,
                                          generator=self.gen)
                dp_sgd_step(local, opt, names_p, client.x[idx], labels, iv, noise_multiplier=dp.noise_multiplier,
                            clip=dp.clip, expected_batch=dp.sample_rate * client.n, supervised=supervised,
                            has_task=client.view.has_task, task=self.task, gamma=self.cfg.gamma, groups=groups)
        for _ in range(0 if dp is not None else self.cfg.local_epochs):
            perm = torch.randperm(client.n, generator=self.gen)
            for s in range(0, client.n, self.cfg.batch_size):
                idx = perm[s:s + self.cfg.batch_size]
                labels = {v: y[idx] for v, y in client.labels.items()}
                iv = random_interventions(labels, nodes=sorted(supervised & graph_nodes), p=self.cfg.p_intervention,
                                          generator=self.gen)
                out = local(client.x[idx], interventions=iv)
                loss = fcm_loss(out, labels, supervised=supervised, has_task=client.view.has_task,
                                task=self.task, gamma=self.cfg.gamma)
                if not loss.requires_grad:
                    continue
                opt.zero_grad()
                loss.backward()
                opt.step()
        w = float(client.n)
        base = self._global_vecs if self._global_vecs is not None else state_vectors(self.model)
        now = state_vectors(local)
        mods = {n: w * (base[n] - now[n]) for n in names}
        return LocalUpdate(modules=mods, weight=w)

    def _has_signal(self, client: ClientData, graph_nodes: set[str]) -> bool:
        """Whether the client supervises any node of the current model (else it has nothing to train)."""
        return bool((set(client.view.nodes) - {self.task}) & graph_nodes) or (
            client.view.has_task and self.task in graph_nodes)

    # -- distributed DP: one DP-SGD step a round -----------------------------------------------
    def distributed_round(self, sampled: Sequence[ClientData]) -> None:
        """Every sampled client's noisy integer sum over the whole model; the server applies the
        module-wise mean of the noisy sum with Adam (see the module docstring)."""
        from clinograph.sdk.privacy.distributed import noisy_integer_sum

        dp = self.cfg.dp
        if dp is None:
            raise ConfigError("distributed_round needs FederationConfig.dp (mode 'distributed'); this federation "
                              "has no DP settings. Set FederationConfig(dp=ConceptDP(mode='distributed', noise_multiplier=...)) or run a plain round.")
        model = self.model
        all_names = [n for n, _ in model.named_parameters()]
        sizes = {n: p.numel() for n, p in model.named_parameters()}
        offsets, at = {}, 0
        for n in all_names:
            offsets[n] = at
            at += sizes[n]
        share = (dp.noise_multiplier * dp.clip * dp.scale) ** 2 / dp.min_honest
        total = np.zeros(at, dtype=np.int64)
        denom = dict.fromkeys(all_names, 0.0)
        graph_nodes = set(model.graph.nodes)
        for c in sampled:
            supervised = set(c.view.nodes) - {self.task}
            freeze_unsupervised(model, supervised=supervised, has_task=c.view.has_task)
            names = trainable_names(model) if self._has_signal(c, graph_nodes) else []
            idx = torch.as_tensor(poisson_rows(c.n, dp.sample_rate), dtype=torch.long)
            labels = {v: y[idx] for v, y in c.labels.items()}
            iv = random_interventions(labels, nodes=sorted(supervised & graph_nodes), p=self.cfg.p_intervention,
                                      generator=self.gen)
            cols = np.concatenate([np.arange(offsets[n], offsets[n] + sizes[n]) for n in names]) if names else \
                np.zeros(0, dtype=np.int64)
            rest = np.setdiff1d(np.arange(at), cols)
            z = np.zeros(len(cols), dtype=np.int64)
            if names:  # the clipped sum at the ring scale, rounded to nearest (see the module docstring)
                z = np.rint(dp.scale * clipped_sum(model, names, c.x[idx], labels, iv, clip=dp.clip,
                                                   supervised=supervised, has_task=c.view.has_task, task=self.task,
                                                   gamma=self.cfg.gamma).numpy()).astype(np.int64)
            z += noisy_integer_sum(np.zeros((0, len(cols))), scale=dp.scale, share_variance=share)[0]
            total[cols] += z  # the client's share covers every coordinate, trained or not
            total[rest] += noisy_integer_sum(np.zeros((0, len(rest))), scale=dp.scale, share_variance=share)[0]
            for n in names:
                denom[n] += dp.sample_rate * c.n
        for p in model.parameters():
            p.requires_grad_(True)
        flat = torch.from_numpy(total / dp.scale)
        for n in all_names:  # module-wise mean over the expected batch of its contributors
            flat[offsets[n]:offsets[n] + sizes[n]] /= denom[n] if denom[n] > 0 else math.inf
        if self._server_opt is None:
            self._server_opt = torch.optim.Adam(model.parameters(), lr=dp.server_lr)
        self._server_opt.zero_grad(set_to_none=True)
        set_gradients(model, all_names, flat)
        for n, p in model.named_parameters():
            if denom[n] == 0:
                p.grad = None  # nobody trained it this round: Adam leaves it as it is
        self._server_opt.step()

    # -- server: module-wise aggregation ----------------------------------------------------
    def apply(self, sums: ModuleSums) -> None:
        """FedAvg module-wise: ``phi_j <- phi_j − sum_k n_k Δ_k / sum_k n_k`` over the contributors
        of each module (``Δ = global − local``, so this is the weighted mean of the local models)."""
        cur = state_vectors(self.model)
        load_state_vectors(self.model, {n: cur[n] - sums.mean(n) for n in sums.sums})

    @torch.no_grad()
    def val_loss(self) -> float:
        """Eq. (2) on the global validation set with every label (model selection).

        A node the model does not predict yet is charged the cross-entropy of a uniform guess,
        ``log(card)``, so a model cannot look better by predicting fewer variables.
        """
        x, labels = self.val
        out = self.model(x) if self.model.graph.nodes else None
        loss = 0.0 if out is None else float(fcm_loss(out, labels, supervised=set(self.concepts), has_task=True,
                                                      task=self.task, gamma=self.cfg.gamma))
        for v in self.concepts:
            if v not in self.model.graph.nodes:
                weight = (1.0 - self.cfg.gamma) if v == self.task else self.cfg.gamma
                loss += weight * float(np.log(self.cards[v]))
        return loss

    def run(self) -> FederationResult:
        """All rounds (or until early stopping); the model with the lowest validation loss
        from the join onwards is selected."""
        cfg = self.cfg
        best, best_loss, best_round = None, float("inf"), -1
        losses, changes = [], []
        before_join = None
        for t in range(cfg.rounds):
            pool = self.clients[:cfg.n_initial] if t < cfg.join_round else self.clients
            if t == cfg.join_round:
                before_join = state_vectors(self.model)
            k = min(cfg.clients_per_round, len(pool))
            sampled = [pool[i] for i in sorted(self.rng.choice(len(pool), size=k, replace=False))]
            graph = self.vote(sampled, t)
            if graph != self.model.graph:
                self._server_opt = None  # a new architecture: the server optimiser starts afresh
                self.model, rep = adapt_model(self.model, graph)
                if rep.changed:
                    changes.append({"round": t, "added": rep.added, "rewired": rep.rewired,
                                    "removed": rep.removed, "fraction_changed": rep.fraction_changed})
            if cfg.dp is not None and cfg.dp.mode == "distributed":
                self.distributed_round(sampled)
            else:
                self._global_vecs = state_vectors(self.model)
                self._global_sd = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
                updates = {c.name: self.local_update(c) for c in sampled}
                self.apply(self.summer("updates", model_spec(self.model, version=t), updates))
            losses.append(self.val_loss())
            if t >= min(cfg.join_round, cfg.rounds - 1) and losses[-1] < best_loss:
                best_loss, best_round = losses[-1], t
                best = (self.model.graph, {k: v.detach().clone() for k, v in self.model.state_dict().items()})
            elif cfg.patience is not None and t >= cfg.join_round and t - best_round >= cfg.patience:
                break
        if best is not None:
            graph, sd = best
            best = ConceptModel(kind=cfg.model_kind, encoder=copy.deepcopy(self.model.encoder), graph=graph,
                                z_dim=cfg.z_dim, hp=cfg.hp)
            best.load_state_dict(sd)
        frac_all = frac_mod = None
        if before_join is not None and best is not None:
            after = state_vectors(best)
            tot, ch = count_changed(before_join, after)
            frac_all = ch / tot
            keep = [n for n in after if not n.startswith("encoder/")]
            tot, ch = count_changed({n: before_join[n] for n in keep if n in before_join}, {n: after[n] for n in keep})
            frac_mod = ch / tot if tot else 0.0
        return FederationResult(best if best is not None else self.model, self.outcome, best_round, losses,
                                changes, frac_all, frac_mod)
