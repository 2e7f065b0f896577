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
