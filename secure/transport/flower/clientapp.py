"""The Flower ClientApp: relays each Clinograph message to the hospital in its SuperNode.

Flower 1.41 runs every message in a fresh ClientApp process (forked from a warm parent by our
launcher's default executor, :mod:`.superexec`; a new ``flwr-clientapp`` interpreter on Flower's
own path); this handler only moves
bytes between the Flower message and the hospital worker of its SuperNode (:mod:`.worker`),
found through ``state-dir`` in the node config. A hospital's refusal of a round message comes
back as its signed ``refusal`` part in an ordinary reply (audited by the server as
``hospital_refused``); any other failure is raised, so Flower returns an error reply, which
the server counts as a dropout with that reason.

Point ``[tool.flwr.app.components] clientapp`` at
``clinograph.secure.transport.flower.clientapp:app``.
"""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from clinograph.core.errors import ProtocolError

from . import check_flower_version
from .ipc import call
from .records import from_content, to_content
from .worker import check_node_config, socket_path

#: Upper bound of one relayed call (training happens inside it); the run config may lower it.
DEFAULT_RELAY_TIMEOUT = 600.0

app = ClientApp()


def relay(message: Message, context: Context) -> Message:
    """Forward ``message`` to the hospital worker and wrap its answer as the reply."""
    check_flower_version()
    check_node_config(context.node_config)
    stage, round_, parts = from_content(message.content)
    header = {"stage": stage, "round": round_, "run_id": int(context.run_id), "node_id": int(context.node_id)}
    if stage == "hello":
        header["run_config"] = {k: v for k, v in context.run_config.items() if isinstance(v, str | int | float | bool)}
    timeout = float(context.run_config.get("relay-timeout", DEFAULT_RELAY_TIMEOUT))
    path = socket_path(Path(str(context.node_config["state-dir"])))
    answer, out = call(str(path), header=header, parts=parts, timeout=timeout)
    if not answer.get("ok"):
        raise ProtocolError(f"Hospital {context.node_config['hospital']!r} refused the {stage!r} message: "
                            f"{answer.get('error', 'no reason given')}")
    return Message(to_content(stage, out, round_=round_), reply_to=message)


@app.query("clinograph")
def _clinograph(message: Message, context: Context) -> Message:
    return relay(message, context)
