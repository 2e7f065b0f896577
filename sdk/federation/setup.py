"""The hospital's side of the run's set-up sums (:mod:`clinograph.secure.runtime.setup`): which
sums its config asks for, its share of each, and what it derives from the sums.

Two sums exist: ``scaling_histogram`` (``[scaling] source = "federated"``, :mod:`.scaling`) and
``feature_coverage`` (``[model] features = "shared"`` in the config or a candidate,
:mod:`.coverage`). :func:`setup_sums` describes them from the config and the dictionary alone;
``clinograph model init`` writes that description into the run's models, ``simulate()`` builds it
with the same function, and a hospital builds its share only when the server's signed
announcement names exactly a sum of its own list, in order, over its own dictionary.

The initial models do not depend on the sums: a model's parameter shapes and initial values
come from the dictionary's features and the model settings, never from the features' scales nor
from ``[model] features`` (a feature outside the list keeps its untouched slot; pinned by
tests/sdk/federation/test_setup.py). So ``clinograph model init`` builds them on the base
dictionary and the config as written, and after the set-up:

- the candidates run on the **derived dictionary's digest**, which every hospital derived itself
  and returned signed; a hospital refuses a plan for any other dictionary, and refuses
  ``run/start`` while a sum its config asks for has not run -- the server cannot make it train
  on scales or features its operator did not configure;
- a candidate with ``features = "shared"`` is built on the resolved list (its overrides, and so
  the ``run/start`` digest, still say ``"shared"``: the list is in the ``feature_coverage`` entry).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from clinograph.secure.audit import AuditTrail
from clinograph.secure.runtime.config import FederationSection
from clinograph.secure.runtime.models import SetupAnnounce, SetupClose, SetupResult, SetupSum
from clinograph.secure.runtime.participant import part
from clinograph.secure.runtime.setup import RESULT_PART, SETUP_MODES
from clinograph.secure.wire import open_envelope, parse_envelope, seal

from clinograph.core.errors import ConfigError, ProtocolError
from clinograph.core.identity import Identity, PublicIdentity

from ..config import ScalingSection
from ..ingest.table import PatientTable
from ..ontology.dictionary import FeatureDictionary
from . import coverage, scaling, securesum
from .client import HospitalClient

SHARED_RULE = ("a feature is shared if every contributing hospital observes it in at least one patient; the counts "
               "are the secure sum of the hospitals' 0/1 coverage vectors")
#: the rule under local DP (sdk/privacy/counts.py)
SHARED_RULE_DP = ("a feature is shared if every contributing hospital observes it: under DP, if its noisy count of "
                  "patients observing it (each patient's indicators scaled to L2 norm 1, Gaussian noise σ_set) reaches "
                  "3·σ_set; the counts are the secure sum of the hospitals' 0/1 coverage vectors")


def _canonical(data: Mapping[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def _asks_shared(config: Any, candidates: Sequence[Any]) -> tuple[bool, str]:
    """Whether the config (or one of its candidates) asks for ``features = "shared"``, and who asks."""
    names = [c.name for c in candidates if c.config.model.features == "shared"]
    if config.model.features == "shared":
        return True, "[model] features = \"shared\""
    if names:
        return True, (f"[selection] candidate(s) {', '.join(map(repr, names))} ask for [model] features = "
                      "\"shared\"")
    return False, ""


def setup_sums(config: Any, *, dictionary: FeatureDictionary, candidates: Sequence[Any]) -> tuple[SetupSum, ...]:
    """The set-up sums ``config`` (with its ``candidates``) asks for, in the order they run:
    the histograms first (the coverage is the same on any scale)."""
    out = []
    if config.scaling.source == "federated":
        bins = scaling.public_bins(dictionary, bins=config.scaling.bins, span=config.scaling.span)
        announce = {"features": list(bins.features), "bins": bins.count, "span_half_widths": float(config.scaling.span),
                    "edges": {f: [bins.start[i], bins.stop[i]] for i, f in enumerate(bins.features)},
                    "transforms": {f: dictionary.get(f).transform.value for f in bins.features},
                    "quantiles": config.scaling.quantiles}
        out.append(SetupSum(name="scaling_histogram", module=scaling.HISTOGRAM_MODULE, length=bins.length - 1,
                            cap=float(scaling.MAX_BIN_COUNT), announce=_canonical(announce),
                            result_kind="scaling_derived"))
    if _asks_shared(config, candidates)[0]:
        out.append(SetupSum(name="feature_coverage", module=coverage.COVERAGE_MODULE,
                            length=len(dictionary.node_ids()), cap=1.0, result_kind="feature_coverage"))
    return tuple(out)


def refuse_under_dp(config: Any, candidates: Sequence[Any], *, where: str) -> None:
    """A hospital under *distributed* DP takes part in no set-up sum: under local DP its share is
    a Gaussian release accounted in its ledger (:mod:`clinograph.sdk.privacy.counts`), which the
    distributed-DP trainer does not keep.

    Raises:
        ConfigError: with the fix.
    """
    if not (config.privacy.enabled and config.privacy.mode == "distributed"):
        return
    if config.scaling.source == "federated":
        raise ConfigError(f"{where}: [scaling] source = 'federated' under [privacy] mode = 'distributed' (set-up "
                          "releases are accounted in the local-DP ledger only); use source = 'dictionary', or "
                          "mode = 'local'.")
    shared, asked = _asks_shared(config, candidates)
    if shared:
        raise ConfigError(f"{where}: {asked} under [privacy] mode = 'distributed' (set-up releases are accounted in "
                          "the local-DP ledger only). List the features in [model] features, use \"all\", or use "
                          "mode = 'local'.")


class HospitalSetup:
    """One hospital's set-up sums: its share of each announced sum, then the table, dictionary
    and shared feature list every candidate it builds afterwards uses (module docstring)."""

    def __init__(self, *, table: PatientTable, dictionary: FeatureDictionary, config: Any,
                 candidates: Sequence[Any], identity: Identity, server: PublicIdentity,
                 peers: Mapping[str, PublicIdentity], federation_id: str, state_dir: Path | None = None):
        self.table, self.dictionary = table, dictionary
        self.expected = setup_sums(config, dictionary=dictionary, candidates=candidates)
        #: under local DP: each share is a Gaussian release accounted in the hospital's ledger
        self._dp = _setup_release(table, config, identity=identity, state_dir=state_dir) if self.expected else None
        self._asked_by = _asks_shared(config, candidates)[1]
        self._quantiles = config.scaling.quantiles
        self._accept_plaintext = config.release.insecure_accept_plaintext
        self._masked_threshold = config.release.masked_threshold
        self._identity, self._server, self._peers, self._federation_id = identity, server, dict(peers), federation_id
        #: the resolved ``"shared"`` list (None until the coverage sum ran)
        self.shared: tuple[str, ...] | None = None
        #: the sums done, by name -> the public outcome this hospital returned
        self.done: dict[str, dict[str, Any]] = {}
        #: the share's client while a sum's round runs (plans, stages and the model go to it)
        self.client: HospitalClient | None = None
        self._sum: SetupSum | None = None
        self._round: int | None = None
        self._delivered = False  # the sum's global model reached this hospital

    def __repr__(self) -> str:
        return f"HospitalSetup(sums={[s.name for s in self.expected]!r}, done={list(self.done)!r})"

    @property
    def missing(self) -> list[str]:
        """The sums this hospital's config asks for that have not run."""
        return [s.name for s in self.expected if s.name not in self.done]

    def resolve(self, config: Any) -> Any:
        """``config`` with ``[model] features = "shared"`` replaced by the resolved list.

        Raises:
            ProtocolError: ``"shared"`` before the coverage sum ran.
        """
        if config.model.features != "shared":
            return config
        if self.shared is None:
            raise ProtocolError("[model] features = \"shared\" is not resolved: the feature_coverage set-up sum has "
                                "not run in this federation.")
        return coverage.with_features(config, self.shared)

    def on_round_end(self, global_model: bytes | None) -> bytes | None:
        """The sum's global model: loaded by the share's client (signature, round and digest checked there)."""
        if self.client is None:
            raise ProtocolError("A set-up sum's model arrived while no set-up sum runs.")
        out = self.client.on_round_end(global_model)
        self._delivered = True
        return out

    def on_setup(self, step: str, parts: Mapping[str, bytes]) -> dict[str, bytes]:
        """``setup/sum`` (build the share) or ``setup/result`` (decode, derive, answer signed)."""
        data = part(parts, "data", "setup")
        return self._announce(data) if step == "setup/sum" else self._result(data)

    def _announce(self, data: bytes) -> dict[str, bytes]:
        msg = open_envelope(parse_envelope(data), sender=self._server, model=SetupAnnounce)
        if self.client is not None:  # a new announcement of the pending sum: a new share only if none was sent
            self.client.task.refuse_again(msg.round)  # type: ignore[attr-defined]
        step = len(self.done)
        if msg.federation_id != self._federation_id:
            raise ProtocolError(f"setup/sum for federation {msg.federation_id!r}; this hospital is in "
                                f"{self._federation_id!r}.")
        mine = self.expected[step] if step < len(self.expected) else None
        if mine is None or msg.sum != mine or msg.index != step or msg.count != len(self.expected):
            listed = ", ".join(s.name for s in self.expected) or "none"
            raise ProtocolError(f"Set-up sum {msg.sum.name!r} ({msg.index + 1} of {msg.count}) is not the next one "
                                f"this hospital's config asks for (its sums: {listed}; done: {len(self.done)}). Use the "
                                "same hospital.toml [scaling] and [model] features at every hospital and at "
                                "`clinograph model init`.")
        if msg.dictionary_hash != self.dictionary.digest():
            raise ProtocolError(f"Set-up sum {msg.sum.name!r} over dictionary {msg.dictionary_hash[:12]}…; this "
                                f"hospital has {self.dictionary.digest()[:12]}…. Use the same dictionary file.")
        if msg.secure_mode not in SETUP_MODES:
            raise ProtocolError(f"Set-up sum {msg.sum.name!r} under secure_mode {msg.secure_mode!r}: a hospital "
                                f"answers it under {' or '.join(SETUP_MODES)} only.")
        if mine.name == "scaling_histogram":
            bins = self._bins()
            counts = (None if self._dp is None else
                      self._dp[0].histogram(scaling.clipped_histograms(self.table, bins), round_=msg.round))
            task: securesum.SecureSumTask = scaling.HistogramTask(self.table, bins, counts=counts)
        else:
            vector = (coverage.local_coverage(self.table) if self._dp is None else
                      self._dp[0].coverage(coverage.clipped_coverage(self.table), round_=msg.round))
            task = securesum.SecureSumTask(vector, name=mine.name, module=mine.module, cap=mine.cap)
        if self._dp is not None:  # the round's report carries the release (the server checks it like any ledger entry)
            release, entry = self._dp
            task.ledger_entry = release.ledger.release_entry(round_=msg.round, **entry)
        self.client = securesum.share_client(task, identity=self._identity, server=self._server, peers=self._peers,
                                             dictionary_hash=msg.dictionary_hash, federation_id=msg.federation_id,
                                             accept_plaintext=self._accept_plaintext,
                                             masked_threshold=self._masked_threshold)
        self._sum, self._round, self._delivered = mine, msg.round, False
        return {"ok": b"1"}

    def _bins(self) -> scaling.Bins:
        announce = json.loads(self._sum_named("scaling_histogram").announce or "{}")
        return scaling.public_bins(self.dictionary, bins=int(announce["bins"]), span=float(announce["span_half_widths"]))

    def _sum_named(self, name: str) -> SetupSum:
        return next(s for s in self.expected if s.name == name)

    def _result(self, data: bytes) -> dict[str, bytes]:
        msg = open_envelope(parse_envelope(data), sender=self._server, model=SetupClose)
        s, client = self._sum, self.client
        plan = client.plan if client is not None else None
        if s is None or client is None or plan is None or msg.name != s.name or msg.round != plan.round \
                or msg.federation_id != self._federation_id or not self._delivered:
            raise ProtocolError(f"setup/result for sum {msg.name!r} round {msg.round} does not follow this hospital's "
                                "set-up round (its share sent, the summed model received).")
        total = client.task.summed(contributors=msg.contributors)  # type: ignore[attr-defined]
        derived_hash, error = None, None
        if s.name == "scaling_histogram":
            bins = self._bins()
            derived, stats = scaling.derive_scaling(self.dictionary, counts=total, bins=bins,
                                                    quantiles=self._quantiles)
            self.table, self.dictionary = scaling.rescale(self.table, derived), derived
            derived_hash = derived.digest()
            outcome: dict[str, Any] = {"dictionary_digest": derived_hash, "features_scaled": sorted(stats),
                                       "features_kept_reference": sorted(set(bins.features) - set(stats))}
        else:
            counts = np.rint(total).astype(int)
            ids = self.dictionary.node_ids()
            self.shared = tuple(ids[i] for i in range(len(ids)) if counts[i] >= msg.contributors)
            outcome = {"hospitals": int(msg.contributors), "shared": list(self.shared),
                       "hospitals_observing": {ids[i]: int(counts[i]) for i in range(len(ids)) if counts[i] > 0},
                       "rule": SHARED_RULE if self._dp is None else SHARED_RULE_DP}
            if not self.shared:
                error = (f"{self._asked_by}: no feature is observed at every hospital (the feature_coverage audit "
                         "entry has the counts). Use \"all\", list the features, or remove the candidate that asks "
                         "for \"shared\".")
        self.done[s.name] = outcome
        self.client, self._sum = None, None
        result = SetupResult(federation_id=msg.federation_id, name=s.name, round=msg.round, client=self._identity.name,
                             outcome=_canonical(outcome), dictionary_hash=derived_hash, error=error)
        return {RESULT_PART: seal(result, self._identity)}


