"""Fixtures of the integration tests that their modules must not import themselves: a SuperNode
imports a test module as its participant factory, with tests/integration (not tests/) on its path."""

from lean_env import lean_server_python  # noqa: F401 -- .venv-server's python (session fixture)
