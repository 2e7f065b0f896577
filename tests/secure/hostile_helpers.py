"""A small real federation (FederationServer + the one round loop + real secure-mode clients)
and the hostile pieces the hardening tests put into it.

``Hospital`` is a test double of the SDK's HospitalClient: no training, a fixed LocalUpdate
handed to the plan's real secure-mode client. ``report`` / ``mode_client`` let a test make one
hospital hostile while it still runs the real protocol. ``InjectingTransport`` delivers extra
bytes on a hospital's channel (what a network attacker, or a broken transport, can do) and can
replace a hospital's answer at a given exchange.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path

import numpy as np
from clinograph.secure.aggregation import LocalUpdate, create_mode
from clinograph.secure.audit import AuditTrail
from clinograph.secure.ckks import CkksClient
from clinograph.secure.masking import MaskingClient
from clinograph.secure.masking.messages import MaskedInput
from clinograph.secure.messages import ClientReport, DPPolicy, RoundPlan
from clinograph.secure.runtime import InProcessTransport
from clinograph.secure.server import FederationServer
from clinograph.secure.wire import open_envelope, parse_envelope, seal

from clinograph.core.identity import Identity
from clinograph.core.spec import ModelSpec, ModuleKind, ModuleSpec

SPEC = ModelSpec(version=1, modules=(
    ModuleSpec(name="feature_embedding/heart_rate", shape=(6,), kind=ModuleKind.SHARED),
    ModuleSpec(name="gnn/layer1/has_feature", shape=(4, 3), kind=ModuleKind.SHARED),
    ModuleSpec(name="head/task", shape=(3,), kind=ModuleKind.PERSONAL),
))
DICTIONARY_HASH = "d" * 64
FEDERATION = "fed-hostile"


@lru_cache(maxsize=None)
def identity(name: str) -> Identity:
    return Identity.generate(name)


def update_for(name: str, round_: int = 0) -> LocalUpdate:
    """A deterministic small update (weights in [0.5, 0.9], |w Δ| far below the clip of 1)."""
    seed = sum(name.encode()) + 1000 * round_
    rng = np.random.default_rng(seed)
    w = 0.5 + (seed % 5) / 10
    return LocalUpdate(modules={m.name: w * rng.normal(0, 0.05, m.size) for m in SPEC.shared}, weight=w)


ReportFn = Callable[["Hospital", RoundPlan], ClientReport]


class Hospital:
    """Runs the real secure-mode client over a fixed update; optionally hostile."""

    def __init__(self, name: str, *, server: Identity, names: list[str], report: ReportFn | None = None,
                 mode_client: type | None = None, mode_client_kw: Mapping | None = None):
        self.name = name
        self.identity = identity(name)
        self.server = server.public
        self.peers = {n: identity(n).public for n in names}
        self.report_fn = report
        self.mode_client = mode_client
        self.mode_client_kw = dict(mode_client_kw or {})
        self.client = None
        self.sent: list[bytes] = []  # every envelope this hospital sent, in order
        self.models: list[bytes | None] = []

    def on_setup(self, step, parts):
        return {}

    def on_plan(self, plan: bytes) -> tuple[bytes, bytes]:
        p = open_envelope(parse_envelope(plan), sender=self.server, model=RoundPlan)
        cls = self.mode_client or create_mode(p.secure_mode).client
        update = update_for(self.name, p.round)
        fixed = p.options.get(f"weight/{self.name}")
        if fixed is not None:  # the strategy published this hospital's weight (as HospitalClient uses it)
            r = float(fixed) / update.weight
            update = LocalUpdate(modules={k: r * v for k, v in update.modules.items()}, weight=float(fixed))
        self.client = cls(plan=p, identity=self.identity, server=self.server, peers=self.peers,
                          update=update, **self.mode_client_kw)
        report = (self.report_fn(self, p) if self.report_fn else
                  ClientReport(federation_id=p.federation_id, round=p.round, client=self.name,
                               dictionary_hash=p.dictionary_hash))
        out = (report if isinstance(report, bytes) else seal(report, self.identity), self.client.first_message())
        self.sent.extend(out)
        return out

    def on_stage(self, data: bytes) -> bytes | None:
        reply = self.client.handle(data)
        if reply is not None:
            self.sent.append(reply)
        return reply

    def decrypted_result(self):
        return None

    def on_round_end(self, global_model: bytes | None) -> None:
        self.models.append(global_model)


class InjectingTransport(InProcessTransport):
    """InProcessTransport that can deliver extra bytes on a channel, or replace an answer.

    ``inject(stage_index, name) -> list of (part, bytes)``: delivered to the server on
    ``name``'s channel *before* that hospital's genuine answer of exchange ``stage_index``
    (0 = the answer to the plan: part "report" or "first"; k >= 1: stage k, part "reply").
    ``replace(stage_index, name, part, data) -> bytes``: what the server receives instead of
    the genuine part.
    """

    def __init__(self, participants, *, server: FederationServer, inject=None, replace=None):
        super().__init__(participants)
        self.server = server
        self.inject = inject
        self.replace = replace
        self._index: dict[int, int] = {}

    def exchange(self, stage, outgoing, *, round_):
        answers, failed = super().exchange(stage, outgoing, round_=round_)
        if stage == "end":
            return answers, failed
        idx = self._index.get(round_, 0)
        self._index[round_] = idx + 1
        for name in sorted(answers):
            if self.inject is not None:
                for part, data in self.inject(idx, name):
                    if part == "report":
                        self.server.receive_report(data, channel=name)
                    else:
                        self.server.receive(data, channel=name)
            if self.replace is not None:
                answers[name] = {part: self.replace(idx, name, part, data) for part, data in answers[name].items()}
        return answers, failed


def federation(tmp_path: Path, *, n: int = 4, mode: str = "masked", dp_policy: DPPolicy | None = None,
               strategy: str = "fedavg", hospitals: Mapping[str, dict] | None = None, inject=None, replace=None,
               min_clients: int = 2, masked_threshold: int | None = None, environment: str = "development",
               ) -> tuple[FederationServer, InjectingTransport, dict[str, Hospital]]:
    """A server through the one server builder, n hospitals, an injecting in-process transport.

    ``hospitals[name]`` holds Hospital keyword arguments (report=, mode_client=) for hostile ones.
    ``mode="ckks"`` runs the key ceremony first (h0 deals); every hospital's client is a CkksClient
    over its keyring unless ``hospitals`` names another (it still gets ``keyring=``).
    """
    from clinograph.secure.runtime import build_server
    from clinograph.secure.runtime.build import InitialModel
    from clinograph.secure.runtime.config import FederationSection

    names = [f"h{i}" for i in range(n)]
    server_id = identity("server")
    audit = AuditTrail(tmp_path / "audit", identity=server_id)
    ckks_context, keyrings = None, {}
    if mode == "ckks":  # the key ceremony in one process (h0 deals); each hospital's client gets its keyring
        from clinograph.secure.ckks import CkksPreset
        from clinograph.secure.ckks.ceremony import in_process_ceremony

        cer = in_process_ceremony(identities={c: identity(c) for c in names}, dealer=names[0],
                                  federation_id=FEDERATION, preset=CkksPreset.ADD_ONLY_128)
        ckks_context, keyrings = cer.context, dict(cer.keyrings)
        hospitals = {c: {"mode_client": CkksClient, **dict((hospitals or {}).get(c, {})),
                         "mode_client_kw": {"keyring": keyrings[c],
                                            **dict((hospitals or {}).get(c, {}).get("mode_client_kw", {}))}}
                     for c in names}
    initial = InitialModel.create(task="test", dictionary_hash=DICTIONARY_HASH, spec=SPEC,
                                  state={m.name: np.zeros(m.size) for m in SPEC.shared})
    section = FederationSection(id=FEDERATION, secure_mode=mode, strategy=strategy, min_clients=min_clients,
                                local_epochs=1, max_weight=1.0, masked_clip=1.0, masked_threshold=masked_threshold,
                                environment=environment)
    server = build_server(federation=section, identity=server_id, enrolled={c: identity(c).public for c in names},
                          initial=initial, audit=audit, dp_policy=dp_policy, ckks_context=ckks_context)
    parts = {c: Hospital(c, server=server_id, names=names, **dict((hospitals or {}).get(c, {}))) for c in names}
    transport = InjectingTransport(parts, server=server, inject=inject, replace=replace)
    return server, transport, parts


def audit_entries(tmp_path: Path) -> list[dict]:
    log = tmp_path / "audit" / "audit.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def honest_mean(names, round_: int = 0) -> dict[str, np.ndarray]:
    """FedAvg of the given hospitals' fixed updates (module means, every module trained)."""
    ups = [update_for(c, round_) for c in names]
    return {m.name: sum(u.modules[m.name] for u in ups) / sum(u.weight for u in ups) for m in SPEC.shared}


