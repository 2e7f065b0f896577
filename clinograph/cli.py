"""The ``clinograph`` command line.

Every command turns a :class:`ClinographError` into a clear message on stderr and a non-zero
exit; nothing ends in a bare traceback (set ``CLINOGRAPH_DEBUG=1`` to see one).

Importing this module (and every ``clinograph.commands`` module) needs only the base install:
torch and ``clinograph.sdk`` are imported inside the commands that use them, so a server
install (``pip install 'clinograph[server]'``) runs ``clinograph audit ...`` and ``keys``.
tests/test_import_contracts.py checks it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from .commands.guard import guarded

app = typer.Typer(name="clinograph", help="Federated learning across hospitals over a shared clinical ontology.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)


HOSPITAL_MODULES = ("torch", "torch_geometric", "opacus", "pgmpy", "sklearn", "pandas", "pyarrow", "tomli_w")


def _missing(modules: tuple[str, ...]) -> list[str]:
    out = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(name)
    return out


def _needs_hospital(command: str) -> None:
    """Exit 2 with the install to run if the hospital extra is missing (e.g. on a server)."""
    missing = _missing(HOSPITAL_MODULES)
    if missing:
        typer.secho(f"error: clinograph {command} needs the hospital install: pip install 'clinograph[hospital]' "
                    f"(missing: {', '.join(missing)}; see README, Install).", err=True, fg="red")
        raise typer.Exit(2)


def _threads() -> None:
    try:
        import torch
    except ModuleNotFoundError:
        return
    torch.set_num_threads(int(os.environ.get("CLINOGRAPH_TORCH_THREADS", "1")))


@app.command()
@guarded
def demo(
    out: Annotated[Path, typer.Option(help="Output folder.")] = Path("runs/demo"),
    rounds: Annotated[int | None, typer.Option(min=1, max=500, help="Planned rounds (early stopping on the "
                                               "federated validation loss may keep an earlier one); default 30 "
                                               "for the NS-FL demo, 10 with --concepts.")] = None,
    seed: Annotated[int, typer.Option(min=0, max=2**63 - 1, help="Seed of the tables, splits and models.")] = 0,
    secure_mode: Annotated[str, typer.Option(help="masked (default), ckks, ckks_threshold (no single party holds the key) or insecure_plaintext")] = "masked",
    dp: Annotated[bool, typer.Option("--dp/--no-dp", help="Also train with patient-level DP-SGD at every "
                                     "hospital and print each hospital's ε.")] = True,
    scale: Annotated[float, typer.Option(min=0.01, max=10.0, help="Multiply hospital sizes (smoke tests).")] = 1.0,
    concepts: Annotated[bool, typer.Option("--concepts", help="The second job instead: a concept model (CGM) "
                                           "over the same hospitals with DAG voting, masked and audited; writes "
                                           "OUT/audit and OUT/concepts_report.html.")] = False,
) -> None:
    """The main job: a 4-hospital federation from ALARM, NS-FL vs the paper's baselines."""
    _needs_hospital("demo")
    from clinograph.sdk.outdir import output_folder

    if out.exists():  # a file as --out is refused before torch and the SDK load (seconds); nothing is created yet
        output_folder(out, what="--out")
    _known_secure_mode(secure_mode)
    if concepts:
        _concepts_demo(out=out, rounds=10 if rounds is None else rounds, seed=seed, secure_mode=secure_mode,
                       scale=scale)
        return
    from .demo_view import run_demo_view

    _threads()
    from clinograph.sdk.demo.run import DEMO_ROUNDS

    run_demo_view(out=out, rounds=DEMO_ROUNDS if rounds is None else rounds, seed=seed, secure_mode=secure_mode,
                  dp=dp, scale=scale)


def _known_secure_mode(name: str) -> None:
    """Refuse an unknown ``--secure-mode`` before torch and the SDK load (they took ~7 s to say so)."""
    from clinograph.core.errors import ConfigError
    from clinograph.secure.aggregation import unknown_mode

    why = unknown_mode(name)
    if why is not None:
        ring = (" (a 16-bit masked ring is a setting of `clinograph simulate`: [federation] masked_word_bits = 16)"
                if name.startswith("masked") else "")
        raise ConfigError(f"--secure-mode: {why}{ring}")


