"""Every command's --help shows its texts as written: rich markup ate bracketed words ("an EHR
source file ([omop]/[meds]/[fhir])" rendered as "(//)")."""

import re

import click
from typer.main import get_command
from typer.testing import CliRunner

from clinograph.cli import app


def _commands(cmd: click.Command, path: list[str]):
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            yield from _commands(sub, [*path, name])


def test_every_bracketed_word_of_a_help_text_is_shown():
    runner, seen = CliRunner(), 0
    for path, cmd in _commands(get_command(app), []):
        texts = [cmd.help or ""] + [getattr(p, "help", None) or "" for p in cmd.params]
        words = {w.replace("\\[", "[") for t in texts for w in re.findall(r"\\?\[[a-z_.<>]+\]", t)}
        if not words:
            continue
        out = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "300"}).output
        shown = " ".join(out.replace("│", " ").split())  # rich's panel borders between wrapped lines
        for w in words:
            seen += 1
            assert w in shown, f"clinograph {' '.join(path)} --help lost {w!r}"
    assert seen >= 5  # predict's [omop]/[meds]/[fhir]/[server], check's


def test_positional_arguments_show_their_help():
    """Click 8.5 with typer < 0.21 (flwr pins it) dropped every argument's help (pyproject pins click < 8.5)."""
    out = CliRunner().invoke(app, ["check", "--help"], env={"COLUMNS": "300"}).output
    assert "site_schema.toml, or an EHR source file ([omop]/[meds]/[fhir])." in out
    assert "CSV/Parquet table, or the EHR source's location" in out