# -- hospitals whose input voids a round (secure/runtime/attribution.py) -------------------------

class OutOfBoundsMasked(MaskingClient):
    """The real masked protocol, with 1000 added to every count slot of its vector (masks are
    additive mod 2^32, so this is its plaintext plus 1000): any sum holding it has counts above
    the survivors, whatever the subset."""

    def _masked_input(self, msg):
        honest = super()._masked_input(msg)
        y = np.frombuffer(honest.words, dtype="<u4").astype(np.uint32)
        m, nv = len(self._layout.names), self._layout.n_values
        y[nv + m:nv + 2 * m] += np.uint32(1000)
        return MaskedInput(**self._header(), words=y.astype("<u4").tobytes())


class BadSharesMasked(MaskingClient):
    """The real masked protocol, but the Shamir shares it deals of one of its secrets are wrong
    (``secret``: ``"pairwise_key"``, rebuilt when it drops, or ``"self_mask"``, rebuilt when it
    survives; ``shift`` added to each share: 1 rebuilds a wrong but well-formed secret, a large
    one a value that is no secret). With ``drop`` it then sends no masked vector, so the server
    must rebuild its pairwise key from the shares it dealt."""

    def __init__(self, *, secret: str = "pairwise_key", shift: int = 1, drop: bool = True, **kw):
        super().__init__(**kw)
        self._bad, self._shift, self._drop = secret, shift, drop

    def _share_keys(self, msg):
        from clinograph.secure.hazmat.shamir import PRIME, SHARE_BYTES
        from clinograph.secure.masking.messages import EncryptedShare, ShareKeys
        from clinograph.secure.masking.stages import decrypt_share, encrypt_share

        def spoil(share: bytes) -> bytes:
            return ((int.from_bytes(share, "big") + self._shift) % PRIME).to_bytes(SHARE_BYTES, "big")

        honest = super()._share_keys(msg)
        out = []
        for es in honest.shares:
            key = self._pair_key(es.peer)
            idx, b, s = decrypt_share(key, plan=self.plan, sender=self._me, recipient=es.peer, ciphertext=es.ciphertext)
            b, s = (spoil(b), s) if self._bad == "self_mask" else (b, spoil(s))
            out.append(EncryptedShare(peer=es.peer, ciphertext=encrypt_share(
                key, plan=self.plan, sender=self._me, recipient=es.peer, index=idx, b_share=b, s_share=s)))
        return ShareKeys(**self._header(), shares=tuple(out))

    def _masked_input(self, msg):
        if self._drop:
            from clinograph.core.errors import ProtocolError

            raise ProtocolError("this hospital leaves the round after dealing its shares")
        return super()._masked_input(msg)


