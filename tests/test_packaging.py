"""The wheel ships every subpackage under clinograph.* (the demo's data and dictionaries
included) and no top-level sdk/secure, no research/ study and no benchmark script."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_contains_every_subpackage(tmp_path):
    # Built from a copy: setuptools' build/ folder keeps modules that were since moved away.
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info",
                                                               "__pycache__", "runs", ".hypothesis"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                          "-q", "-w", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    wheel = next(tmp_path.glob("clinograph-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = []
    for prefix, folder in (("clinograph", "clinograph"), ("clinograph/sdk", "sdk"), ("clinograph/secure", "secure")):
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.relative_to(ROOT / folder).as_posix()
            expected.append(f"{prefix}/{rel}")
    for folder in ("clinograph", "sdk", "secure"):
        for d in (ROOT / folder).rglob("*"):
            if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")):
                assert (d / "__init__.py").exists(), f"{d} has modules but no __init__.py: it would not ship"
    missing = [e for e in expected if e not in names]
    assert not missing, missing
    assert len(expected) >= 15
    assert not any(n.startswith(("sdk/", "secure/")) for n in names)
    # The demo's data and dictionaries ship; the studies and their benchmark scripts do not.
    for shipped in ("clinograph/sdk/datasets/alarm.py", "clinograph/sdk/datasets/alarm_dictionary.toml",
                    "clinograph/sdk/datasets/timeseries_dictionary.toml", "clinograph/sdk/demo/run.py"):
        assert shipped in names, shipped
    research = [n for n in names if any(part in {"research", "benchmarks"} for part in n.split("/"))]
    assert not research, research
    studies = {p.name for p in (ROOT / "research").rglob("*.py") if p.name != "__init__.py"}
    assert len(studies) >= 30  # the check below means something: there are study scripts to leave out
    shipped_modules = {n.rsplit("/", 1)[-1] for n in names if n.endswith(".py")}
    assert not {"_common.py", "run_all.py", "fcm_federation.py", "model_quality.py"} & shipped_modules


# ---- The installs: base (auditor), [server], [hospital], [all] (pyproject.toml) ----------

import ast  # noqa: E402
import re  # noqa: E402
import tomllib  # noqa: E402
from importlib.metadata import packages_distributions  # noqa: E402

HEAVY = {"torch", "torch-geometric", "opacus", "pgmpy", "scikit-learn"}


def _name(req: str) -> str:
    return re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].strip().lower().replace("_", "-")


def _deps() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_name(r) for r in project["dependencies"]}
    extras = {k: {_name(r) for r in v} for k, v in project["optional-dependencies"].items()}
    return base, extras


def _external_imports(*folders: str) -> set[str]:
    """Top-level names of every non-stdlib, non-clinograph module imported anywhere in ``folders``."""
    names = set()
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Import):
                    names |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "clinograph"}


def test_server_install_has_no_torch_and_hospital_has_the_server():
    base, extras = _deps()
    assert not (base | extras["server"]) & (HEAVY | {"torch-geometric"}), base | extras["server"]
    assert extras["server"] <= extras["hospital"], extras["server"] - extras["hospital"]
    assert extras["hospital"] <= extras["all"], extras["hospital"] - extras["all"]
    assert HEAVY <= extras["hospital"]
    assert "import-linter" in extras["test"]


def test_server_install_covers_what_the_server_and_the_cli_import():
    # Every distribution that secure/ or the CLI package imports (any level: lazy imports run
    # too) is in the base dependencies or the server extra; the CLI's hospital-only imports
    # (torch, via demo/simulate) are the exception the CLI reports itself.
    base, extras = _deps()
    server = base | extras["server"]
    dists = packages_distributions()
    needed = {}
    for module in _external_imports("secure", "clinograph") - {"torch"}:
        for dist in dists.get(module, [module]):
            needed[dist.lower().replace("_", "-")] = module
    missing = {d: m for d, m in needed.items() if d not in server}
    assert not missing, f"imported by the server/CLI but not in its install: {missing}"


def test_makefile_installs_torch_pinned_before_the_extras():
    make = (ROOT / "Makefile").read_text()
    torch_at = make.index("pip install -q --no-compile torch==2.13.0")
    extras_at = min(make.find(s) for s in ("'.[all,test]'", "'.[hospital,test]'") if s in make)
    assert torch_at < extras_at
    # uv installs the extras: it must keep that torch (no --upgrade, no --reinstall of it)
    extras_line = make[make.rfind("\n", 0, extras_at):make.find("\n", extras_at)]
    assert "uv pip install" in extras_line and "--upgrade" not in extras_line and "--reinstall" not in extras_line
    assert re.search(r"^lean: ", make, re.M) and "test-fast:" in make and '-m "not slow"' in make
