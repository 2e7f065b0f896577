"""`clinograph supernode`: insecure options count only by their full name (no argparse prefixes)."""

import pytest

pytest.importorskip("flwr")

from clinograph.secure.transport.flower.supernode import (  # noqa: E402
    check_transport,
    insecure_abbreviations,
    main,
)

from clinograph.core.errors import ConfigError, SecurityPolicyError  # noqa: E402

BASE = ["--participant-factory", "nowhere:make", "--node-config", "hospital='h1'"]


@pytest.mark.parametrize("flag", ["--insecur", "--insec", "--ins", "--insecure-t", "--insecure-transpor",
                                  "--insecur=1"])
def test_an_abbreviated_insecure_flag_is_refused_in_production(flag):
    with pytest.raises(ConfigError, match=r"abbreviates an insecure option .*only by their full name"):
        check_transport([flag], insecure_transport=False, environment="production")
    with pytest.raises(ConfigError, match="abbreviates"):
        check_transport([flag], insecure_transport=True, environment="development")


@pytest.mark.parametrize("flag", ["--insecur", "--insecure-transp"])
def test_main_refuses_an_abbreviation_before_anything_starts(flag, capsys):
    assert main([*BASE, "--superlink", "127.0.0.1:1", flag]) == 2
    assert "abbreviates an insecure option" in capsys.readouterr().err


def test_full_names_and_unrelated_options_are_not_abbreviations():
    assert insecure_abbreviations(["--insecure", "--insecure-transport", "--root-certificates", "ca.pem",
                                   "--superlink", "x:1", "-i", "--", "--insecur"]) == []
    with pytest.raises(SecurityPolicyError, match="refused"):
        check_transport(["--insecure"], insecure_transport=True, environment="production")
    with pytest.raises(ConfigError, match="without TLS"):
        check_transport(["--insecure=true"], insecure_transport=False, environment="development")


@pytest.mark.parametrize(("flags", "fix"), [
    (["--executor", "subprocess"], "Remove --executor subprocess"),
    (["--allow-runtime-dependency-installation"], "Remove --allow-runtime-dependency-installation"),
    (["--insecure", "--insecure-transport"], "Remove --insecure"),
])
def test_an_insecure_flag_refused_in_production_names_the_flag_to_drop_not_a_config_key(flags, fix, capsys):
    assert main([*BASE, "--superlink", "127.0.0.1:1", *flags]) == 2
    err = capsys.readouterr().err
    assert "refused because environment = \"production\"" in err and fix in err
    assert "--environment development" in err and "from the config" not in err


def test_the_launcher_refuses_a_taken_runtime_port_before_the_worker_starts(tmp_path, capsys):
    """`python -m clinograph.secure.transport.flower.supernode` (the deployment guide's hospital command)
    with a --port another program holds: Flower's bind error and a RuntimeError traceback, after the
    hospital's worker had started (only `clinograph supernode` checked the port)."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        code = main(["--participant-factory", "nowhere:make", "--node-config",
                     f"hospital='h1' state-dir='{tmp_path / 'state'}'", "--superlink", "127.0.0.1:1",
                     "--port", str(port)])
    said = " ".join(capsys.readouterr().err.split())
    assert code == 2 and f"127.0.0.1:{port} cannot be used" in said and "--port N" in said, said
    assert not (tmp_path / "state").exists()  # refused before the worker made its state directory


# uvicorn's server thread ends in SystemExit(1) on the bind error: Python's threading.excepthook says nothing
# of a SystemExit (the hospital's terminal shows only uvicorn's line and ours); pytest's own hook reports it
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_runtime_port_taken_after_the_check_ends_in_one_line_not_a_traceback(tmp_path, capsys, monkeypatch):
    """The launcher's check is check-then-bind: a port another program takes in between reached
    flower-supernode, whose RuntimeError ended the hospital command in a traceback. The check is
    skipped here (it stands for the moment between check and bind); Flower's real bind fails."""
    import socket
    import sys
    import warnings

    from clinograph.secure.transport.flower import supernode

    from clinograph.core.identity import Identity

    monkeypatch.setattr(supernode, "check_runtime_port", lambda args: None)
    Identity.generate("h1").save(tmp_path / "h1.pem")

    def show(message, category, filename, lineno, file=None, line=None):  # Python's default, not pytest's record
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    with socket.socket() as held, warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        code = supernode.main(["--participant-factory", "builtins:dict", "--executor", "subprocess",
                               "--node-config", f"hospital='h1' state-dir='{tmp_path / 'state'}' data-dir='{tmp_path}' "
                                                f"key-file='{tmp_path / 'h1.pem'}'",
                               "--superlink", "127.0.0.1:1", "--insecure", "--insecure-transport",
                               "--environment", "development", "--port", str(port)])
    said = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "Runtime API did not start" in said and "--port N" in said, said
    # the insecure options' warnings as every clinograph command shows them: one line, no file:line, no source
    assert "warning: insecure_transport is in use" in said and "InsecureOptionWarning" not in said, said
    assert warnings.formatwarning.__module__ == "warnings"  # put back after