@lru_cache(maxsize=None)
def _foreign_keyring():
    """A keyring from another ceremony: the same preset and parameters, another secret key."""
    from clinograph.secure.ckks import CkksPreset
    from clinograph.secure.ckks.ceremony import in_process_ceremony

    cer = in_process_ceremony(identities={"x": identity("x")}, dealer="x", federation_id="fed-elsewhere",
                              preset=CkksPreset.ADD_ONLY_128)
    return cer.keyrings["x"]


class ForeignKeyCkks(CkksClient):
    """The real ckks protocol, but its update is encrypted under a key of its own while it claims
    the federation's context digest: the server (which holds no key) accepts it, and every
    hospital's decryption of the sum then fails its contributor-tag check."""

    def first_message(self) -> bytes:
        from clinograph.secure.ckks.messages import CkksUpdate

        msg = open_envelope(parse_envelope(super().first_message()), sender=self.identity.public, model=CkksUpdate)
        me = self.identity.name
        vec = self._layout.pack(self.update, client=me, tag=self._keyring.contributor_tag(round_=self.plan.round,
                                                                                          client=me))
        return seal(msg.model_copy(update={"ciphertexts": tuple(_foreign_keyring().context.encrypt(vec))}),
                    self.identity)


#: ``federation(..., hospitals={culprit: HOSTILE[mode]})``: a hospital whose input voids every round it is in
HOSTILE = {"masked": {"mode_client": OutOfBoundsMasked}, "ckks": {"mode_client": ForeignKeyCkks}}
