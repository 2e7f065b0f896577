"""The operator's view of a Flower run: progress lines by name, refusals signed and audited,
failed runs non-zero, hospital logs once a line without DEBUG noise."""

from __future__ import annotations

import io
import json
import logging
import sys
from pathlib import Path

import pytest
from flwr.supercore.task_identity import TaskIdentity

sys.path.insert(0, str(Path(__file__).parent))
import flower_helpers as fh  # noqa: E402
from clinograph.secure.audit import verify_audit_dir  # noqa: E402
from clinograph.secure.transport.flower.keyset import init_keyset  # noqa: E402
from clinograph.secure.transport.flower.oplog import progress_line  # noqa: E402
from clinograph.secure.transport.flower.serverapp import run_federation  # noqa: E402
from clinograph.secure.transport.flower.supernode import configure_hospital_logging  # noqa: E402
from clinograph.secure.transport.flower.worker import HospitalWorker  # noqa: E402

from clinograph.core.errors import ConfigError, ProtocolError  # noqa: E402

HOSPITALS = ["h1", "h2", "h3"]
SERVERAPP = "clinograph.secure.transport.flower.serverapp"
WORKER = "clinograph.secure.transport.flower.worker"


@pytest.fixture(autouse=True)
def _task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 4242, 0, 1
    yield
    TaskIdentity.run_id = TaskIdentity.node_id = TaskIdentity.task_id = None


def _deploy(tmp_path, *, refuse=(), defaults=()):
    keys = init_keyset(tmp_path / "keys", federation_id="fed-flower", hospitals=HOSPITALS,
                       superlink_hosts=["127.0.0.1"], superlink_port=19092)
    workers, configs = [], {}
    for i, name in enumerate(HOSPITALS):
        cfg = {"hospital": name, "state-dir": str(tmp_path / name / "state"), "data-dir": str(tmp_path / name),
               "key-file": str(keys.hospital_dirs[name] / f"{name}.ed25519.pem"),
               "federation-file": str(keys.hospital_dirs[name] / "federation.toml")}
        if name in refuse:
            cfg["refuse-plan"] = True
        w = HospitalWorker(node_config=cfg, factory=fh.make_participant)
        w.start()
        workers.append(w)
        configs[101 + i] = cfg
    server_toml = fh.write_server_files(tmp_path / "server", federation_id="fed-flower", defaults=defaults)
    run_config = {"server-config": str(server_toml), "federation-file": str(keys.federation_file),
                  "server-key": str(keys.superlink_dir / "server.ed25519.pem"), "rounds": 2, "min-nodes": 3,
                  "wait-timeout": 1, "hello-timeout": 5, "plan-timeout": 5, "stage-timeout": 5, "end-timeout": 5,
                  "events-file": str(tmp_path / "events.jsonl"), "relay-timeout": 30}
    return workers, fh.LoopbackGrid(run_id=4242, node_configs=configs, run_config=run_config), run_config


def _entries(d):
    return [json.loads(x) for x in (d / "audit.jsonl").read_text().splitlines()]



def _kept_messages(logger: logging.Logger) -> tuple[logging.Handler, list[str]]:
    """A handler added to ``logger`` that keeps every record's message (remove it when done)."""
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    keep = Keep()
    logger.addHandler(keep)
    return keep, seen

