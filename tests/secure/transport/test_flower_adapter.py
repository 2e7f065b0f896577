"""The Flower adapter without Flower's processes: real ClientApp, relay, workers and server.

Hospitals are ``FakeHospital`` test doubles (flower_helpers.py) around the real secure-mode
clients; the multi-process deployment is tests/integration/test_flower_deployment.py.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import ConfigRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

sys.path.insert(0, str(Path(__file__).parent))
import flower_helpers as fh  # noqa: E402
from clinograph.secure.audit import verify_audit_dir  # noqa: E402
from clinograph.secure.enrolment import load_federation  # noqa: E402
from clinograph.secure.policy import InsecureOptionWarning  # noqa: E402
from clinograph.secure.runtime import InProcessTransport, run_round, run_rounds  # noqa: E402
from clinograph.secure.transport.flower import check_flower_version  # noqa: E402
from clinograph.secure.transport.flower.driver import (  # noqa: E402
    FlowerTransport,
    Timeouts,
    greet_connected,
    greet_nodes,
)
from clinograph.secure.transport.flower.keyset import init_keyset  # noqa: E402
from clinograph.secure.transport.flower.records import from_content, to_content  # noqa: E402
from clinograph.secure.transport.flower.serverapp import run_federation  # noqa: E402
from clinograph.secure.transport.flower.supernode import check_transport, main  # noqa: E402
from clinograph.secure.transport.flower.worker import HospitalWorker, load_factory  # noqa: E402

from clinograph.core.errors import ConfigError, ProtocolError, SecurityPolicyError  # noqa: E402
from clinograph.core.identity import Identity  # noqa: E402

HOSPITALS = ["h1", "h2", "h3"]
RUN_ID = 4242
TIMEOUTS = Timeouts(hello=5, plan=5, stage=5, end=5)


@pytest.fixture(autouse=True)
def _task_identity():
    """Messages built outside a Flower runtime need the task identity Flower sets in its processes."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = RUN_ID, 0, 1
    yield
    TaskIdentity.run_id = TaskIdentity.node_id = TaskIdentity.task_id = None


@pytest.fixture()
def deployment(tmp_path):
    """Keys from init_keyset, one HospitalWorker per node (node ids 101..103), a LoopbackGrid."""
    keys = init_keyset(tmp_path / "keys", federation_id="fed-flower", hospitals=HOSPITALS,
                       superlink_hosts=["127.0.0.1"], superlink_port=19092)
    workers, configs = [], {}
    for i, name in enumerate(HOSPITALS):
        cfg = {"hospital": name, "state-dir": str(tmp_path / name / "state"), "data-dir": str(tmp_path / name),
               "key-file": str(keys.hospital_dirs[name] / f"{name}.ed25519.pem"),
               "federation-file": str(keys.hospital_dirs[name] / "federation.toml")}
        w = HospitalWorker(node_config=cfg, factory=fh.make_participant)
        w.start()
        workers.append(w)
        configs[101 + i] = cfg
    server_toml = fh.write_server_files(tmp_path / "server", federation_id="fed-flower")
    run_config = {"server-config": str(server_toml), "federation-file": str(keys.federation_file),
                  "server-key": str(keys.superlink_dir / "server.ed25519.pem"),
                  "rounds": 2, "min-nodes": 3, "wait-timeout": 1, "hello-timeout": 5, "plan-timeout": 5, "stage-timeout": 5,
                  "end-timeout": 5, "events-file": str(tmp_path / "events.jsonl"), "relay-timeout": 30}
    grid = fh.LoopbackGrid(run_id=RUN_ID, node_configs=configs, run_config=run_config)
    yield keys, workers, grid, run_config
    for w in workers:
        w.stop()


def test_records_round_trip_bytes_exactly():
    data = bytes(range(256)) * 3
    stage, rnd, parts = from_content(to_content("stage", {"data": data}, round_=3), expected_stage="stage")
    assert (stage, rnd, parts) == ("stage", 3, {"data": data})


