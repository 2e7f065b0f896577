"""The command line: clear errors, never a traceback; demo and simulate run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "clinograph.cli"]


def cli(*args, timeout=600):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})


def test_bad_config_is_a_clear_error_not_a_traceback(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[federation]\nrounds = 2\nsecure_mod = 'masked'\n")
    out = cli("simulate", str(cfg))
    assert out.returncode == 2
    assert "federation.secure_mod: unknown key" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_bad_table_lists_every_problem(tmp_path):
    data = ROOT / "examples" / "data"
    bad = tmp_path / "north.csv"
    text = (data / "north.csv").read_text().splitlines()
    header = text[0] + ",Na+"
    bad.write_text("\n".join([header] + [line + ",140" for line in text[1:]]))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"""
dictionary = "{data / 'dictionary.toml'}"
[federation]
rounds = 1
[[hospitals]]
site = "north"
table = "{bad}"
schema = "{data / 'north_schema.toml'}"
[[hospitals]]
site = "south"
table = "{data / 'south.csv'}"
schema = "{data / 'east_schema.toml'}"
[[hospitals]]
site = "east"
table = "{tmp_path / 'gone.csv'}"
schema = "{data / 'east_schema.toml'}"
""")
    out = cli("simulate", str(cfg))
    assert out.returncode == 2, out.stderr
    assert "north: Column 'Na+' is not in the feature dictionary" in out.stderr
    assert "east: Table " in out.stderr and "gone.csv does not exist" in out.stderr  # reported with the others
    assert "its schema" in out.stderr and "says site 'east'" in out.stderr
    assert "Traceback" not in out.stderr


def test_unknown_secure_mode_lists_the_registered_ones(tmp_path):
    out = cli("demo", "--rounds", "1", "--secure-mode", "masekd", "--out", str(tmp_path / "d"))
    assert out.returncode == 2
    assert "Unknown secure mode 'masekd'. Registered: ckks, ckks_threshold, insecure_plaintext, masked." in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "d" / "hospitals").exists()  # refused before any work
    probe = ("import sys; from typer.testing import CliRunner; from clinograph.cli import app; "
             f"r = CliRunner().invoke(app, ['demo', '--secure-mode', 'masekd', '--out', {str(tmp_path / 'e')!r}]); "
             "print(r.exit_code, 'torch' in sys.modules)")
    # refused before torch and the SDK load (it took ~7 s to say so)
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.split() == ["2", "False"]


def test_masked16_is_not_a_demo_mode_and_the_refusal_names_the_setting(tmp_path):
    out = cli("demo", "--secure-mode", "masked16", "--out", str(tmp_path / "d"))  # the README listed it
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "Unknown secure mode 'masked16'" in out.stderr and "masked_word_bits = 16" in out.stderr
    assert "masked16" not in cli("demo", "--help").stdout


@pytest.fixture(scope="module")
def demo_dp(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """One full `clinograph demo` (DP on, the default), shared by the tests below: run once."""
    out_dir = tmp_path_factory.mktemp("demo") / "a"
    return cli("demo", "--rounds", "2", "--scale", "0.15", "--out", str(out_dir)), out_dir


@pytest.mark.slow  # one full demo: four hospitals, NS-FL with and without DP, the baselines, the report
def test_demo_runs_end_to_end(demo_dp):
    a, out_dir = demo_dp
    assert a.returncode == 0, a.stderr[-3000:]
    m = json.loads((out_dir / "metrics.json").read_text())
    assert set(m["methods"]) == {"clinograph_nsfl", "standalone", "fedavg_aligned", "clinograph_nsfl_dp",
                                 "lr_standalone", "lr_fedavg_aligned", "lr_pooled", "gbm_pooled"}  # + the simple baselines
    assert set(m["hospitals"]) == {"north", "south", "east", "west"}
    assert m["secure_mode"] == "masked"
    # DP is on by default: every hospital reports its ε, within the budget
    assert set(m["epsilon"]) == set(m["hospitals"])
    assert all(0 < eps[-1] <= m["dp_settings"]["epsilon_budget"] for eps in m["epsilon"].values())
    # the demo's DP model is said (the GNN: the SDK's DP default scored lower on the demo, sdk/demo/run.py)
    assert m["dp_model"] == "the GNN (hidden 8) and the wide path"
    # the DP run is distributed DP and prints both guarantees per hospital
    g = m["dp_guarantees"]
    assert set(g) == set(m["hospitals"]) and all(0 < x["epsilon"] < x["epsilon_alone"] for x in g.values())
    assert "north: ε = " in a.stdout and "if the others' noise were absent" in a.stdout
    assert "audit: verified" in a.stdout
    assert (out_dir / "report.html").stat().st_size > 10_000
    assert (out_dir / "feature_relevance_radar.png").exists()


@pytest.mark.slow  # a second demo process (without DP) against the shared one above
def test_demo_is_seeded(demo_dp, tmp_path):
    # the non-DP federation and the baselines are seeded (DP noise is OS-random by design): a second
    # process with the same seed, without DP, gives the first one's non-DP results exactly
    a, out_dir = demo_dp
    assert a.returncode == 0, a.stderr[-3000:]
    m = json.loads((out_dir / "metrics.json").read_text())
    b = cli("demo", "--rounds", "2", "--scale", "0.15", "--no-dp", "--out", str(tmp_path / "b"))
    assert b.returncode == 0, b.stderr[-3000:]
    mb = json.loads((tmp_path / "b" / "metrics.json").read_text())
    assert "clinograph_nsfl_dp" not in mb["methods"]
    for key in ("clinograph_nsfl", "standalone", "fedavg_aligned"):
        assert mb["methods"][key] == m["methods"][key]


def _north_only(tmp_path, head: str = "") -> Path:
    """A one-round simulation config of the demo's north hospital, ``head`` written first."""
    data = ROOT / "examples" / "data"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"""{head}
[federation]
rounds = 1
[[hospitals]]
site = "north"
table = "{data / 'north.csv'}"
schema = "{data / 'north_schema.toml'}"
""")
    return cfg