def test_a_hospital_refusal_travels_signed_and_the_operator_sees_names_nodes_and_epsilon(tmp_path, caplog):
    from clinograph.sdk.config import DP_DEFAULT_MODEL_LINE
    from clinograph.secure.runtime.build import ResolvedDefault

    dp_default = ResolvedDefault(setting="model.deep", value="false", rule="dp_default_model", line=DP_DEFAULT_MODEL_LINE)
    workers, grid, run_config = _deploy(tmp_path, refuse=("h3",), defaults=(dp_default,))
    caplog.set_level(logging.INFO)
    try:
        results = run_federation(grid, run_config)
    finally:
        for w in workers:
            w.stop()
    assert [r.contributors for r in results] == [("h1", "h2"), ("h1", "h2")]
    audit = tmp_path / "server" / "audit"
    entries = _entries(audit)
    refused = [e["payload"] for e in entries if e["kind"] == "hospital_refused"]
    assert [(r["client"], r["round"], r["stage"], r["signed"], r["final"]) for r in refused] == [
        ("h3", 0, "plan", True, False), ("h3", 1, "plan", True, False)]
    assert refused[0]["reason"] == "ProtocolError: h3 refuses round 0 (test double)"
    part = [e["payload"] for e in entries if e["kind"] == "round_participation"]
    assert part[0]["refused"]["h3"]["signed"] and part[0]["contributed"] == ["h1", "h2"]
    assert entries[-1]["kind"] == "run_ended" and entries[-1]["payload"]["status"] == "completed"
    assert entries[-2]["kind"] == "release"
    assert verify_audit_dir(audit).ok
    server_lines = [r.getMessage() for r in caplog.records if r.name == SERVERAPP]
    assert "greeted hospitals: h1 = node 101, h2 = node 102, h3 = node 103" in server_lines
    # the DP default model (issue 30 leftover): said by the ServerApp, audited after the manifest
    assert server_lines.count(DP_DEFAULT_MODEL_LINE) == 1
    kinds = [e["kind"] for e in entries]
    assert kinds[kinds.index("manifest") + 1] == "resolved_default"
    assert [e["payload"] for e in entries if e["kind"] == "resolved_default"] == [dp_default.payload()]
    assert "round 0 (masked): invited h1 (node 101), h2 (node 102), h3 (node 103)" in server_lines
    assert ("round 0: h3 (node 103) refused at plan: ProtocolError: h3 refuses round 0 (test double)"
            in server_lines)
    assert any(x.startswith("round 1 closed: contributors h1 (node 101), h2 (node 102); dropped h3 (node 103); "
                            "refused h3 (node 103)") for x in server_lines)
    assert any(x.startswith("run ended (completed) after 2 of 2 round(s)") for x in server_lines)
    hospital_lines = [r.getMessage() for r in caplog.records if r.name == WORKER]
    assert "Flower node 101 serves hospital 'h1' in run 4242 of federation 'fed-flower'" in hospital_lines
    assert "round 0: answered the plan (no DP ledger)" in hospital_lines
    assert "round 0 closed: loaded the new global model" in hospital_lines
    assert "round 1: refused the plan message: ProtocolError: h3 refuses round 1 (test double)" in hospital_lines
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert next(e for e in events if e["event"] == "greeted")["nodes"] == {"h1": 101, "h2": 102, "h3": 103}
    assert [e["event"] for e in events][-2:] == ["run_ended", "finished"]
    plan = [e for e in events if e["event"] == "stage_progress" and e["stage"] == "plan"]
    assert [(p["round"], p["answered"], p["asked"]) for p in plan] == [(0, 3, 3), (1, 3, 3)]  # h3's refusal answers
    assert all(p["slowest"] in HOSPITALS and p["slowest_s"] >= 0 for p in plan)
    assert any(e["event"] == "stage_progress" and e["stage"] == "stage 1" for e in events)
    closed = [e for e in events if e["event"] == "round_closed"]
    assert [c["rounds_left"] for c in closed] == [1, 0] and all(c["seconds"] > 0 for c in closed)
    assert any(x.startswith("round 0 plan: 3 of 3 hospital(s) answered; slowest h") for x in server_lines)
    assert any(x.startswith("round 0 closed: ") and "ETA at most" in x and "for 1 round(s) left" in x
               for x in server_lines)


def test_a_config_error_before_the_first_round_is_a_failed_event_and_one_log_line(tmp_path, caplog):
    keys = init_keyset(tmp_path / "keys", federation_id="fed-flower", hospitals=HOSPITALS,
                       superlink_hosts=["127.0.0.1"], superlink_port=19092)
    server_toml = fh.write_server_files(tmp_path / "server", federation_id="fed-other")
    events = tmp_path / "events.jsonl"
    run_config = {"server-config": str(server_toml), "federation-file": str(keys.federation_file),
                  "server-key": str(keys.superlink_dir / "server.ed25519.pem"), "events-file": str(events)}
    caplog.set_level(logging.INFO)
    with pytest.raises(ConfigError, match="server.toml runs federation 'fed-other' but the federation file"):
        run_federation(fh.LoopbackGrid(run_id=4242, node_configs={}, run_config=run_config), run_config)
    [failed] = [json.loads(x) for x in events.read_text().splitlines()]
    assert failed["event"] == "failed" and failed["reason"].startswith("ConfigError: server.toml runs federation")
    errors = [r.getMessage() for r in caplog.records if r.name == SERVERAPP and r.levelno == logging.ERROR]
    assert errors == [f"run failed: {failed['reason']}"]


def test_a_failed_run_is_logged_audited_and_raised(tmp_path, caplog):
    workers, grid, run_config = _deploy(tmp_path)

    def two_die(msg, node):
        if msg.content.config_records["clinograph"]["stage"] == "stage":
            grid.dead.update({102, 103})
    grid.on_deliver = two_die
    caplog.set_level(logging.INFO)
    try:
        with pytest.raises(ProtocolError):
            run_federation(grid, run_config)
    finally:
        for w in workers:
            w.stop()
    entries = _entries(tmp_path / "server" / "audit")
    assert entries[-1]["kind"] == "run_ended" and entries[-1]["payload"]["status"] == "failed"
    errors = [r.getMessage() for r in caplog.records if r.name == SERVERAPP and r.levelno == logging.ERROR]
    assert any(x.startswith("round 0 aborted") for x in errors)
    assert any(x.startswith("run failed (audit run ") for x in errors)
    assert not any(x.startswith("run failed: ") for x in errors)  # one line for the failure, not two
    assert json.loads((tmp_path / "events.jsonl").read_text().splitlines()[-1])["event"] == "failed"
    drops = [r.getMessage() for r in caplog.records if r.name == SERVERAPP and "dropped:" in r.getMessage()]
    assert any("h2 (node 102) dropped: stage 1: no reply to 'stage' within" in x and "(timeout 5 s)" in x
               for x in drops)


