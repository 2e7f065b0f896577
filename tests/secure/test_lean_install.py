"""The server is a lean install: clinograph.secure imports with torch, PyG, Opacus and the SDK blocked."""

import subprocess
import sys
import textwrap


def test_secure_imports_without_torch_or_sdk():
    code = textwrap.dedent('''
        import importlib, pkgutil, sys
        BLOCKED = ("torch", "torch_geometric", "opacus", "clinograph.sdk")
        class Block:
            def find_spec(self, name, path=None, target=None):
                if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                    raise ImportError(f"blocked: {name}")
                return None
        sys.meta_path.insert(0, Block())
        import clinograph.secure as s
        n = 0
        for m in pkgutil.walk_packages(s.__path__, "clinograph.secure."):
            if ".transport.flower" in m.name:
                continue  # the Flower adapter is optional on a server without flwr; checked below
            importlib.import_module(m.name)
            n += 1
        assert not any(k == "torch" or k.startswith("torch.") for k in sys.modules)
        print(n)
    ''')
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip().splitlines()[-1]) >= 20