def test_a_config_without_a_dictionary_is_refused_not_defaulted(tmp_path):
    out = cli("simulate", str(_north_only(tmp_path)))
    assert out.returncode == 2 and "names no feature dictionary" in out.stderr and "Traceback" not in out.stderr


def test_a_bad_dictionary_is_refused_before_the_progress_bar(tmp_path):
    """hreal3: the progress bar was drawn, then the dictionary's error printed under it."""
    bad = tmp_path / "dictionary.toml"
    bad.write_text((ROOT / "examples" / "data" / "dictionary.toml").read_text() + "\n[[features]]\nid = 'broken'\n")
    out = cli("simulate", str(_north_only(tmp_path, f'dictionary = "{bad}"')))
    assert out.returncode == 2 and "is invalid" in out.stderr and "features.23" in out.stderr and "Traceback" not in out.stderr
    assert "rounds" not in out.stdout and "━" not in out.stdout + out.stderr  # no progress bar was drawn


def test_an_output_path_that_is_a_file_and_a_20_digit_seed_are_clear_errors(tmp_path):
    afile = tmp_path / "not-a-folder"
    afile.write_text("x")
    out = cli("demo", "--out", str(afile), "--no-dp", "--rounds", "1", "--scale", "0.05")
    assert out.returncode == 2 and "exists and is not a folder" in out.stderr and "Traceback" not in out.stderr
    out = cli("demo", "--seed", "12345678901234567890", "--no-dp")
    assert out.returncode == 2 and "--seed" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow  # `clinograph simulate`: four candidates x two rounds in a subprocess
def test_simulate_shows_the_candidate_models_and_the_choice(tmp_path):
    data = ROOT / "examples" / "data"
    cfg = tmp_path / "c.toml"
    text = (ROOT / "examples" / "simulation.toml").read_text()
    text = text.replace('output = "runs/example-simulation"', f'output = "{tmp_path / "run"}"')
    text = text.replace('"data/', f'"{data}/').replace("rounds = 10 ", "rounds = 2 ")
    cfg.write_text(text)
    out = cli("simulate", str(cfg))
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("candidate ")]
    assert [ln.split(":")[0] for ln in lines] == [f"candidate {n}" for n in ("wide", "wide_shape", "linear", "shape")], \
        out.stdout
    assert all("federated validation loss" in ln for ln in lines)
    chosen = [ln for ln in out.stdout.splitlines() if ln.startswith("chosen model: ")]
    assert len(chosen) == 1 and chosen[0].split()[2] in ("wide", "wide_shape", "linear", "shape")
    closed = [ln for ln in out.stdout.splitlines() if ": round " in ln and " closed: " in ln]
    assert closed[0].startswith("wide: round 0 closed: "), out.stdout  # each line names its candidate
    # (2 rounds + the scoring round) x 4 candidates, one closed
    assert "ETA at most" in closed[0] and "for 11 round(s) left" in closed[0], out.stdout
    # the last training round is followed by its scoring round, which is the last
    assert closed[-1].endswith("for 1 round(s) left)")
    every = [ln for ln in out.stdout.splitlines() if ": round " in ln and " closed" in ln]
    assert "scoring round" in every[-1] and every[-1].endswith("last round)")


def test_a_quoted_number_in_a_config_is_a_clear_error(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[federation]\nrounds = \"5\"\n")
    out = cli("simulate", str(cfg))
    assert out.returncode == 2 and "Traceback" not in out.stderr + out.stdout
    assert "federation.rounds" in out.stderr and "write the value without quotes" in out.stderr, out.stderr


def test_supernode_help_lists_the_launchers_own_options():
    from typer.testing import CliRunner

    from clinograph.cli import app

    r = CliRunner().invoke(app, ["supernode", "--help"])
    assert r.exit_code == 0, r.output
    for option in ("--node-config", "--executor", "--supernode-poll", "--participant-factory", "--environment"):
        assert option in r.output
    assert "flower-supernode --help" in " ".join(r.output.split())  # where Flower's options are described
    said = " ".join(r.output.split())  # the data-dir an EHR hospital's SuperNode reads (session 53: only table.csv)
    assert "source, source.duckdb or the URL in source.url" in said and "data-dir='/srv/h1/data'" in said
