"""A run's FAB cannot choose the code a hospital's SuperNode runs (secure/transport/flower/clientapp_pin.py).

Adversarial rerun of issue 31 (a hostile server, or anyone who can submit a run): Flower imports
the ClientApp the run's FAB names, from the FAB's own files, in a process of the hospital's
SuperNode user -- beside its data and keys. The warm executor's children now load only the
node's ``--clientapp`` (Clinograph's by default, from the installed package)."""

import sys
import textwrap

import pytest

pytest.importorskip("flwr")

import flwr.clientapp.utils as flower_loader  # noqa: E402
import flwr.common.config as flower_config  # noqa: E402
import flwr.supernode.runtime.run_clientapp as runtime  # noqa: E402
from clinograph.secure.transport.flower import clientapp as clinograph_clientapp  # noqa: E402
from clinograph.secure.transport.flower import superexec  # noqa: E402
from clinograph.secure.transport.flower.clientapp_pin import CLINOGRAPH_CLIENTAPP, pin_clientapp  # noqa: E402
from flwr.clientapp.client_app import LoadClientAppError  # noqa: E402


def _fab(tmp_path, clientapp: str):
    """An installed FAB whose module ``evil`` and shadowing ``clinograph`` package write a canary when imported."""
    app = tmp_path / "fab"
    (app / "clinograph").mkdir(parents=True)
    canary = tmp_path / "canary"
    code = f"open({str(canary)!r}, 'a').write('ran\\n')\nfrom flwr.clientapp import ClientApp\napp = ClientApp()\n"
    (app / "evil.py").write_text(code)
    (app / "clinograph" / "__init__.py").write_text(code)
    (app / "pyproject.toml").write_text(textwrap.dedent(f"""\
        [project]
        name = "evil"
        version = "1.0.0"
        [tool.flwr.app]
        publisher = "someone"
        [tool.flwr.app.components]
        serverapp = "evil:app"
        clientapp = "{clientapp}"
        """))
    return app, canary


@pytest.fixture
def fab_dir(monkeypatch):
    """Point Flower's FAB directory lookup at a test directory; restore the loader afterwards."""
    monkeypatch.setattr(runtime, "get_load_client_app_fn", runtime.get_load_client_app_fn)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("evil",):
        monkeypatch.delitem(sys.modules, name, raising=False)

    def point(app):
        monkeypatch.setattr(flower_config, "get_project_dir", lambda *a, **k: app)
        monkeypatch.setattr(flower_loader, "get_project_dir", lambda *a, **k: app)
    return point


def _load():
    return runtime.get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)("someone/evil", "1.0.0",
                                                                                               "0" * 64)


def test_flowers_own_loader_runs_the_code_the_fab_names(tmp_path, fab_dir):
    """The hazard itself (what ``--executor subprocess`` still does): the FAB's module is imported."""
    app, canary = _fab(tmp_path, "evil:app")
    fab_dir(app)
    _load()
    assert canary.read_text() == "ran\n"


def test_a_pinned_child_refuses_another_clientapp_before_importing_anything(tmp_path, fab_dir):
    app, canary = _fab(tmp_path, "evil:app")
    fab_dir(app)
    pin_clientapp()
    with pytest.raises(LoadClientAppError, match=r"names ClientApp 'evil:app'.*runs only.*Refused"):
        _load()
    assert not canary.exists() and "evil" not in sys.modules


def test_clinographs_clientapp_comes_from_the_installed_package_not_the_fab(tmp_path, fab_dir):
    """A FAB that names Clinograph's ClientApp and ships a ``clinograph`` package of its own."""
    app, canary = _fab(tmp_path, CLINOGRAPH_CLIENTAPP)
    fab_dir(app)
    pin_clientapp()
    assert _load() is clinograph_clientapp.app
    assert not canary.exists()


def test_an_operator_named_clientapp_is_loaded_from_the_fab(tmp_path, fab_dir):
    app, canary = _fab(tmp_path, "evil:app")
    fab_dir(app)
    pin_clientapp("evil:app")
    assert _load() is sys.modules["evil"].app and canary.exists()


def test_the_warm_executor_pins_every_child_to_its_clientapp(monkeypatch):
    """``run_task`` (what each forked child runs) pins the loader before Flower's run_clientapp."""
    monkeypatch.setattr(runtime, "get_load_client_app_fn", runtime.get_load_client_app_fn)
    seen = {}

    def fake_run_clientapp(**kw):
        seen["loader"] = runtime.get_load_client_app_fn
    monkeypatch.setattr(runtime, "run_clientapp", fake_run_clientapp)
    spec = type("Spec", (), {"runtime_api_address": "x", "token": "t", "insecure": True, "root_certificates_path": None,
                             "parent_pid": None, "runtime_dependency_install": False})()
    original = runtime.get_load_client_app_fn
    superexec.run_task(spec)  # type: ignore[arg-type]
    assert seen["loader"] is not original and seen["loader"].__qualname__.startswith("pinned_loader")
    assert superexec.WarmExecutor(clientapp="stand_in:client").clientapp == "stand_in:client"
