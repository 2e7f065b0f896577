"""A FedNSL federation as the one run (Algorithm 1 / 2 over signed rounds and a secure mode):
:func:`clinograph.secure.runtime.run.run_federation` with one candidate, the rule model.

Each round: every hospital's :class:`~.task.RulesTask` draws the round's candidates from the
prior in the signed global model, runs its E-step and sends ``w_i · p_i`` through the round's
secure mode (``masked`` by default); the ``fednsl_rules`` strategy turns the sum into the
mixture, runs the M-step and records the ``rules`` entry; hospitals load the new prior.

What runs where:

- hospitals (the SDK, torch): the graph, the E-step, the personalised rule model;
- the server (``clinograph.secure``, no torch): summing, the mixture, the audit trail and the
  built-in categorical M-step;
- the transformer generator (torch): in a deployment a rule service next to the server (it
  needs only the mixture the server already sees); here, in simulation, it runs in this
  process and is attached to the strategy as its M-step.

The paper's own variant -- the server receives each hospital's posterior in the clear and
samples from each -- is :func:`insecure_per_hospital_posteriors`: it warns, is marked in the
audit log and is refused when ``environment = "production"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from clinograph.secure.audit import AuditTrail
from clinograph.secure.policy import Environment, require_allowed
from clinograph.secure.runtime import InProcessTransport
from clinograph.secure.runtime.assemble import ServerSide
from clinograph.secure.runtime.build import InitialModel
from clinograph.secure.runtime.config import FederationSection
from clinograph.secure.runtime.models import RunModels
from clinograph.secure.runtime.run import run_federation
from clinograph.secure.server import FederationServer

from clinograph.core.errors import ConfigError
from clinograph.core.identity import Identity
from clinograph.core.spec import ModuleKind

from ..config import ReleaseSection
from ..federation.client import HospitalClient
from .client import HospitalRules
from .generator import RuleGenerator
from .rules import RuleSpace
from .task import RulesTask


@dataclass
class RulesFederation:
    """What a run leaves: the server (None for the insecure variant), each hospital's task, the
    priors after every round (index 0: the initial prior)."""

    server: FederationServer | None
    tasks: dict[str, RulesTask]
    priors: list[np.ndarray]


def write_rule_space(space: RuleSpace, path: Path) -> str:
    """Write the public rule space file the strategy loads; returns its SHA-256 (pinned in the plan)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(space.to_json())
    return space.sha256()


def _initial_prior(space: RuleSpace, generator: RuleGenerator | None) -> np.ndarray:
    if generator is not None:
        return generator.prior()
    return np.full((len(space.heads), space.n_bodies), 1.0 / space.n_bodies)


def attach_generator(server: FederationServer, generator: RuleGenerator) -> None:
    """Make ``generator`` (the transformer T_θ, eqs. 5-6) the M-step of the server's ``fednsl_rules``
    strategy: each round it samples from the public mixture with the round's public seed
    (:func:`clinograph.secure.strategies.rules.round_seed`), refits, and its prior is the next one."""
    def m_step(mixture: np.ndarray, public_seed: int) -> np.ndarray:
        # the round's public seed: public sampling from the mixture the server sees, not a secret
        generator.m_step(mixture, rng=np.random.default_rng(public_seed))
        return generator.prior()

    server.strategy.attach_m_step(m_step, generator="transformer")  # type: ignore[attr-defined]


def attach_transformer(server: FederationServer) -> None:
    """The ServerApp's ``server-extension`` for FedNSL over Flower
    (``--run-config "server-extension='clinograph.sdk.fednsl.federation:attach_transformer'"``):
    a :class:`~.generator.RuleGenerator` (preset SMALL, seeded with the strategy's public seed) over
    the rule space the server's ``fednsl_rules`` strategy pinned, as its M-step. Needs torch beside
    the server. The first round's prior is the initial model's (uniform), as ``model init`` wrote it;
    the generator keeps state the server cannot journal, so the strategy refuses a crash journal with it."""
    from clinograph.secure.strategies.rules import FedNSLRules

    strategy = server.strategy
    if not isinstance(strategy, FedNSLRules):
        raise ConfigError(f"server-extension attach_transformer is FedNSL's M-step; this server's strategy is "
                          f"{getattr(strategy, 'name', type(strategy).__name__)!r}. Set [federation] strategy = "
                          "'fednsl_rules' or remove the extension.")
    preds = tuple(sorted({p for body in strategy.bodies for p in body}))
    space = RuleSpace(heads=tuple(strategy.heads), predicates=preds, bodies=tuple(strategy.bodies))
    attach_generator(server, RuleGenerator(space, seed=int(strategy.seed)))


