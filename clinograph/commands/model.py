"""``clinograph model init``: write the initial model a federation starts from (hospital install).

The server holds no training code (a lean install); it starts from this file, named in its
``server.toml`` as ``initial_model``. Every hospital with the same ``[model]``/``[personal]``
settings and dictionary builds a bitwise identical initial model, so the first plan's state
digest matches what each hospital holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="The federation's model files.", no_args_is_help=True)


@app.command("init")
def init(config: Annotated[Path, typer.Option("--config", help="A hospital config (hospital.toml) of the federation.")],
         out: Annotated[Path, typer.Option("--out", help="Where to write initial_model.json.")]) -> None:
    """Write the initial model for hospitals configured like ``--config``."""
    from ..cli import guarded

    guarded(_init)(config, out)


def _init(config: Path, out: Path) -> None:
    from clinograph.sdk.config import HospitalConfig
    from clinograph.sdk.federation.build import initial_model_for
    from clinograph.sdk.federation.node import load_dictionary
    from clinograph.secure.errors import ConfigError

    cfg = HospitalConfig.from_toml(config)
    model = initial_model_for(cfg, dictionary=load_dictionary(cfg, config))
    if out.exists() and out.is_dir():
        raise ConfigError(f"--out {out} is a folder; give a file path such as {out / 'initial_model.json'}.")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(model.to_bytes())
    typer.echo(f"initial model ({model.task}, {len(model.spec.modules)} modules, spec {model.spec.digest()[:12]}…) "
               f"written to {out}")
