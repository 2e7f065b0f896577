"""Import contracts: the server never imports the SDK or torch; the CLI imports torch only lazily.

The contracts live in pyproject.toml ([tool.importlinter]) and are checked by import-linter.
``make lint`` runs this file as a script (``python tests/test_import_contracts.py``), the
test suite runs the same check below.

Why a shadow tree: setup.py maps sdk/ and secure/ to ``clinograph.sdk`` and
``clinograph.secure``. import-linter (grimp) finds a root package with
``importlib.util.find_spec`` and walks that one folder, so with the editable install it sees
clinograph/ only (cli, commands, demo_view), and it refuses a dotted root package such as
``clinograph.secure`` ("not a top-level module"). :func:`shadow_tree` lays the package out as
a wheel installs it, with symlinks (``<tmp>/clinograph/{cli.py, commands, ..., sdk, secure}``;
grimp follows symlinks), and lint-imports runs with that folder first on PYTHONPATH and from
outside the repository (else the repository's own clinograph/ is found first).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYOUT = {"sdk": "sdk", "secure": "secure"}  # clinograph.<key> comes from <repo>/<value>


def shadow_tree(dest: Path) -> Path:
    """Lay out ``clinograph`` as installed, in symlinks under ``dest``; returns ``dest``."""
    pkg = dest / "clinograph"
    pkg.mkdir(parents=True)
    for entry in (ROOT / "clinograph").iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    for name, folder in LAYOUT.items():
        (pkg / name).symlink_to(ROOT / folder, target_is_directory=True)
    return dest


def lint_imports(*, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run lint-imports (the one beside this interpreter) on the shadow tree."""
    exe = Path(sys.executable).parent / "lint-imports"
    with tempfile.TemporaryDirectory(prefix="clinograph-importlinter-") as tmp:
        tree = shadow_tree(Path(tmp) / "tree")
        env = {**os.environ, "PYTHONPATH": str(tree)}
        return subprocess.run([str(exe), "--config", str(config or ROOT / "pyproject.toml"), "--no-logo",
                               "--no-cache"], capture_output=True, text=True, timeout=300, cwd=tmp, env=env)


def test_import_contracts_hold():
    out = lint_imports()
    assert out.returncode == 0, f"lint-imports failed (exit {out.returncode}):\n{out.stdout}\n{out.stderr}"
    assert "BROKEN" not in out.stdout and "KEPT" in out.stdout, out.stdout


def test_import_linter_sees_the_mapped_packages(tmp_path):
    # A contract that must break: if the shadow tree did not expose clinograph.sdk, this would
    # error ("Module 'clinograph.sdk' does not exist") or pass vacuously.
    cfg = tmp_path / "broken.toml"
    cfg.write_text(textwrap.dedent("""
        [tool.importlinter]
        root_packages = ["clinograph"]
        include_external_packages = true

        [[tool.importlinter.contracts]]
        name = "sdk without torch (must break)"
        type = "forbidden"
        source_modules = ["clinograph.sdk"]
        forbidden_modules = ["torch"]

        [[tool.importlinter.contracts]]
        name = "secure without cryptography (must break)"
        type = "forbidden"
        source_modules = ["clinograph.secure"]
        forbidden_modules = ["cryptography"]
    """))
    out = lint_imports(config=cfg)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Contracts: 0 kept, 2 broken." in out.stdout, out.stdout
    assert "clinograph.sdk." in out.stdout and "-> torch" in out.stdout


def test_the_acyclic_contract_sees_a_loop_through_a_function_level_import(tmp_path):
    # The "acyclic" contract of pyproject.toml must be able to fail: a package whose two
    # modules import each other, one of them only inside a function, is a loop.
    pkg = tmp_path / "src" / "loopy"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from loopy.b import B\n\nA = 1\n")
    (pkg / "b.py").write_text("B = 2\n\n\ndef late():\n    from loopy.a import A\n    return A\n")
    cfg = tmp_path / "loop.toml"
    cfg.write_text(textwrap.dedent("""
        [tool.importlinter]
        root_packages = ["loopy"]

        [[tool.importlinter.contracts]]
        name = "no loops (must break)"
        type = "acyclic_siblings"
        ancestors = ["loopy"]
    """))
    exe = Path(sys.executable).parent / "lint-imports"
    out = subprocess.run([str(exe), "--config", str(cfg), "--no-logo", "--no-cache"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path / "src")})
    assert out.returncode == 1, out.stdout + out.stderr
    assert "no loops (must break) BROKEN" in out.stdout, out.stdout


def test_errors_are_importable_from_the_package_root():
    import clinograph
    from clinograph.core import errors

    kinds = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, errors.ClinographError)}
    assert kinds and kinds <= set(clinograph.__all__)
    assert all(getattr(clinograph, n) is getattr(errors, n) for n in kinds)


BLOCKED_CLI = textwrap.dedent("""
    import importlib, pkgutil, sys
    BLOCKED = ("torch", "torch_geometric", "opacus", "pgmpy", "sklearn", "clinograph.sdk")
    class Block:
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ModuleNotFoundError(f"blocked: {name}", name=name)
            return None
    sys.meta_path.insert(0, Block())
    import clinograph
    names = [m.name for m in pkgutil.walk_packages(clinograph.__path__, "clinograph.")]
    for name in names:
        importlib.import_module(name)
    heavy = sorted(k for k in sys.modules if k.split(".")[0] in ("torch", "matplotlib")
                   or k.startswith("clinograph.sdk"))
    assert not heavy, heavy
    print(" ".join(names))
    from clinograph.cli import main
    sys.argv = ["clinograph", *sys.argv[1:]]
    main()
""")


def _blocked_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCKED_CLI, *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})


def test_cli_package_imports_torch_only_lazily():
    # Contract (b), which import-linter cannot express (it counts imports inside functions):
    # every module of the CLI package imports with torch, the hospital libraries and
    # clinograph.sdk blocked, without loading matplotlib either, and the CLI starts.
    out = _blocked_cli("--help")
    assert out.returncode == 0, out.stderr[-3000:]
    modules = out.stdout.splitlines()[0].split()
    assert {"clinograph.cli", "clinograph.commands.audit", "clinograph.commands.keys"} <= set(modules)
    for command in ("demo", "simulate", "bench", "audit", "keys"):
        assert command in out.stdout
    out = _blocked_cli("audit", "verify", "--help")
    assert out.returncode == 0 and "--trusted-key" in out.stdout, out.stderr[-3000:]


def test_demo_without_the_hospital_extra_names_it():
    out = _blocked_cli("demo", "--rounds", "1")
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "clinograph demo needs the hospital install: pip install 'clinograph[hospital]'" in out.stderr
    assert "missing: torch, torch_geometric, opacus, pgmpy, sklearn" in out.stderr
    assert "Traceback" not in out.stderr


if __name__ == "__main__":  # make lint
    result = lint_imports()
    print(result.stdout, result.stderr, sep="", end="")
    raise SystemExit(result.returncode)