def _setup_release(table: PatientTable, config: Any, *, identity: Identity,
                   state_dir: Path | None) -> tuple[Any, dict[str, float]] | None:
    """Under local DP: the hospital's set-up release (its ledger, σ_set from the plan every
    candidate's trainer calibrates with, :func:`.candidates.private_choice`) and the training
    settings its report entries declare; None without DP.

    Raises:
        ConfigError: no state directory for the ledger; PrivacyError: the plan cannot be made.
    """
    p = config.privacy
    if not p.enabled:
        return None
    from ..privacy.accountant import PrivacyLedger
    from ..privacy.calibration import poisson_plan
    from ..privacy.counts import SetupRelease
    from ..privacy.selection import selection_plan
    from .candidates import private_choice
    from .split import split_patients

    planned = private_choice(config).privacy
    n_train = len(split_patients(table, config=config).train)
    plan = selection_plan(planned, n_train=n_train)
    if plan is None or plan.setup_noise_multiplier is None:  # pragma: no cover - private_choice plans every asked sum
        raise ConfigError(f"Hospital {table.site!r}: a set-up sum under [privacy] needs [privacy] planned_setup_releases.")
    root = Path(p.state_dir) / table.site if p.state_dir else state_dir
    if root is None:
        raise ConfigError(f"Hospital {table.site!r} takes part in a set-up sum under DP but has no state directory for "
                          "its privacy ledger: set [privacy] state_dir.")
    ledger = PrivacyLedger(root, site=table.site, budget_epsilon=p.epsilon_budget, delta=p.delta, signer=identity,
                           accountant=p.accountant)
    q, _ = poisson_plan(n_train=n_train, batch_size=p.batch_size)
    return (SetupRelease(ledger, noise_multiplier=plan.setup_noise_multiplier),
            {"noise_multiplier": plan.noise_multiplier, "sample_rate": q, "clip_norm": p.clip_norm})