def test_progress_lines_name_hospitals_and_their_nodes():
    nodes = {"h1": 7}
    assert progress_line("dropped", {"round": 2, "hospital": "h1", "reason": "stage 2: no reply"}, nodes=nodes) == (
        logging.WARNING, "round 2: h1 (node 7) dropped: stage 2: no reply")
    level, line = progress_line("run_ended", {"status": "too_few_hospitals", "reason": "budgets spent",
                                              "rounds_completed": 3, "rounds_planned": 5}, nodes=nodes)
    assert level == logging.WARNING and line == "run ended (too_few_hospitals) after 3 of 5 round(s): budgets spent"


def test_hospital_log_lines_appear_once_and_debug_is_off_by_default():
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logging.getLogger("flwr").propagate,
             logging.getLogger("clinograph").level)
    try:
        configure_hospital_logging("info", stream=stream)
        # what importing opacus does: a no-op now that the root logger has a handler
        logging.basicConfig(format="%(asctime)s:%(levelname)s:%(message)s", stream=stream)
        logging.getLogger("flwr").debug("Runtime.AcquireTask")
        logging.getLogger("flwr").info("Received successfully")
        logging.getLogger(WORKER).info("round 0: answered the plan")
        logging.getLogger(WORKER).debug("round 0: answered a stage message")
        logging.getLogger("httpx").info('HTTP Request: POST https://link/v1/fleet/pull-messages "HTTP/1.1 200 OK"')
        text = stream.getvalue()
        assert "pull-messages" not in text  # a library's INFO line per 3-second poll is noise
        assert text.count("round 0: answered the plan") == 1
        assert "Runtime.AcquireTask" not in text and "answered a stage message" not in text
        assert "Received successfully" not in text  # Flower prints its own lines, through its own handler, once
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.getLogger("flwr").propagate = saved[2]
        logging.getLogger("clinograph").setLevel(saved[3])


def test_flowers_five_lines_a_message_are_left_out_of_a_hospitals_log_unless_debug():
    """A loopback run of the deployment guide left 1 108 lines in a hospital's log, 52 of them
    Clinograph's: Flower logs '', '[RUN r, ROUND x]', 'Receiving: ... (ID: ...)', 'Received
    successfully' and the same for sending, at INFO, for every message."""
    flwr_logger = logging.getLogger("flwr")
    saved = (list(logging.getLogger().handlers), logging.getLogger().level,
             flwr_logger.propagate, list(flwr_logger.filters), logging.getLogger("clinograph").level)
    flwr_logger.filters.clear()  # what other tests of this process installed is not under test here
    flwr_level, _ = flwr_logger.level, flwr_logger.setLevel(logging.DEBUG)  # Flower's own, set at its import
    keep, seen = _kept_messages(flwr_logger)
    try:
        for level, expected in (("info", ["SuperNode ID: 7", "Connection lost"]),
                                ("debug", ["SuperNode ID: 7", "", "[RUN 1, ROUND round-0]", "Receiving: q message "
                                           "(ID: ab)", "Received successfully", "Sent successfully",
                                           "Connection lost"])):
            seen.clear()
            configure_hospital_logging(level, stream=io.StringIO())
            flwr_logger.info("SuperNode ID: %s", 7)
            flwr_logger.info("")
            flwr_logger.info("[RUN %s, ROUND %s]", 1, "round-0")
            flwr_logger.info("Receiving: %s message (ID: %s)", "q", "ab")
            flwr_logger.info("Received successfully")
            flwr_logger.info("Sent successfully")
            flwr_logger.warning("Connection lost")
            assert seen == expected, level
            from flwr.common.logger import console_handler

            assert console_handler.colored is False  # stderr is not a terminal here: no escape codes in a log file
    finally:
        flwr_logger.removeHandler(keep)
        flwr_logger.setLevel(flwr_level)
        flwr_logger.filters[:] = saved[3]
        logging.getLogger().handlers[:] = saved[0]
        logging.getLogger().setLevel(saved[1])
        flwr_logger.propagate = saved[2]
        logging.getLogger("clinograph").setLevel(saved[4])
        from flwr.common.logger import update_console_handler

        update_console_handler(level="INFO", timestamps=False, colored=True)


