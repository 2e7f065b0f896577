"""Imported once in the warm executor's forkserver (:data:`.superexec.PRELOAD`): what every
ClientApp would otherwise load lazily, loaded before the fork.

Flower's ClientApp builds its Runtime API client (``httpx.Client``) first thing, and httpx
imports its transport (httpcore, h11, anyio's backend probe, attrs) on the first client built
in a process, not when ``httpx`` is imported. In a forked ClientApp that was 0.26-0.75 s of
every message (measured: ``benchmarks/flower_scale/round_time.py``, ``setup_parts.http_client``),
more than the rest of its work. :func:`warm_http_client` builds and closes one client here (the
same class and call as the ClientApp's), so the forked children find those modules loaded.

What crosses the fork is only imported code: the client is closed before any child exists and
never opened a connection, so no socket, TLS session or thread is shared. (An ``SSLContext``
would be fork-safe too -- OpenSSL reseeds its generator in a forked child -- but nothing needs
sharing: Flower builds the Runtime API's context in the child from the CA file, a few
milliseconds; the cost was the imports.)
"""

from __future__ import annotations


def warm_http_client() -> None:
    """Build and close one Runtime API client as Flower's ClientApp does (no connection is made):
    httpx's lazy imports happen now."""
    from flwr.supercore.runtime import RuntimeHttpClient

    RuntimeHttpClient.from_server_address(server_address="127.0.0.1:9", insecure=True, root_certificates=None,
                                          interceptors=[]).close()


warm_http_client()