@pytest.mark.parametrize("content, match", [
    (RecordDict({}), "no 'clinograph' ConfigRecord"),
    (RecordDict({"clinograph": ConfigRecord({"stage": "evil", "round": 0})}), "stage 'evil'"),
    (RecordDict({"clinograph": ConfigRecord({"stage": "plan", "round": 0, "data": "text"})}), "expected bytes"),
    (RecordDict({"clinograph": ConfigRecord({"stage": "plan", "round": -1})}), "valid round"),
])
def test_records_refuse_malformed(content, match):
    with pytest.raises(ProtocolError, match=match):
        from_content(content)


def test_records_refuse_wrong_stage_and_oversize():
    with pytest.raises(ProtocolError, match="expected 'plan', got 'end'"):
        from_content(to_content("end", {}, round_=0), expected_stage="plan")
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        from_content(to_content("plan", {"data": b"x" * 100}, round_=0), max_bytes=99)


def test_the_reply_poll_waits_a_twentieth_of_the_exchange_between_its_floor_and_a_second():
    from clinograph.secure.transport.flower.driver import DEFAULT_POLL_INTERVAL, poll_wait

    assert [poll_wait(t, floor=0.01) for t in (0.0, 0.1, 2.0, 10.0, 45.0)] == pytest.approx([0.01, 0.01, 0.1, 0.5, 1.0])
    assert poll_wait(0.5, floor=0.05) == 0.05 and poll_wait(600.0, floor=2.0) == 2.0  # the floor is kept
    assert FlowerTransport(None, nodes={}, timeouts=TIMEOUTS).poll == DEFAULT_POLL_INTERVAL == 0.05
    with pytest.raises(ConfigError, match=r"'reply-poll' = 0.001 s must be in \[0.01, 5\]"):
        FlowerTransport(None, nodes={}, timeouts=TIMEOUTS, poll=0.001)



class _TimedGrid:
    """Replies come ``delay[stage place]`` fake seconds after the push; counts the pulls."""

    def __init__(self, now: list[float], delays: list[float]):
        self.now, self.delays, self.pulls, self.ready, self.pushes = now, delays, 0, {}, 0

    def push_messages(self, messages):
        self.calls = getattr(self, "calls", 0) + 1
        if not self.ready:  # the exchange's first push
            self.delay = self.delays.pop(0)
        ids = []
        for m in messages:
            self.pushes += 1
            sent, mid = m.content.config_records["clinograph"], f"m{self.pushes}"
            self.ready[mid] = (self.now[0] + self.delay, SimpleNamespace(
                has_error=lambda: False, content=to_content(sent["stage"], {"data": b"ok"}, round_=sent["round"]),
                metadata=SimpleNamespace(src_node_id=m.metadata.dst_node_id, reply_to_message_id=mid)))
            ids.append(mid)
        return ids

    def pull_messages(self, ids):
        self.pulls += 1
        due = [i for i in ids if self.ready[i][0] <= self.now[0]]
        return [self.ready.pop(i)[1] for i in due]