def _no_model(federation_id: str, rounds: int | None) -> HospitalClient:
    raise ProtocolError("A set-up-only federation member trains no model.")


def run_in_process(tables: Sequence[PatientTable], dictionary: FeatureDictionary, *, config: Any,
                   candidates: Sequence[Any] = (), federation: Any, server_identity: Identity,
                   identities: Mapping[str, Identity], audit: Any, first_round: int = 0
                   ) -> tuple[dict[str, HospitalSetup], int]:
    """The set-up sums ``config`` asks for, over ``tables`` in one process, recorded in ``audit``
    from round ``first_round``: the run's own driver
    (:func:`clinograph.secure.runtime.setup.run_setup_sums`) over an in-process transport, for
    studies and tests that need the sums without a training run. Returns each hospital's
    :class:`HospitalSetup` (its derived table, dictionary, shared list) and the next round.

    Raises:
        ConfigError: CKKS (the audited result would reveal the sum CKKS hides); the hospitals agree the run cannot go on (nothing shared).
        ProtocolError: hospitals derived different results.
    """
    from clinograph.secure.runtime.assemble import ServerSide
    from clinograph.secure.runtime.setup import run_setup_sums
    from clinograph.secure.runtime.transport import InProcessTransport

    from .member import FederationMember, MemberCandidate

    publics = {n: i.public for n, i in identities.items()}
    setups = {t.site: HospitalSetup(table=t, dictionary=dictionary, config=config, candidates=candidates,
                                    identity=identities[t.site], server=server_identity.public, peers=publics,
                                    federation_id=federation.id) for t in tables}
    members = {n: FederationMember(identity=identities[n], server=server_identity.public, federation_id=federation.id,
                                   candidates=[MemberCandidate(name="model", overrides="{}", build=_no_model)],
                                   setup=s) for n, s in setups.items()}
    side = ServerSide(federation=federation, identity=server_identity, enrolled=publics, dp_policy=None,
                      audit_dir=audit.directory, audit=audit, first_round=first_round)
    run_setup_sums(setup_sums(config, dictionary=dictionary, candidates=candidates), dictionary_hash=dictionary.digest(),
                   side=side, transport=InProcessTransport(members), event=lambda kind, data: None)
    return setups, side.first_round