@pytest.mark.parametrize("kind", ["refused", "dropped", "hospital_retired", "failed", "run_ended"])
def test_a_hospitals_reason_cannot_write_escapes_or_fake_lines_to_the_operators_terminal(kind):
    """A refusal's reason is the hospital's own signed text: ANSI escapes, a newline and a fake log
    line, a bidi override or a NUL went to the ServerApp's log and `flwr run --stream` as they were."""
    reason = "bad\x1b[2J\x1b]0;t\x07\nINFO run ended (completed)\u202egnp\x00\x9b"
    level, line = progress_line(kind, {"round": 1, "hospital": "h1", "client": "h1", "stage": "plan",
                                       "reason": reason}, nodes={})
    assert line.isprintable() and "\n" not in line
    assert "bad\\x1b[2J\\x1b]0;t\\x07\\nINFO run ended (completed)\\u202egnp\\x00\\x9b" in line


def test_the_serverapps_stream_does_not_end_with_flowers_blank_exit_line():
    """Every `clinograph run` stream ended with 'INFO :      ' (flwr-serverapp's flwr_exit logs an
    empty INFO line when the ServerApp ends cleanly)."""
    from clinograph.secure.transport.flower import serverapp

    flwr_logger = logging.getLogger("flwr")
    saved = list(flwr_logger.filters)
    flwr_logger.filters.clear()  # what other tests of this process installed is not under test here
    flwr_level, _ = flwr_logger.level, flwr_logger.setLevel(logging.DEBUG)  # Flower's own, set at its import
    keep, seen = _kept_messages(flwr_logger)
    try:
        serverapp._log_to_stdout()
        flwr_logger.info("")
        flwr_logger.info("Run finished")
        assert seen == ["Run finished"]
        # a ClinographError the ServerApp raised: Flower's line, without the ~25-line traceback that
        # followed our own 'run failed' line in the stream; any other exception keeps its traceback
        records = []

        class Records(logging.Handler):
            def emit(self, record):
                records.append(record)

        rec = Records()
        flwr_logger.addHandler(rec)
        for exc in (ConfigError("Cannot read server config /x.toml"), ZeroDivisionError("division by zero")):
            try:
                raise exc
            except Exception as caught:  # noqa: BLE001
                flwr_logger.error("%s raised an exception", "ServerApp", exc_info=caught)
        flwr_logger.removeHandler(rec)
        ours, other = records
        assert ours.exc_info is None and ours.getMessage() == (
            "ServerApp raised an exception: ConfigError, named on the 'run failed' line above")
        assert other.exc_info is not None and other.getMessage() == "ServerApp raised an exception"
    finally:
        flwr_logger.removeHandler(keep)
        flwr_logger.setLevel(flwr_level)
        flwr_logger.filters[:] = saved



def test_the_finished_line_says_which_model_and_that_its_rounds_are_this_runs():
    """The guide's run ended 'run ended (completed) after 10 of 10 round(s)' then 'finished: 2
    round(s)' (the kept candidate's rounds in this extension, its scoring round included), and
    `clinograph run` said 'completed: 10 of 10': three counts, two unexplained."""
    assert progress_line("finished", {"rounds": 2, "candidate": "model"}, nodes={}) == (
        logging.INFO, "finished: model 'model' kept; 2 round(s) of it ran in this run")


def test_when_too_few_hospitals_answer_the_hello_the_runs_failure_names_each_refusal(tmp_path):
    """Before: two hospitals whose data could not be read (a database refusing the connection) refused the hello,
    and the run's failure -- the last line `clinograph run` prints -- said only 'Only 1 hospital(s) proved they
    serve an enrolled hospital ...; Check the SuperNodes' logs and key files' (the keys were fine)."""
    from clinograph.core.errors import SourceUnavailable

    workers, grid, run_config = _deploy(tmp_path)

    def unreadable(**_):
        raise SourceUnavailable("Cannot connect to the OMOP database postgresql+psycopg://reader:***@db/cdm "
                                "(OperationalError).\n  Check the host.")
    for w in workers[:2]:
        w.factory = unreadable
    try:
        with pytest.raises(ProtocolError) as caught:
            run_federation(grid, run_config)
    finally:
        for w in workers:
            w.stop()
    said = str(caught.value)
    assert said.startswith("Only 1 hospital(s) proved they serve an enrolled hospital")
    assert ("2 node(s) refused the hello -- node 101: Hospital 'h1' refused the 'hello' message: SourceUnavailable: "
            "Cannot connect to the OMOP database postgresql+psycopg://reader:***@db/cdm (OperationalError). Check "
            "the host.; node 102: Hospital 'h2'") in said
    assert "key files" not in said and "\n" not in said and "\\n" not in said