def test_replies_are_first_pulled_at_most_of_that_stages_earliest_reply_last_time_and_many_messages_pushed_alone(monkeypatch):
    """Pulls before the first reply can be there are SuperLink calls that find nothing
    (benchmarks/flower_scale, fourth pass); each of a round's consecutive stages keeps its own time."""
    from clinograph.secure.transport.flower import driver

    now = [0.0]
    monkeypatch.setattr(driver, "time", SimpleNamespace(monotonic=lambda: now[0],
                                                        sleep=lambda s: now.__setitem__(0, now[0] + s)))
    grid = _TimedGrid(now, [0.29, 1.99, 0.29, 1.99, 0.29, 0.29])
    t = FlowerTransport(grid, nodes={"a": 1, "b": 2}, timeouts=TIMEOUTS)
    pulls = []
    for round_, stage in ((0, "plan"), (0, "stage"), (1, "plan"), (1, "stage"), (1, "stage")):
        answers, failed = t.exchange(stage, {"a": {"x": b"1"}, "b": {"x": b"2"}}, round_=round_)
        assert sorted(answers) == ["a", "b"] and not failed, failed
        pulls.append(grid.pulls)
        grid.pulls = 0
    # the first time at once, every 0.05 s; then from 0.6 x 0.3 s (the plan) and 0.6 x 2 s: at most 0.5 s
    assert pulls[0] == 7 and pulls[2] == 4 and pulls[2] < pulls[0]
    assert pulls[3] < pulls[1] and t.first_pull(("stage", 0, b"")) == driver.FIRST_PULL_MAX == 0.5
    assert pulls[4] == 7  # the round's second "stage" is a stage of its own: not seen before, at once
    assert grid.calls == 5 and grid.pushes == 10  # 2 messages: pushed together
    monkeypatch.setattr(driver, "PUSH_EACH_FROM", 2)  # as from 8 nodes: each message (and its objects) alone
    t.exchange("stage", {"a": {"x": b"1"}, "b": {"x": b"2"}}, round_=2)
    assert grid.calls == 7 and grid.pushes == 12
    monkeypatch.setattr(driver, "FIRST_PULL_SHARE", 0.0)  # Flower's way (and the benchmark's previous arm)
    assert t.first_pull(("plan", 0, b"")) == 0.0


@pytest.mark.parametrize(("value", "message"), [(0, r"'reply-poll' = 0.0 s must be in \[0.01, 5\]"),
                                                (-1.0, r"'reply-poll' = -1.0 s must be in"),
                                                ("fast", r"'reply-poll' must be float, got str")])
def test_a_bad_reply_poll_is_refused_before_the_server_waits_for_any_node(value, message):
    """It was read only after the wait for SuperNodes and their greeting (up to minutes)."""
    from clinograph.secure.transport.flower.serverapp import _run

    class Untouched:
        def get_node_ids(self):
            raise AssertionError("the grid was asked for nodes before the run config was checked")

    with pytest.raises(ConfigError, match=message):
        _run(Untouched(), audit=None, config=None, federation=None, identity=None, models=None, rounds=1,
             min_nodes=1, wait=60.0, timeouts=TIMEOUTS, events=None, run_config={"reply-poll": value})

def test_version_pin():
    assert check_flower_version().startswith("1.41")
    for bad in ("1.42.0", "1.4.1", "2.41.0", "1.410.0"):
        with pytest.raises(ConfigError, match="pinned to 1.41"):
            check_flower_version(bad)


def test_federation_over_flower_messages_matches_in_process(deployment, tmp_path):
    keys, workers, grid, run_config = deployment
    results = run_federation(grid, run_config)
    assert [r.round for r in results] == [0, 1]
    assert all(r.contributors == tuple(HOSPITALS) for r in results)
    report = verify_audit_dir(tmp_path / "server" / "audit")
    assert report.ok, report
    # The same two rounds over the in-process transport give the same global model, byte for byte.
    fed = load_federation(keys.federation_file)
    ref = fh.make_server(federation=fed, audit_dir=tmp_path / "audit-ref", server_key=Path(run_config["server-key"]))
    hospitals = {n: fh.make_participant(node_config=grid.node_configs[101 + i], run_config={}, run_id=1,
                                        identity=Identity.load(n, Path(grid.node_configs[101 + i]["key-file"])))
                 for i, n in enumerate(HOSPITALS)}
    run_rounds(ref, InProcessTransport(hospitals), rounds=2)
    assert [r.global_state_digest for r in results] == [r.global_state_digest for r in ref.history]
    assert results[-1].global_state_digest != "0" * 64
    # every hospital received the signed global model after each round
    stages = [s for _, s in grid.sent]
    # (round 0's rode with round 1's plan; only the last round needs its own 'end' message)
    assert stages.count("hello") == 3 and stages.count("plan") == 6 and stages.count("end") == 3
    for i in range(len(HOSPITALS)):  # and loaded both global models (FakeHospital records them)
        assert len(workers[i]._participants[RUN_ID].models) == 2