def shared_features(tables: Sequence[PatientTable], dictionary: FeatureDictionary, *,
                    federation: FederationSection, server_identity: Identity,
                    identities: Mapping[str, Identity], audit: AuditTrail,
                    first_round: int = 0) -> tuple[tuple[str, ...], dict[str, int], int]:
    """The coverage sum alone, in one process (:func:`run_in_process`: the run's own set-up
    driver) -- for studies and tests; a run does it itself. Returns (the shared feature ids in
    dictionary order, the number of hospitals observing each feature that any hospital observes,
    the next round number).

    Raises:
        ConfigError: CKKS (the audited result would reveal the sum CKKS hides), or no feature is observed at every hospital (after the
            ``feature_coverage`` entry is recorded, so the counts are in the audit trail).
        ProtocolError: hospitals decoded different sums.
    """
    from ..config import HospitalConfig, NSFLConfig

    setups, next_round = run_in_process(tables, dictionary, config=HospitalConfig(model=NSFLConfig(features="shared")),
                                        federation=federation, server_identity=server_identity,
                                        identities=identities, audit=audit, first_round=first_round)
    first = setups[tables[0].site]
    return first.shared or (), dict(first.done["feature_coverage"]["hospitals_observing"]), next_round


def federated_scaling(tables: Sequence[PatientTable], dictionary: FeatureDictionary, *, scaling: ScalingSection,
                      federation: FederationSection, server_identity: Identity, identities: Mapping[str, Identity],
                      audit: AuditTrail) -> tuple[FeatureDictionary, list[PatientTable], int]:
    """The histogram sum alone, in one process (:func:`run_in_process`: the run's own
    set-up driver), and every table rescaled -- for studies and tests; a run does it itself.

    Returns the derived dictionary, the rescaled tables (same order) and the next round number
    (the training rounds continue the numbering in the same audit trail).

    Raises:
        ConfigError: CKKS (the audited result would reveal the sum CKKS hides), or a dictionary without numeric features.
        ProtocolError: hospitals decoded different sums (an inconsistent federation).
    """
    from ..config import HospitalConfig

    setups, next_round = run_in_process(tables, dictionary, config=HospitalConfig(scaling=scaling),
                                        federation=federation, server_identity=server_identity,
                                        identities=identities, audit=audit)
    derived = setups[tables[0].site].dictionary  # every hospital derived it (the server checked they agree)
    return derived, [replace(setups[t.site].table, dictionary=derived) for t in tables], next_round
