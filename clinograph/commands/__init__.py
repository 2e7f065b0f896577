"""Sub-commands of the ``clinograph`` command line, one typer app a module (mounted in cli.py)."""