def test_node_dying_mid_round_is_a_dropout_and_survivors_finish(deployment, tmp_path):
    keys, workers, grid, run_config = deployment
    fed = load_federation(keys.federation_file)
    server = fh.make_server(federation=fed, audit_dir=tmp_path / "audit", server_key=Path(run_config["server-key"]))
    nodes, refused = greet_nodes(grid, federation_id=fed.federation_id, enrolled=fed.enrolled(),
                                 node_ids=[101, 102, 103], timeout=5)
    assert nodes == {"h1": 101, "h2": 102, "h3": 103} and not refused

    def kill_h3_after_plan(msg, node):  # h3 answers the plan, then its SuperNode is gone
        if msg.content.config_records["clinograph"]["stage"] == "stage":
            grid.dead.add(103)
    grid.on_deliver = kill_h3_after_plan
    outcome = run_round(server, FlowerTransport(grid, nodes=nodes, timeouts=TIMEOUTS))
    assert outcome.result.contributors == ("h1", "h2")
    assert "h3" in outcome.dropped and "no reply" in outcome.dropped["h3"]
    # the masked sum over the survivors equals the plain sum of their updates (FedAvg of 2)
    state = server.state
    for m in fh.SPEC.shared:
        u1, u2 = fh.update_for("h1"), fh.update_for("h2")
        expected = -(u1.modules[m.name] + u2.modules[m.name]) / (u1.weight + u2.weight)
        np.testing.assert_allclose(state[m.name], expected, atol=1e-6)
    server.audit.close()
    assert verify_audit_dir(tmp_path / "audit").ok


class Arriving:
    """The deployment's grid with its SuperNodes connecting one look (get_node_ids) at a time, on a
    fake clock that each sleep moves on; ``silent``: nodes that connect but never answer."""

    def __init__(self, grid, *, silent=()):
        self.grid, self.silent, self.looks, self.now, self.log = grid, set(silent), 0, 0.0, []

    def __getattr__(self, name):
        return getattr(self.grid, name)

    def get_node_ids(self):
        self.looks += 1
        self.log.append(("look", self.looks))
        return sorted(self.grid.node_configs)[:self.looks]

    def push_messages(self, messages):
        self.log.extend(("hello", m.metadata.dst_node_id) for m in messages)
        self.grid.dead = self.silent
        return self.grid.push_messages(messages)

    def sleep(self, seconds):
        self.now += seconds


def test_each_node_is_greeted_as_soon_as_it_connects(deployment):
    """Not once min-nodes are connected: each node's hello goes out at the look that found it, and
    the nodes found before the wait ended are all greeted with the same checks."""
    keys, _, grid, _ = deployment
    fed = load_federation(keys.federation_file)
    arriving = Arriving(grid)
    nodes, refused, connected = greet_connected(arriving, federation_id=fed.federation_id, enrolled=fed.enrolled(),
                                                min_nodes=3, wait=60, timeout=5, clock=lambda: arriving.now,
                                                sleep=arriving.sleep)
    assert nodes == {"h1": 101, "h2": 102, "h3": 103} and not refused and connected == 3
    assert arriving.log == [("look", 1), ("hello", 101), ("look", 2), ("hello", 102), ("look", 3), ("hello", 103)]
    assert [stage for _, stage in grid.sent] == ["hello"] * 3  # one hello a node, no second exchange


