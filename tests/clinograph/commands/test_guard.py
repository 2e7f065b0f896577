"""clinograph/commands/guard.py: how a command's failure reaches the operator."""

from __future__ import annotations

import pytest
import typer

from clinograph.commands.guard import guarded


def test_a_closed_output_pipe_ends_the_command_quietly_not_as_an_internal_error(capsys):
    @guarded
    def prints_into_a_closed_pipe() -> None:  # `clinograph check ... | head -3`: head has exited
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(typer.Exit) as ended:
        prints_into_a_closed_pipe()
    assert ended.value.exit_code == 1
    assert "internal error" not in capsys.readouterr().err


def test_an_unexpected_error_is_still_an_internal_error_without_a_traceback(capsys, monkeypatch):
    monkeypatch.delenv("CLINOGRAPH_DEBUG", raising=False)

    @guarded
    def fails() -> None:
        raise RuntimeError("a cell value could be here")

    with pytest.raises(typer.Exit) as ended:
        fails()
    err = capsys.readouterr().err
    assert ended.value.exit_code == 3 and "internal error (RuntimeError)" in err and "cell value" not in err


def test_ctrl_c_outside_a_run_says_the_operator_interrupted_with_exit_130(capsys):
    """It said only "interrupted" (e.g. Ctrl-C while `clinograph simulate` read the tables)."""
    @guarded
    def reads_tables() -> None:
        raise KeyboardInterrupt

    with pytest.raises(typer.Exit) as ended:
        reads_tables()
    assert ended.value.exit_code == 130
    assert capsys.readouterr().err.startswith("interrupted by the operator (Ctrl-C) before the command finished")


def test_clinographs_warnings_are_one_clean_line_and_other_libraries_keep_pythons_format(capsys):
    """`clinograph predict --insecure-untrusted-model` printed
    '/.../sdk/model/load.py:103: InsecureOptionWarning: ...' and then the source line of the call."""
    import sys
    import warnings

    from clinograph.secure.policy import InsecureOptionWarning, require_allowed

    from clinograph.commands.guard import guarded

    @guarded
    def command() -> None:
        require_allowed("insecure_untrusted_model", environment="development", audited=False,
                        why="model m.safetensors is loaded without checking\n  the signature")
        warnings.warn("a library's own", FutureWarning, stacklevel=1)

    def show(message, category, filename, lineno, file=None, line=None):  # Python's default, not pytest's record
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        command()
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0] == ("warning: insecure_untrusted_model is in use: model m.safetensors is loaded without "
                        "checking the signature.")  # one line; no audit log to name for a loaded model
    assert "test_guard.py" in lines[1] and "FutureWarning: a library's own" in lines[1]
    assert warnings.formatwarning.__module__ == "warnings"  # put back after the command
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        require_allowed("insecure_plaintext", environment="development", why="x")
    assert seen[0].category is InsecureOptionWarning
    assert str(seen[0].message).endswith("The audit log marks this run insecure.")
