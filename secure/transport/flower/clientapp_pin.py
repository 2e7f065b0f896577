"""The only ClientApp a hospital's SuperNode runs: the one its operator names, never the one a
run's FAB names.

In Flower, whoever submits a run (``flwr run``) ships a FAB -- the app's pyproject and code --
and every SuperNode's ClientApp process installs it and imports the ClientApp its pyproject
names (``[tool.flwr.app.components] clientapp``), from the FAB's own files. That code runs as
the hospital's SuperNode user, beside the hospital's data, keys and state. The hospital's
protocol (signed plans, masks, refusals) is worthless against it.

:func:`pin_clientapp`, called in every ClientApp process the warm executor forks
(:mod:`.superexec`) before Flower's ``run_clientapp``, replaces Flower's ClientApp loader with
one that reads the FAB's pyproject and refuses (Flower's ``LoadClientAppError``: an error reply
to the server, nothing imported) any ClientApp reference other than the node's
``--clientapp``. Clinograph's own (the default, :data:`CLINOGRAPH_CLIENTAPP`) is taken from
the installed package, never from the FAB's files. Another reference the operator names
explicitly (e.g. a test's stand-in) is loaded by Flower's own loader from the FAB.

Not covered: ``--executor subprocess`` (Flower's own ``flwr-clientapp`` loads whatever the FAB
names) and ``--runtime-dependency-install`` (pip installs the FAB's dependencies, whose
installation may run code).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

#: Clinograph's ClientApp: the relay to the hospital's worker
CLINOGRAPH_CLIENTAPP = "clinograph.secure.transport.flower.clientapp:app"


def pinned_loader(allowed: str) -> Callable[..., Callable[[str, str, str], Any]]:
    """A stand-in for Flower's ``get_load_client_app_fn`` whose loader runs only ``allowed``."""
    from flwr.clientapp.client_app import ClientApp, LoadClientAppError
    from flwr.common.config import get_project_config, get_project_dir
    from flwr.supercore.object_ref import load_app

    def get_load_client_app_fn(default_app_ref: str, app_path: str | None, multi_app: bool
                               ) -> Callable[[str, str, str], Any]:
        del default_app_ref, app_path, multi_app  # the run's FAB names the app; the operator allows one

        def load(fab_id: str, fab_version: str, fab_hash: str) -> Any:
            app_dir = get_project_dir(fab_id, fab_version, fab_hash)
            try:
                ref = get_project_config(app_dir)["tool"]["flwr"]["app"]["components"]["clientapp"]
            except (KeyError, TypeError, ValueError) as exc:
                raise LoadClientAppError(f"The run's app names no ClientApp ({type(exc).__name__}).") from None
            if ref != allowed:
                raise LoadClientAppError(
                    f"The run's app names ClientApp {str(ref)[:200]!r}; this hospital's SuperNode runs only "
                    f"{allowed!r} (its --clientapp). Refused: nothing of the app was imported.")
            if allowed == CLINOGRAPH_CLIENTAPP:  # from the installed package, never from the FAB's files
                module, _, attr = allowed.partition(":")
                app = getattr(importlib.import_module(module), attr)
            else:
                app = load_app(allowed, LoadClientAppError, app_dir)
            if not isinstance(app, ClientApp):
                raise LoadClientAppError(f"{allowed!r} is not a ClientApp.")
            return app

        return load

    return get_load_client_app_fn


def pin_clientapp(allowed: str = CLINOGRAPH_CLIENTAPP) -> None:
    """In a ClientApp process, before Flower's ``run_clientapp``: load only ``allowed``."""
    import flwr.supernode.runtime.run_clientapp as runtime

    runtime.get_load_client_app_fn = pinned_loader(allowed)  # type: ignore[assignment]
