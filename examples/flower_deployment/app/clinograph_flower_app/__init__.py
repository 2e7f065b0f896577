"""Demo data for the example deployment (no production code: the ServerApp, ClientApp and the
hospital inside each SuperNode are Clinograph's own, configured by TOML files).

:mod:`.prepare` -- writes demo hospital folders cut from the ALARM network, the server's
``server.toml`` and its initial model (loopback demo and tests).
"""
