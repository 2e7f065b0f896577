"""The warm executor runs ClientApps through Flower's own runtime; a ClientApp that fails is reported.

A SuperLink (TLS), one SuperNode started by our launcher with its default ``--executor warm``
(Flower's SuperNode in ``--isolation process``, our SuperExec thread, each ClientApp forked
from the pre-imported forkserver) and ``flwr run`` of a stand-in Flower app written here, whose
ServerApp sends the node four messages one after another and writes what came back:

1. ``ok``: a reply from a ClientApp process whose parent is the forkserver, not the SuperNode
   (which is what Flower's ``flwr-clientapp`` subprocess would have as grandparent);
2. ``raise``: the ClientApp raises -- the server gets Flower's error reply with the reason;
3. ``die``: the ClientApp SIGKILLs itself -- the server gets Flower's "ClientApp stopped
   responding" error reply, within a task poll: the executor expires the dead child's task token
   (``crash_report.py``) where Flower would wait 60 s for it to expire;
4. ``ok`` again: the node still serves, from a new process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from flower_processes import descendants, flower_processes, stand_in_app  # noqa: E402

STAND_IN = '''
    """A stand-in app: the ServerApp sends four messages to the one node; the ClientApp obeys each."""
    import json, os, signal, time
    from flwr.app import ConfigRecord, Context, Message, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp

    app = ServerApp()
    client = ClientApp()

    @client.query()
    def _query(message: Message, context: Context) -> Message:
        action = message.content["c"]["action"]
        if action == "raise":
            raise RuntimeError("the stand-in ClientApp refuses")
        if action == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as fh:
            parent = fh.read().replace(b"\\0", b" ").decode()
        reply = ConfigRecord({"pid": os.getpid(), "ppid": os.getppid(), "parent": parent})
        return Message(RecordDict({"c": reply}), reply_to=message)

    @app.main()
    def _main(grid: Grid, context: Context) -> None:
        nodes = []
        while not nodes:
            nodes = list(grid.get_node_ids())
            time.sleep(0.2)
        out = []
        for action in ("ok", "raise", "die", "ok"):
            msg = Message(RecordDict({"c": ConfigRecord({"action": action})}), dst_node_id=nodes[0],
                          message_type="query")
            replies = list(grid.send_and_receive([msg], timeout=150))
            if not replies:
                out.append({"action": action, "reply": None})
            elif replies[0].has_error():
                out.append({"action": action, "error": replies[0].error.reason})
            else:
                out.append({"action": action, **dict(replies[0].content["c"])})
            with open(context.run_config["out-file"], "w") as fh:
                json.dump(out, fh)
'''

APP_CONFIG = """
out-file = ""
"""


@pytest.mark.slow
def test_the_warm_executor_runs_clientapps_and_reports_one_that_raises_or_dies(tmp_path):
    app = stand_in_app(tmp_path / "app", code=STAND_IN, config=APP_CONFIG)
    out = tmp_path / "replies.json"
    read = lambda: json.loads(out.read_text()) if out.exists() else []  # noqa: E731
    with flower_processes(tmp_path, federation_id="fed-warm", hospitals=["h1"], budget=240.0,
                          pythonpath=[]) as fp:
        fp.superlink(node_auth=False)
        # the node runs only the ClientApp it names; that stand-in never asks the node's worker for a
        # participant, so the factory is any callable without the default factory's data-dir preflight
        # (which refuses a node started without a hospital's files, as it should)
        node = fp.supernode("h1", node_config={"state-dir": tmp_path / "s"}, node_auth=False, environment=None,
                            factory="builtins:dict", extra=("--clientapp", "stand_in:client"))
        fp.flwr_run({"out-file": out}, app=app)
        fp.wait(lambda: len(read()) == 4, what="the four replies", procs=fp.named("superlink", "supernode-h1"))
        log = fp.log_tail("supernode-h1", 20000)
        below = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in descendants(node.pid)]
    first, raised, died, again = read()
    assert first["action"] == "ok" and "multiprocessing.forkserver" in first["parent"], first
    assert first["ppid"] != node.pid  # not a child of the SuperNode: of its forkserver
    assert "the stand-in ClientApp refuses" in raised["error"]
    assert died["error"] == "ClientApp stopped responding."
    assert again["action"] == "ok" and again["pid"] != first["pid"] and "multiprocessing.forkserver" in again["parent"]
    assert "exited with signal 9" in log  # the executor reaped the killed child and said so
    assert below and not any(b"flower-superexec" in b or b"flwr-clientapp" in b for b in below)  # no Flower subprocess