def test_greeting_stops_looking_after_the_wait_and_times_out_a_silent_node(deployment):
    keys, _, grid, _ = deployment
    fed = load_federation(keys.federation_file)
    arriving = Arriving(grid, silent={102})
    nodes, refused, connected = greet_connected(arriving, federation_id=fed.federation_id, enrolled=fed.enrolled(),
                                                min_nodes=3, wait=0.2, timeout=5, clock=lambda: arriving.now,
                                                sleep=arriving.sleep)
    assert connected == 2 and arriving.looks == 2  # the third node came after the wait: not greeted
    assert nodes == {"h1": 101}
    assert refused == {102: "no reply to 'hello' within 5 s (timeout 5 s)"}
    assert arriving.now == pytest.approx(5.25)  # its hello went out at the second look (0.25 s), waited 5 s from then


def test_hello_with_a_key_not_enrolled_is_refused(deployment, tmp_path):
    keys, workers, grid, run_config = deployment
    impostor = tmp_path / "impostor.pem"
    Identity.generate("h2").save(impostor)  # right name, wrong key
    cfg = {**grid.node_configs[102], "key-file": str(impostor), "state-dir": str(tmp_path / "imp")}
    workers[1].stop()
    w = HospitalWorker(node_config=cfg, factory=fh.make_participant)
    w.start()
    grid.node_configs[102] = cfg
    try:
        fed = load_federation(keys.federation_file)
        nodes, refused = greet_nodes(grid, federation_id=fed.federation_id, enrolled=fed.enrolled(),
                                     node_ids=[101, 102, 103], timeout=5)
    finally:
        w.stop()
    assert nodes == {"h1": 101, "h3": 103}
    assert "does not verify" in refused[102]


def test_hospital_refusal_is_reported_as_a_dropout(deployment, tmp_path):
    keys, workers, grid, run_config = deployment
    grid.node_configs[101]["refuse-plan"] = True
    workers[0].node_config["refuse-plan"] = True
    fed = load_federation(keys.federation_file)
    server = fh.make_server(federation=fed, audit_dir=tmp_path / "audit", server_key=Path(run_config["server-key"]))
    nodes, _ = greet_nodes(grid, federation_id=fed.federation_id, enrolled=fed.enrolled(),
                           node_ids=[101, 102, 103], timeout=5)
    outcome = run_round(server, FlowerTransport(grid, nodes=nodes, timeouts=TIMEOUTS))
    assert outcome.result.contributors == ("h2", "h3")
    assert "refuses round 0" in outcome.dropped["h1"]


def test_worker_greets_only_its_own_federation(deployment):
    _, workers, _, _ = deployment
    with pytest.raises(ProtocolError, match="enrolled in 'fed-flower'"):
        workers[0].handle({"stage": "hello", "run_id": 9, "node_id": 101},
                          {"nonce": b"n" * 32, "federation": b"other-federation"})


def test_worker_refuses_malformed_relays(deployment):
    _, workers, _, _ = deployment
    with pytest.raises(ProtocolError, match="32-byte nonce"):
        workers[0].handle({"stage": "hello", "run_id": 9, "node_id": 101},
                          {"nonce": b"short", "federation": b"fed-flower"})
    with pytest.raises(ProtocolError, match="lacks its 'federation' part"):
        workers[0].handle({"stage": "hello", "run_id": 9, "node_id": 101}, {"nonce": b"n" * 32})
    assert not workers[0]._participants  # nothing was built for a refused hello


def test_worker_refuses_stages_before_hello(deployment):
    _, workers, _, _ = deployment
    with pytest.raises(ProtocolError, match="before the hello"):
        workers[0].handle({"stage": "plan", "run_id": 9}, {"data": b"{}"})


def test_worker_socket_is_private(deployment):
    _, workers, grid, _ = deployment
    state = Path(grid.node_configs[101]["state-dir"])
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(state / "flower-worker.sock").st_mode) == 0o600


def test_factory_reference_errors_are_named():
    with pytest.raises(ConfigError, match="must look like"):
        load_factory("no_colon")
    with pytest.raises(ConfigError, match="Cannot import factory 'nope.nope:f'"):
        load_factory("nope.nope:f")