def run_rules_federation(*, hospitals: Mapping[str, HospitalRules], tests: Mapping[str, np.ndarray],
                         space: RuleSpace, federation: FederationSection, audit: AuditTrail,
                         server_identity: Identity, dictionary_hash: str, workdir: Path,
                         generator: RuleGenerator | None) -> RulesFederation:
    """``federation.rounds`` FedNSL rounds over the runtime (module docstring).

    Raises:
        ConfigError: ``ckks`` (the server must see the mixture to run the M-step and audit the rules).
    """
    from clinograph.secure.aggregation import create_mode

    if not create_mode(federation.secure_mode).server_sees_sum:
        raise ConfigError(f"FedNSL runs in 'masked' mode (or insecure_plaintext): under {federation.secure_mode} the "
                          "server never sees the mixture of posteriors it must sample from and audit.")
    sha = write_rule_space(space, Path(workdir) / "rule_space.json")
    fed = federation.model_copy(update={"strategy": "fednsl_rules", "strategy_options": {
        "rule_space": str(Path(workdir) / "rule_space.json"), "rule_space_sha256": sha, "seed": federation.seed}})
    prior0 = _initial_prior(space, generator)
    tasks = {n: RulesTask(rules=h, prior=prior0, test=tests[n], seed=federation.seed) for n, h in hospitals.items()}
    ids = {n: Identity.generate(n) for n in tasks}
    publics = {n: i.public for n, i in ids.items()}
    # in-process hospitals, all configured by this run's operator: they accept the run's t (ckks_threshold, masked)
    release = ReleaseSection(tckks_threshold=getattr(federation, "tckks_threshold", None),
                             masked_threshold=getattr(federation, "masked_threshold", None),
                             insecure_accept_plaintext=federation.secure_mode == "insecure_plaintext",
                             **({} if federation.secure_mode == "insecure_plaintext" else
                                {"secure_modes": (federation.secure_mode,)}))
    clients = {n: HospitalClient(task=t, identity=ids[n], server=server_identity.public, peers=publics,
                                 dictionary_hash=dictionary_hash, federation_id=fed.id, release=release)
               for n, t in tasks.items()}
    first = next(iter(tasks.values()))
    initial = InitialModel.create(task=first.name, dictionary_hash=dictionary_hash,
                                  spec=first.modules.spec(version=0), state=first.modules.state(ModuleKind.SHARED))
    built: list[FederationServer] = []

    def configure(server: FederationServer) -> None:
        built.append(server)
        if generator is not None:
            attach_generator(server, generator)

    priors = [prior0]
    side = ServerSide(federation=fed, identity=server_identity, enrolled=publics, dp_policy=None,
                      audit_dir=audit.directory, audit=audit, configure=configure)
    run_federation(RunModels.single(initial), side=side, transport=InProcessTransport(clients), rounds=fed.rounds,
                   on_round=lambda _run, _r, _outcome: priors.append(next(iter(tasks.values())).prior()))
    server = built[0]
    return RulesFederation(server=server, tasks=tasks, priors=priors)


def insecure_per_hospital_posteriors(*, hospitals: Mapping[str, HospitalRules], tests: Mapping[str, np.ndarray],
                                     space: RuleSpace, rounds: int, seed: int, environment: Environment,
                                     generator: RuleGenerator | None, audit: AuditTrail | None = None
                                     ) -> RulesFederation:
    """The paper's plaintext Algorithm 1: the server sees **each** hospital's posterior and samples
    from each. INSECURE: a posterior over rules is a summary of one hospital's patients. Warns
    every time, is recorded as an ``insecure_option`` when ``audit`` is given, and raises
    :class:`~clinograph.core.errors.SecurityPolicyError` in production."""
    why = "the server receives every hospital's rule posterior in the clear, not only their sum"
    require_allowed("insecure_per_hospital_posteriors", environment=environment, why=why)
    if audit is not None:
        audit.record("insecure_option", {"option": "insecure_per_hospital_posteriors", "why": why})
    prior = _initial_prior(space, generator)
    tasks = {n: RulesTask(rules=h, prior=prior, test=tests[n], seed=seed) for n, h in hospitals.items()}
    # public-seeded sampling of rules from posteriors the server already sees in this variant: not a secret
    priors, rng = [prior], np.random.default_rng(seed)
    counts = np.zeros_like(prior)
    for r in range(rounds):
        posts = {n: t.rules.e_step(prior, round_=r, seed=seed) for n, t in tasks.items()}
        for post in posts.values():  # Algorithm 1 line 13: samples from each posterior
            if generator is not None:
                generator.m_step(post, rng=rng)
            else:
                counts += np.stack([rng.multinomial(512, row / row.sum()) if row.sum() > 0 else 0 * row
                                    for row in post])
        prior = generator.prior() if generator is not None else (counts + 0.01) / (counts + 0.01).sum(1, keepdims=True)
        for t in tasks.values():
            t.modules.set("rules/prior", prior.ravel())
        priors.append(prior)
    return RulesFederation(server=None, tasks=tasks, priors=priors)
