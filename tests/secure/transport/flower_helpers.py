"""Helpers for the Flower adapter tests.

``LoopbackGrid`` is a Flower ``Grid`` whose "network" is a function call: every message goes
through the real ClientApp (``clinograph.secure.transport.flower.clientapp.app``), the real
local-socket relay and a real ``HospitalWorker`` thread per node -- everything but Flower's
SuperLink/SuperNode processes, which ``tests/integration/test_flower_deployment.py`` runs.

``FakeHospital`` is a *test double* of the SDK's HospitalClient (RoundParticipant): it skips
training and hands a fixed LocalUpdate to the plan's real secure-mode client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from types import SimpleNamespace
from uuid import uuid4

import numpy as np
from clinograph.secure.aggregation import LocalUpdate, create_mode
from clinograph.secure.audit import AuditTrail
from clinograph.secure.enrolment import load_federation
from clinograph.secure.messages import ClientReport, RoundPlan
from clinograph.secure.server import FederationServer
from clinograph.secure.transport.flower.clientapp import app as client_app
from clinograph.secure.wire import open_envelope, parse_envelope, seal
from flwr.app import Context, Error, Message, RecordDict
from flwr.serverapp import Grid

from clinograph.core.identity import Identity, PublicIdentity
from clinograph.core.spec import ModelSpec, ModuleKind, ModuleSpec

SPEC = ModelSpec(version=1, modules=(
    ModuleSpec(name="feature_embedding/heart_rate", shape=(6,), kind=ModuleKind.SHARED),
    ModuleSpec(name="gnn/layer1/has_feature", shape=(4, 3), kind=ModuleKind.SHARED),
    ModuleSpec(name="head/task", shape=(3,), kind=ModuleKind.PERSONAL),
))
DICTIONARY_HASH = "d" * 64


def update_for(name: str) -> LocalUpdate:
    """A deterministic per-hospital update (so two transports can be compared)."""
    seed = sum(name.encode())
    rng = np.random.default_rng(seed)
    w = 0.5 + (seed % 5) / 10
    return LocalUpdate(modules={m.name: w * rng.normal(0, 0.05, m.size) for m in SPEC.shared}, weight=w)


class FakeHospital:
    """Test double of HospitalClient: no training; real mode client over a fixed update."""

    def __init__(self, *, identity: Identity, server: PublicIdentity, peers: dict[str, PublicIdentity],
                 refuse_plan: bool = False, federation_id: str = "fed-flower"):
        from clinograph.secure.ckks.holder import CkksKeyHolder

        self.name = identity.name
        self.identity, self.server, self.peers = identity, server, peers
        self.refuse_plan = refuse_plan
        self.client = None
        self.models: list[bytes | None] = []
        self.decrypted: list = []
        self.ckks = CkksKeyHolder(identity=identity, peers=peers, federation_id=federation_id)

    def on_setup(self, step, parts):
        if step.startswith("run/"):  # the run's own steps (run/start, run/finish): a one-model double accepts
            return {"ok": b"1"}
        return self.ckks.on_setup(step, parts)

    def on_plan(self, plan: bytes) -> tuple[bytes, bytes]:
        from clinograph.core.errors import ProtocolError

        p = open_envelope(parse_envelope(plan), sender=self.server, model=RoundPlan)
        if self.refuse_plan:
            raise ProtocolError(f"{self.name} refuses round {p.round} (test double)")
        self.client = create_mode(p.secure_mode).make_client(plan=p, identity=self.identity, server=self.server,
                                                             peers=self.peers, update=update_for(self.name),
                                                             keys=self.ckks)  # ckks, ckks_threshold: its key holder
        report = ClientReport(federation_id=p.federation_id, round=p.round, client=self.name,
                              dictionary_hash=p.dictionary_hash)
        return seal(report, self.identity), self.client.first_message()

    def on_stage(self, data: bytes) -> bytes | None:
        return self.client.handle(data)

    def decrypted_result(self):
        return None

    def on_round_end(self, global_model: bytes | None) -> None:
        self.models.append(global_model)
        if global_model is None:
            self.decrypted.append(self.client.decrypted_result())


def make_participant(*, node_config, run_config, run_id, identity):
    """ParticipantFactory for the worker: builds a FakeHospital from the federation file."""
    fed = load_federation(Path(node_config["federation-file"]))
    return FakeHospital(identity=identity, server=fed.server_public(), peers=fed.enrolled(),
                        refuse_plan=node_config.get("refuse-plan", False), federation_id=fed.federation_id)


def federation_section(federation_id: str, mode: str = "masked"):
    """The test federation: FedAvg, weights <= 1 and |Δ| <= 1 (tight fixed point for the test updates)."""
    from clinograph.secure.runtime.config import FederationSection

    return FederationSection(id=federation_id, secure_mode=mode, strategy="fedavg", min_clients=2, local_epochs=1,
                             max_weight=1.0, masked_clip=1.0)


def initial_model(defaults: tuple = ()):
    from clinograph.secure.runtime.build import InitialModel

    return InitialModel.create(task="test", dictionary_hash=DICTIONARY_HASH, spec=SPEC,
                               state={m.name: np.zeros(m.size) for m in SPEC.shared}, defaults=defaults)


def write_server_files(folder: Path, *, federation_id: str, mode: str = "masked", defaults: tuple = ()) -> Path:
    """server.toml + initial_model.json (with the resolved ``defaults``) for the ServerApp; returns the server.toml path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "initial_model.json").write_bytes(initial_model(defaults=defaults).to_bytes())
    (folder / "server.toml").write_text(
        f'initial_model = "initial_model.json"\naudit_dir = "{folder / "audit"}"\n\n[federation]\n'
        f'id = "{federation_id}"\nrounds = 2\nsecure_mode = "{mode}"\nstrategy = "fedavg"\nmin_clients = 2\n'
        'local_epochs = 1\nmax_weight = 1.0\nmasked_clip = 1.0\n')
    return folder / "server.toml"


