"""Opacus's import-time ``logging.basicConfig`` does not reach an embedding host's root logger
(sdk/privacy/opacus_import.py)."""

from __future__ import annotations

import ast
import importlib
import logging
from pathlib import Path

from clinograph.sdk.privacy.opacus_import import import_opacus, root_logger_kept

SDK = Path(__file__).resolve().parents[3] / "sdk"


def test_opacus_import_adds_no_root_handler_inside_the_guard(monkeypatch):
    """Opacus's module_utils run again (what its first import runs) on a root logger without
    handlers: bare, it adds a stderr handler; inside the guard, the root logger is left empty."""
    import_opacus()
    import opacus.utils.module_utils as module_utils

    monkeypatch.setattr(logging.root, "handlers", [])
    importlib.reload(module_utils)
    assert len(logging.root.handlers) == 1, "Opacus no longer calls logging.basicConfig at import: drop the guard"
    monkeypatch.setattr(logging.root, "handlers", [])
    with root_logger_kept():
        importlib.reload(module_utils)
    assert logging.root.handlers == []


def test_every_opacus_import_in_the_sdk_goes_through_the_guard():
    """Each function that imports from opacus calls import_opacus() first (a module-level opacus
    import would also run at import, before any guard)."""
    unguarded = []
    for path in sorted(SDK.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if "opacus" not in text:
            continue
        tree = ast.parse(text)
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if not isinstance(body, list):
                continue
            guarded = False
            for stmt in body:
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) \
                        and getattr(stmt.value.func, "id", None) == "import_opacus":
                    guarded = True
                opacus = (isinstance(stmt, ast.ImportFrom) and (stmt.module or "").split(".")[0] == "opacus") or \
                    (isinstance(stmt, ast.Import) and any(a.name.split(".")[0] == "opacus" for a in stmt.names))
                if opacus and not (guarded or path.name == "opacus_import.py"):
                    unguarded.append(f"{path.relative_to(SDK)}:{stmt.lineno}")
    assert unguarded == []
