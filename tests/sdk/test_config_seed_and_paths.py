"""sdk/config.py: the one-seed rule and paths relative to the simulation config's folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from clinograph.sdk.config import SimulationConfig


def _write(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "configs"
    folder.mkdir(exist_ok=True)
    p = folder / "sim.toml"
    p.write_text(text)
    return p


def test_federation_seed_moves_every_seed_not_set_explicitly(tmp_path):
    c = SimulationConfig.from_toml(_write(tmp_path, "[federation]\nseed = 7\n[split]\ntest_fraction = 0.25\n"))
    assert (c.split.seed, c.model.init_seed, c.training.seed) == (7, 7, 7)
    assert c.split.test_fraction == 0.25
    h = c.hospital_config()  # what every simulated hospital trains with
    assert (h.split.seed, h.model.init_seed, h.training.seed) == (7, 7, 7)


@pytest.mark.parametrize(("section", "key"), [("split", "seed"), ("model", "init_seed"), ("training", "seed")])
def test_an_explicit_seed_pins_its_part_even_when_it_is_the_default(tmp_path, section, key):
    c = SimulationConfig.from_toml(_write(tmp_path, f"[federation]\nseed = 7\n[{section}]\n{key} = 0\n"))
    values = {"split": c.split.seed, "model": c.model.init_seed, "training": c.training.seed}
    assert values[section] == 0
    assert all(v == 7 for s, v in values.items() if s != section)


def test_without_a_federation_seed_the_defaults_stay():
    c = SimulationConfig.model_validate({})
    assert (c.federation.seed, c.split.seed, c.model.init_seed, c.training.seed) == (0, 0, 0, 0)


def test_sections_passed_as_models_follow_the_same_rule():
    from clinograph.sdk.config import SplitSection
    from clinograph.secure.runtime.config import FederationSection

    c = SimulationConfig(federation=FederationSection(seed=5), split=SplitSection(test_fraction=0.4))
    assert (c.split.seed, c.model.init_seed) == (5, 5)
    c = SimulationConfig(federation=FederationSection(seed=5), split=SplitSection(seed=2))
    assert (c.split.seed, c.training.seed) == (2, 5)


def test_output_is_relative_to_the_config_file_like_the_other_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the working directory is not the config's folder
    c = SimulationConfig.from_toml(_write(tmp_path, 'dictionary = "d.toml"\noutput = "runs/x"\n'))
    assert c.output == tmp_path / "configs" / "runs" / "x"
    assert c.dictionary == tmp_path / "configs" / "d.toml"
    absolute = tmp_path / "elsewhere"
    c = SimulationConfig.from_toml(_write(tmp_path, f'output = "{absolute.as_posix()}"\n'))
    assert c.output == absolute


def test_the_default_output_is_unchanged_in_code():
    assert SimulationConfig.model_validate({}).output == Path("runs/simulation")


@pytest.mark.parametrize("value", ["1.5", '"data/north.csv"', "{ site = \"north\" }", "true"])
def test_hospitals_that_is_no_array_of_tables_is_refused_by_key(tmp_path, value):
    """Found by fuzzing the loaders: ``hospitals = 1.5`` reached the relative-path step, which iterated
    it (TypeError: 'float' object is not iterable, an internal error at the CLI)."""
    from clinograph.core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        SimulationConfig.from_toml(_write(tmp_path, f"hospitals = {value}\n"))
    assert "hospitals" in str(err.value)


@pytest.mark.parametrize(("text", "key"), [
    ('dictionary = "d\\u0000.toml"\n', "dictionary"),
    ('output = "runs/a\\u0000b"\n', "output"),
    ('[[hospitals]]\nsite = "n"\ntable = "n\\u0000.csv"\nschema = "n.toml"\n', "hospitals.0.table"),
    ('[privacy]\nstate_dir = "s\\u0000"\n', "privacy.state_dir"),
])
def test_a_path_with_a_nul_character_is_refused_by_key(tmp_path, text, key):
    """A NUL in a path string reached open()/mkdir(): ValueError 'embedded null byte', an internal
    error at the CLI (`clinograph simulate`, found by fuzzing the config's paths)."""
    from clinograph.core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        SimulationConfig.from_toml(_write(tmp_path, text))
    assert f"{key}: a path cannot contain a NUL character" in str(err.value)
