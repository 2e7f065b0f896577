"""Flower transport: Clinograph's protocol messages ride on Flower's Message API as bytes.

Flower (``flwr`` 1.41: SuperLink, SuperNodes, ServerApp/ClientApp, Grid) carries every hop
between machines over TLS with node authentication; Clinograph is the protocol. Each stage of
:func:`clinograph.secure.runtime.run_round` (over :class:`.driver.FlowerTransport`) becomes one Flower ``Message`` whose content is a
``RecordDict`` with one ``ConfigRecord`` holding the stage name and the exact bytes.

The adapter is pinned to one Flower minor version: :func:`check_flower_version` refuses any
other, because it depends on the 1.41 Message API and on how 1.41 runs ClientApps (one short
process per message, so the hospital lives in the SuperNode process, see :mod:`.worker`).

Layout (one job a module): :mod:`.records` (stage <-> RecordDict), :mod:`.messages` (the
signed node hello), :mod:`.driver` (server side: discover hospitals, run a round over a Grid),
:mod:`.serverapp` / :mod:`.clientapp` (the Flower components), :mod:`.worker` / :mod:`.ipc` /
:mod:`.supernode` (the hospital inside the SuperNode process), :mod:`.superexec` (the warm
executor: each ClientApp forked from a pre-imported parent), :mod:`.polling` (the SuperNode's
fixed waits made settable), :mod:`.enrolment` (the
federation file written by ``clinograph keys init``).
"""

from __future__ import annotations

from clinograph.core.errors import ConfigError

SUPPORTED_FLWR = "1.41"


def check_flower_version(version: str | None = None) -> str:
    """Return the installed flwr version; ConfigError unless it is 1.41.x."""
    if version is None:
        try:
            import flwr
        except ModuleNotFoundError:
            raise ConfigError("The Flower transport needs flwr 1.41: pip install 'flwr>=1.41,<1.42'.") from None
        version = flwr.__version__
    if not (version == SUPPORTED_FLWR or version.startswith(SUPPORTED_FLWR + ".")):
        raise ConfigError(f"flwr {version} is installed, but the Clinograph Flower adapter is pinned to "
                          f"{SUPPORTED_FLWR}.x. Install it with pip install 'flwr>={SUPPORTED_FLWR},<1.42'.")
    return version


__all__ = ["SUPPORTED_FLWR", "check_flower_version"]