def make_server(*, federation, audit_dir: Path, server_key: Path, secure_mode: str = "masked",
                ckks_context=None) -> FederationServer:
    """The server of the test federation, through the one server builder."""
    from clinograph.secure.runtime import build_server

    ident = Identity.load(federation.server.name, Path(server_key))
    return build_server(federation=federation_section(federation.federation_id, secure_mode), identity=ident,
                        enrolled=federation.enrolled(), initial=initial_model(),
                        audit=AuditTrail(Path(audit_dir), identity=ident), dp_policy=None, ckks_context=ckks_context)


class LoopbackGrid(Grid):
    """A Grid that delivers each message by calling the real ClientApp of the target node."""

    def __init__(self, *, run_id: int, node_configs: dict[int, dict], run_config: dict):
        self._run = SimpleNamespace(run_id=run_id)
        self.node_configs = node_configs
        self.run_config = run_config
        self.dead: set[int] = set()
        self.on_deliver: Callable[[Message, int], None] | None = None
        self.sent: list[tuple[int, str]] = []

    def set_run(self, run) -> None:
        self._run = run

    @property
    def run(self):
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_configs)

    def push_messages(self, messages):
        """Deliver at once; the replies wait for pull_messages (as on a SuperLink)."""
        self._waiting = getattr(self, "_waiting", {})
        replies = self.send_and_receive(messages)
        by_id = {r.metadata.reply_to_message_id: r for r in replies}
        ids = [m.metadata.message_id for m in messages]
        for i in ids:
            if i in by_id:
                self._waiting[i] = by_id[i]
        return ids

    def pull_messages(self, message_ids):
        return [self._waiting.pop(i) for i in list(message_ids) if i in self._waiting]

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            msg.metadata.__dict__["_message_id"] = uuid4().hex
            if self.on_deliver is not None:
                self.on_deliver(msg, node)
            stage = msg.content.config_records["clinograph"]["stage"]
            self.sent.append((node, stage))
            if node in self.dead:
                continue  # a dead node never answers; the driver's timeout covers it
            ctx = Context(run_id=self._run.run_id, node_id=node, node_config=self.node_configs[node],
                          state=RecordDict(), run_config=self.run_config)
            try:
                reply = client_app(message=msg, context=ctx)
            except Exception as exc:  # what flwr-clientapp does with an exception: an error reply
                reply = Message(Error(code=1, reason=f"{type(exc).__name__}:<'{exc}'>"), reply_to=msg)
            replies.append(reply)
        return replies