def test_insecure_transport_only_by_name():
    check_transport(["--root-certificates", "ca.pem"], insecure_transport=False, environment="production")
    with pytest.raises(ConfigError, match="without TLS"):
        check_transport(["--insecure"], insecure_transport=False, environment="development")
    with pytest.raises(SecurityPolicyError, match="refused"):
        check_transport(["--insecure"], insecure_transport=True, environment="production")
    with pytest.warns(InsecureOptionWarning, match="insecure_transport"):
        check_transport(["--insecure"], insecure_transport=True, environment="development")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_another_user_cannot_reach_the_worker(deployment):
    _, _, grid, _ = deployment
    path = Path(grid.node_configs[101]["state-dir"]) / "flower-worker.sock"
    code = ("import os, socket, sys\nos.setgid(65534); os.setuid(65534)\ns = socket.socket(socket.AF_UNIX)\n"
            f"try:\n    s.connect({str(path)!r})\nexcept PermissionError:\n    sys.exit(3)\nsys.exit(0)\n")
    import subprocess

    assert subprocess.run([sys.executable, "-c", code], timeout=30).returncode == 3


def test_too_few_survivors_aborts_the_round_and_says_so(deployment, tmp_path):
    _, _, grid, run_config = deployment

    def two_die(msg, node):
        if msg.content.config_records["clinograph"]["stage"] == "stage":
            grid.dead.update({102, 103})
    grid.on_deliver = two_die
    with pytest.raises(ProtocolError, match="Round aborted"):
        run_federation(grid, run_config)
    import json

    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert events[-2]["event"] == "round_aborted" and events[-2]["round"] == 0
    assert events[-1]["event"] == "failed" and events[-1]["reason"].startswith("RoundAborted: Only 1 client(s) completed")
    assert not any(e["event"] == "round_closed" for e in events)
    server_app_audit = (tmp_path / "server" / "audit" / "audit.jsonl").read_text()
    assert '"round_aborted"' in server_app_audit and "global_model" not in server_app_audit  # nothing published
    assert verify_audit_dir(tmp_path / "server" / "audit").ok  # the trail was closed and still verifies


def test_supernode_launcher_refuses_before_starting_flower(capsys, tmp_path):
    """Flower's --insecure is not mistaken for --insecure-transport (argparse abbreviations off),
    and a node config without its paths is refused with the missing keys named."""
    cfg = f"hospital='h1' state-dir='{tmp_path}' key-file='{tmp_path / 'k.pem'}'"
    assert main(["--participant-factory", "flower_helpers:make_participant", "--node-config", cfg,
                 "--superlink", "127.0.0.1:1", "--insecure"]) == 2
    assert "without TLS" in capsys.readouterr().err
    assert main(["--participant-factory", "flower_helpers:make_participant", "--node-config", "hospital='h1'"]) == 2
    assert "lacks ['state-dir', 'key-file']" in capsys.readouterr().err


def test_ckks_over_flower_messages_key_ceremony_relayed_and_hospitals_decrypt_the_sum(deployment, tmp_path):
    """CKKS over the Flower transport: the key ceremony is relayed as set-up messages, the server
    holds only the public context, and every hospital decrypts the same aggregate -- the plain
    weighted sum of the updates -- while the server never holds a plaintext model."""
    keys, workers, grid, run_config = deployment
    server_toml = fh.write_server_files(tmp_path / "ckks", federation_id="fed-flower", mode="ckks")
    results = run_federation(grid, {**run_config, "server-config": str(server_toml), "rounds": 1})
    assert [r.contributors for r in results] == [tuple(HOSPITALS)]
    setups = [s for _, s in grid.sent if s == "setup"]
    assert len(setups) == 3 + 1 + 2 + 1 + 2 + 3  # run/start to each of 3, deal, 2 requests, wrap, 2 unwraps, run/finish to each
    sums = [workers[i]._participants[RUN_ID].decrypted[-1] for i in range(3)]
    ups = [fh.update_for(n) for n in HOSPITALS]
    for m in fh.SPEC.shared:
        plain = sum(u.modules[m.name] for u in ups)
        for s_ in sums:
            np.testing.assert_allclose(s_.sums[m.name], plain, atol=1e-4)
    log = (tmp_path / "ckks" / "audit" / "audit.jsonl").read_text()
    assert "global_model" not in log and '"secure_mode":"ckks"' in log
    assert verify_audit_dir(tmp_path / "ckks" / "audit").ok