def _concepts_demo(*, out: Path, rounds: int, seed: int, secure_mode: str, scale: float) -> None:
    from clinograph.sdk.demo.concepts import run_concepts_demo

    _threads()
    res = run_concepts_demo(out_dir=out, rounds=rounds, seed=seed, secure_mode=secure_mode, scale=scale)
    typer.echo("voted DAG: " + ", ".join(f"{a} -> {b}" for a, b in res.edges))
    typer.echo("ALARM DAG: " + ", ".join(f"{a} -> {b}" for a, b in res.truth))
    for name, m in res.metrics.items():
        typer.echo(f"  {name:6s} " + "  ".join(f"{k}={v:.3f}" for k, v in sorted(m.items())))
    typer.echo(f"audit {res.audit_dir}: {'verified' if res.audit_ok else 'VERIFICATION FAILED'}; report {res.report}")
    if not res.audit_ok:
        raise typer.Exit(1)


@app.command()
@guarded
def simulate(config: Annotated[Path, typer.Argument(help="Simulation config (TOML).")]) -> None:
    """Run a simulated federation from a TOML config (hospital tables + site schemas)."""
    _needs_hospital("simulate")
    from .demo_view import Interrupted, run_simulation_view

    try:
        run_simulation_view(config, threads=_threads)
    except Interrupted as exc:
        typer.secho(f"error: {exc}", err=True, fg="red")
        raise typer.Exit(130) from None


BENCH_MISSING = ("research/ (the studies and their scripts) ships with the source repository, not the "
                 "wheel; run from a checkout or pass --dir")


def _study_scripts(root: Path) -> dict[str, Path]:
    """``study/script`` -> path for every runnable script of the studies under ``root``."""
    return {f"{p.parent.name}/{p.stem}": p for p in sorted(root.glob("*/*.py"))
            if not p.stem.startswith("_") and "__main__" in p.read_text()}


@app.command()
@guarded
def bench(name: Annotated[str, typer.Argument(help="A study's script: NAME or STUDY/NAME (research/STUDY/NAME.py); "
                                              "`python -m research.run_all` runs every one.")],
          quick: Annotated[bool, typer.Option("--quick", help="The script's small, fast setting.")] = False,
          out: Annotated[Path | None, typer.Option("--out", help="Where the JSON goes (default: the study's "
                                                   "results/NAME.json, results/NAME_quick.json with --quick).")] = None,
          directory: Annotated[Path | None, typer.Option(
              "--dir", help="The research/ folder of a source checkout (default: ./research).")] = None) -> None:
    """Run a study's script from a checkout's research/ (or a speed benchmark from its benchmarks/);
    writes JSON to the study's results/."""
    import runpy

    from clinograph.core.errors import ConfigError

    root = (directory if directory is not None else Path.cwd() / "research").resolve()
    if root.name != "research" or not root.is_dir() or not (root / "_common.py").is_file():
        found = "does not exist" if not root.exists() else "is not a Clinograph research folder (no _common.py)"
        raise ConfigError(f"{root} {found}: {BENCH_MISSING}.")
    scripts = {**_study_scripts(root), **_study_scripts(root.parent / "benchmarks")}  # + the speed benchmarks
    matches = [k for k in scripts if name in (k, k.split("/", 1)[1])]
    if len(matches) != 1:
        raise ConfigError(f"Unknown study script {name!r} in {root}. Available: {', '.join(scripts)}.")
    _threads()
    study, script = matches[0].split("/", 1)
    sys.path.insert(0, str(root.parent))
    sys.argv = [str(scripts[matches[0]])] + (["--quick"] if quick else []) + (["--out", str(out)] if out else [])
    runpy.run_module(f"{scripts[matches[0]].parent.parent.name}.{study}.{script}", run_name="__main__",
                     alter_sys=True)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             add_help_option=False)  # --help: the launcher's own options (its argparse help)
def supernode(ctx: typer.Context) -> None:
    """A hospital's Flower SuperNode with the Clinograph hospital inside it (all options are
    passed through; see examples/flower_deployment/README.md)."""
    from clinograph.secure.transport.flower.supernode import main as supernode_main

    from .commands.supernode import check_enrolment

    args = list(ctx.args)
    if not {"-h", "--help"} & set(args):
        guarded(check_enrolment)(args)  # the launcher checks its Runtime API port
    raise typer.Exit(guarded(supernode_main)(args))


def _mount() -> None:
    from .commands import audit, model

    app.add_typer(audit.app, name="audit")
    app.add_typer(model.app, name="model")
    app.command("predict")(__import__("clinograph.commands.predict", fromlist=["predict"]).predict)
    app.command("check")(__import__("clinograph.commands.check", fromlist=["check"]).check)
    app.command("run")(guarded(__import__("clinograph.commands.run", fromlist=["run"]).run))
    try:
        from .commands import keys
    except ModuleNotFoundError:
        return
    app.add_typer(keys.app, name="keys")


_mount()


def main() -> None:
    """Console entry point."""
    app()


if __name__ == "__main__":
    main()
