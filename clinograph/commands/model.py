"""``clinograph model init``: write what a federation run trains (hospital install).

The server holds no training code (a lean install); it starts from this file, named in its
``server.toml`` as ``initial_model``: each candidate model of the hospital config (``[selection]
candidates`` × ``restarts``; none: the config's own model) with its initial weights, and the
selection rule, and the set-up sums the config asks for (``[scaling] source = "federated"``,
``[model] features = "shared"``), which the server runs before the candidates. Every hospital
with the same settings and dictionary builds bitwise identical initial models, so the first
plan's state digest matches what each hospital holds, and trains only the candidates its own
config lists. The initial models do not depend on what the set-up sums derive (scales, the
shared feature list): they are written on the base dictionary, and the run carries the derived
dictionary's digest, which every hospital checks against the one it derived itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="The federation's model files.", no_args_is_help=True)


@app.command("init")
def init(config: Annotated[Path, typer.Option("--config", help="A hospital config (hospital.toml) of the federation.")],
         out: Annotated[Path, typer.Option("--out", help="Where to write initial_model.json.")],
         force: Annotated[bool, typer.Option("--force", help="Replace --out if it exists.")] = False) -> None:
    """Write the initial model for hospitals configured like ``--config``."""
    from .guard import guarded

    guarded(_init)(config, out, force=force)


def _init(config: Path, out: Path, *, force: bool = False) -> None:
    from clinograph.core.errors import ConfigError
    from clinograph.sdk.config import HospitalConfig

    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; give a file path such as {out / 'initial_model.json'}.")
    if out.exists() and not force:  # the file a server.toml names: replacing it changes what a rerun trains
        raise ConfigError(f"--out {out} already exists (an initial model a server may run from); not replaced. "
                          "Pass --force to replace it, or give another --out path.")
    cfg = HospitalConfig.from_toml(config)  # a bad config is refused before torch and the SDK load (~10 s)
    from clinograph.sdk.federation.build import run_models
    from clinograph.sdk.federation.candidates import candidate_configs
    from clinograph.sdk.federation.node import load_dictionary
    from clinograph.sdk.federation.setup import refuse_under_dp

    refuse_under_dp(cfg, candidate_configs(cfg), where=str(config))  # set-up sums are outside the DP accountant
    dictionary = load_dictionary(cfg, config)
    models = run_models(cfg, dictionary=dictionary)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(models.to_bytes())
    except OSError as exc:
        raise ConfigError(f"Cannot write --out {out}: {exc.strerror or type(exc).__name__}. Give a path in a folder "
                          "you can write to.") from None
    names = ", ".join(c.name for c in models.candidates)
    rule = (f"selection patience {models.selection.patience}, min_delta {models.selection.min_delta:g}"
            if models.selection else "no selection")
    first = models.candidates[0].initial
    setup = f"set-up sums {', '.join(s.name for s in models.setup)}; " if models.setup else ""
    if models.vote is not None:  # concepts: the trained model is derived by the hospitals after the vote
        setup += (f"a voted run: {models.vote.rounds} DAG vote round(s) over {len(models.vote.concepts)} concepts, "
                  "then the hospitals derive the model from the voted DAG; ")
    for line in models.default_lines():
        typer.echo(line)  # a setting the SDK resolved (the DP default model); the server audits it
    typer.echo(f"initial model(s) ({models.task}; candidates {names}; {rule}; {setup}{len(first.spec.modules)} "
               f"modules, spec {first.spec.digest()[:12]}…) written to {out}")
    from clinograph.sdk.tasks import task_strategy

    needed = task_strategy(cfg, dictionary=dictionary, directory=out.parent)
    if needed is not None:  # the task's server strategy and the public files it pins
        import json

        name, options = needed  # strings and integers: a JSON string is a TOML basic string
        pairs = ", ".join(f"{k} = {json.dumps(v)}" for k, v in options.items())
        typer.echo(f"task {cfg.task!r} needs this in server.toml (files written beside {out.name}):\n"
                   f"[federation]\nstrategy = {json.dumps(name)}\nstrategy_options = {{ {pairs} }}")
