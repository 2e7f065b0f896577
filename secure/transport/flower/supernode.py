"""Start a hospital's SuperNode with the hospital living inside it.

Usage (every argument after the factory goes to ``flower-supernode`` unchanged)::

    python -m clinograph.secure.transport.flower.supernode \
        --participant-factory mypkg.hospital:make_participant \
        --superlink superlink.example.org:9092 --root-certificates keys/ca.pem \
        --auth-supernode-private-key keys/h1.node-auth \
        --node-config "hospital='h1' data-dir='/srv/h1/data' state-dir='/srv/h1/state' key-file='keys/h1.ed25519.pem'"

It loads the hospital's signing key, starts the :class:`~.worker.HospitalWorker` on the
state directory's local socket, then runs Flower's own SuperNode main in this process. With
``--insecure`` (plain-text gRPC) it refuses unless ``--insecure-transport`` is also given,
which goes through :func:`clinograph.secure.policy.require_allowed` (warns; refused in
production).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ...errors import ClinographError, ConfigError
from ...policy import Environment, require_allowed
from . import check_flower_version
from .worker import HospitalWorker, check_node_config, load_factory


def check_transport(flower_args: Sequence[str], *, insecure_transport: bool, environment: Environment) -> None:
    """Refuse ``--insecure`` unless named (``insecure_transport``); warns, refused in production."""
    if "--insecure" not in flower_args:
        return
    if not insecure_transport:
        raise ConfigError("flower-supernode --insecure sends protocol messages without TLS. Remove it and pass "
                          "--root-certificates, or add --insecure-transport --environment development.")
    require_allowed("insecure_transport", environment=environment, why="Flower messages travel without TLS")


def main(argv: list[str] | None = None) -> int:
    """Parse our options, start the worker, hand the rest to ``flower-supernode``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # allow_abbrev=False: Flower's own --insecure must not be taken for our --insecure-transport
    parser = argparse.ArgumentParser(prog="clinograph-supernode", add_help=True, allow_abbrev=False)
    parser.add_argument("--participant-factory", required=True, help="'package.module:function' building the hospital")
    parser.add_argument("--insecure-transport", action="store_true", help="allow flower-supernode --insecure")
    parser.add_argument("--environment", choices=["development", "production"], default="production")
    parser.add_argument("--node-config", required=True)
    ours, rest = parser.parse_known_args(argv)
    try:
        check_flower_version()
        from flwr.common.config import parse_config_args

        check_transport(rest, insecure_transport=ours.insecure_transport, environment=ours.environment)
        node_config = parse_config_args([ours.node_config])
        check_node_config(node_config)
        worker = HospitalWorker(node_config=node_config, factory=load_factory(ours.participant_factory))
        worker.start()
    except ClinographError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from flwr.supernode.cli import flower_supernode

    sys.argv = ["flower-supernode", *rest, "--node-config", ours.node_config]
    try:
        flower_supernode()
    finally:
        worker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