def test_ckks_threshold_over_flower_messages_keygen_relayed_and_the_server_opens_the_checked_sum(deployment, tmp_path):
    """ckks_threshold over the Flower transport: collective key generation, the key's
    distribution and its re-share are relayed as set-up messages, every hospital's decryption
    share rides a round stage, and the server opens the sum (its global model is the plain
    weighted mean)."""
    keys, workers, grid, run_config = deployment
    server_toml = fh.write_server_files(tmp_path / "tckks", federation_id="fed-flower", mode="ckks_threshold")
    results = run_federation(grid, {**run_config, "server-config": str(server_toml), "rounds": 1})
    assert [r.contributors for r in results] == [tuple(HOSPITALS)]
    steps = [s for _, s in grid.sent if s == "setup"]
    assert len(steps) == 3 + 3 + 3 + 3 + 3  # run/start, tckks/keygen, tckks/public, tckks/reshare, run/finish: one to each
    log = (tmp_path / "tckks" / "audit" / "audit.jsonl").read_text()
    assert '"kind":"tckks_key_holders"' in log and '"secure_mode":"ckks_threshold"' in log
    assert verify_audit_dir(tmp_path / "tckks" / "audit").ok


def test_a_node_cannot_greet_as_another_hospital(deployment, tmp_path):
    """A hello signed by h1's key but naming h2 is refused (a node speaks only for its own key)."""
    from clinograph.secure.transport.flower.messages import NodeHello
    from clinograph.secure.wire import seal

    keys, workers, grid, run_config = deployment
    h1 = Identity.load("h1", Path(grid.node_configs[101]["key-file"]))
    original = workers[0]._hello

    def lying_hello(run_id, header, parts):
        hello = NodeHello(federation_id="fed-flower", hospital="h2", node_id=int(header["node_id"]), run_id=run_id,
                          nonce=parts["nonce"])
        return {"hello": seal(hello, h1)}
    workers[0]._hello = lying_hello
    try:
        fed = load_federation(keys.federation_file)
        nodes, refused = greet_nodes(grid, federation_id=fed.federation_id, enrolled=fed.enrolled(),
                                     node_ids=[101, 102, 103], timeout=5)
    finally:
        workers[0]._hello = original
    assert nodes == {"h2": 102, "h3": 103}
    assert "signed by 'h1'" in refused[101]


def test_a_clientapps_exception_is_read_as_its_type_and_message():
    """The guide's run with a hospital whose data-dir lacked hospital.toml logged, at the server,
    "refused: error reply at 'hello': <class 'clinograph.core.errors.ProtocolError'>:<'Hospital 'h3'
    refused the 'hello' message: ...'>" -- Flower's wording of the ClientApp's exception."""
    from clinograph.secure.transport.flower.driver import error_reason

    assert error_reason("<class 'clinograph.core.errors.ProtocolError'>:<'Hospital 'h3' refused the 'hello' "
                        "message: ConfigError: Cannot read hospital config /d/hospital.toml'>") == (
        "ProtocolError: Hospital 'h3' refused the 'hello' message: ConfigError: Cannot read hospital config "
        "/d/hospital.toml")
    assert error_reason("<class 'ZeroDivisionError'>:<'division by zero'>") == "ZeroDivisionError: division by zero"
    assert error_reason("ClientApp stopped responding.") == "ClientApp stopped responding."
