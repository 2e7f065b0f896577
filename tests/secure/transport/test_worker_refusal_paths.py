"""A hospital's refusal reaches the server, its audit log and the published report: it says what
went wrong, not where the hospital keeps its files (hops6's leftover: a hello refused over an
unreadable EHR source carried the data-dir's absolute path into the server's audit log)."""

from __future__ import annotations

import logging
import os
import socket
import threading

from clinograph.secure.transport.flower.ipc import recv_frame, send_frame
from clinograph.secure.transport.flower.worker import HospitalWorker

from clinograph.core.errors import ConfigError
from clinograph.core.identity import Identity


def _worker(tmp_path, factory):
    key = tmp_path / "keys" / "h1.pem"
    key.parent.mkdir()
    Identity.generate("h1").save(key)
    data = tmp_path / "srv" / "ward 7" / "data"
    data.mkdir(parents=True)
    config = {"hospital": "h1", "state-dir": str(tmp_path / "state"), "key-file": str(key), "data-dir": str(data)}
    return HospitalWorker(node_config=config, factory=factory), data


def _ask(worker, header, parts):
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    serving = threading.Thread(target=worker._serve_one, args=(theirs,))
    serving.start()
    try:
        send_frame(ours, header, parts)
        return recv_frame(ours)[0]
    finally:
        ours.close()
        serving.join(5)


def test_a_refused_hello_names_the_node_paths_by_key_not_by_where_they_are(tmp_path, caplog):
    def factory(*, node_config, **_):
        source = os.path.join(node_config["data-dir"], "source", "measurement.csv")
        raise ConfigError(f"{source}: column 'value_as_number' is missing. Export the table again "
                          f"(key {node_config['key-file']}).")

    worker, data = _worker(tmp_path, factory)
    with caplog.at_level(logging.WARNING, logger="clinograph.secure.transport.flower.worker"):
        answer = _ask(worker, {"stage": "hello", "run_id": 3, "node_id": 9},
                      {"federation": b"fed", "nonce": bytes(32)})
    assert answer["ok"] is False
    error = answer["error"]
    assert "<data-dir>/source/measurement.csv: column 'value_as_number' is missing" in error
    assert "(key <key-file>)" in error
    assert str(tmp_path) not in error and "ward 7" not in error
    assert str(data) in caplog.text  # the hospital's own log keeps where


def test_redaction_takes_resolved_paths_and_the_longest_first(tmp_path):
    worker, data = _worker(tmp_path, lambda **_: None)
    link = tmp_path / "link"
    link.symlink_to(data)
    worker.node_config["data-dir"] = str(link) + "/"
    worker.node_config["state-dir"] = str(tmp_path)  # a parent of the others: replaced after them
    text = f"read {data}/a.csv, {link}/b.csv and {tmp_path}/c"
    assert worker.redact(text) == "read <data-dir>/a.csv, <data-dir>/b.csv and <state-dir>/c"
