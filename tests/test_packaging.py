"""The wheel ships every subpackage under clinograph.* and no top-level sdk/secure."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_contains_every_subpackage(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
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
    assert "clinograph/sdk/research/alarm_dictionary.toml" in names
