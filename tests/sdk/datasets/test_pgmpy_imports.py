"""pgmpy's deprecation warnings stay out of the operator's terminal."""

from __future__ import annotations

import ast
from pathlib import Path

SDK = Path(__file__).resolve().parents[3] / "sdk"


def unguarded_pgmpy_imports(source: str) -> list[int]:
    """Lines importing pgmpy outside a ``with warnings.catch_warnings():`` block."""
    tree = ast.parse(source)
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.With) and any("catch_warnings" in ast.unparse(i.context_expr) for i in node.items):
            guarded |= {n.lineno for n in ast.walk(node) if hasattr(n, "lineno")}
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
            and any((a.name if isinstance(n, ast.Import) else (n.module or "")).startswith("pgmpy")
                    for a in (n.names if isinstance(n, ast.Import) else [n]))
            and n.lineno not in guarded]


def test_every_pgmpy_import_is_inside_a_warnings_guard():
    """examples/flower_deployment's prepare.py (the deployment guide's step 5) printed pgmpy's
    'FutureWarning: `pgmpy.estimators.StructureScore` is deprecated' with its source line: importing
    pgmpy.sampling warns, and the import stood outside sample_alarm's warnings guard."""
    problems = [f"{path.relative_to(SDK.parent)}:{line}" for path in sorted(SDK.rglob("*.py"))
                if "pgmpy" in (text := path.read_text(encoding="utf-8"))
                for line in unguarded_pgmpy_imports(text)]
    assert problems == [], "pgmpy imported outside `with warnings.catch_warnings():` at " + ", ".join(problems)
    assert unguarded_pgmpy_imports("import warnings\ndef f():\n    from pgmpy.sampling import X\n") == [3]
    assert unguarded_pgmpy_imports("import warnings\nwith warnings.catch_warnings():\n    import pgmpy\n") == []
