"""Opacus imported with the host process's logging left as it was.

``opacus.utils.module_utils`` (imported by ``import opacus``) calls ``logging.basicConfig`` at
import: on a process whose root logger has no handler yet it adds a stderr handler, and a host
application's own later ``logging.basicConfig(level=..., format=...)`` then does nothing (the
root logger already has a handler). Clinograph imports Opacus lazily, at a hospital's first
DP step or accountant; every such import goes through :func:`import_opacus`, which imports it
inside :func:`root_logger_kept`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def root_logger_kept() -> Iterator[None]:
    """A placeholder handler on the root logger for the block, so a ``logging.basicConfig`` run
    inside it finds one and does nothing; removed after (the root logger's handlers as they were)."""
    root = logging.getLogger()
    placeholder = logging.NullHandler()
    root.addHandler(placeholder)
    try:
        yield
    finally:
        root.removeHandler(placeholder)


def import_opacus() -> None:
    """Import Opacus once, leaving the root logger's handlers as they were."""
    if "opacus" in sys.modules:
        return
    with root_logger_kept():
        import opacus  # noqa: F401
