"""``clinograph supernode``'s check before Flower starts: the hospital is the federation's.

(Its local Runtime API port is checked by the launcher itself,
``clinograph.secure.transport.flower.supernode.check_runtime_port``, so that ``python -m`` of the
launcher, which the deployment guide runs, refuses a taken port as this command does.)
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def check_enrolment(args: Sequence[str]) -> None:
    """ConfigError if ``--node-config`` names a hospital its ``federation-file`` does not enrol, or
    a ``key-file`` that is not that hospital's enrolled key (both went unnoticed until the first
    run's greeting, which the server refuses). Missing keys are the launcher's to report."""
    from pathlib import Path

    from flwr.common.config import parse_config_args

    from clinograph.core.errors import ConfigError
    from clinograph.core.identity import Identity
    from clinograph.secure.enrolment import load_federation

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--node-config")
    ours, _ = parser.parse_known_args(list(args))
    if not ours.node_config:
        return
    try:
        config = parse_config_args([ours.node_config])
    except Exception:  # noqa: BLE001 -- malformed: the launcher parses it again and says so
        return
    hospital, fed_file, key_file = (config.get(k) for k in ("hospital", "federation-file", "key-file"))
    if not all(isinstance(v, str) and v for v in (hospital, fed_file, key_file)):
        return
    fed = load_federation(Path(fed_file))
    enrolled = fed.enrolled()
    if hospital not in enrolled:
        raise ConfigError(f"--node-config hospital={hospital!r} is not enrolled in federation-file {fed_file} "
                          f"(federation {fed.federation_id!r}: {', '.join(enrolled)}). Use this hospital's own "
                          "name, or the federation.toml of the federation it belongs to (`clinograph keys init "
                          "--hospital NAME` enrols it).")
    mine = Identity.load(hospital, Path(key_file)).public
    if mine.raw != enrolled[hospital].raw:
        holder = [name for name, key in enrolled.items() if key.raw == mine.raw]
        whose = f"it is the key of {holder[0]!r}" if holder else "it is no enrolled hospital's key"
        raise ConfigError(f"--node-config key-file {key_file} is not the key enrolled for {hospital!r} in {fed_file} "
                          f"({whose}; fingerprint {mine.fingerprint[:16]}, enrolled "
                          f"{enrolled[hospital].fingerprint[:16]}). Use {hospital}'s own {hospital}.ed25519.pem "
                          "from `clinograph keys init`.")
