"""A public function given None, an int or a dict where a path, a config or a table is expected names
the argument, the type received and the type expected (a ConfigError). Before: a TypeError from
pathlib or iteration, or an AttributeError deep inside -- outside the one exception tree; Identity.load
said a key file given as None 'is encrypted with a password'."""

import re
from pathlib import Path

import pytest

import clinograph as cg
from clinograph.core.arguments import checked_arguments
from clinograph.core.errors import ConfigError

PATH = "expected a file name (str or pathlib.Path)"

CALLS = {
    "FeatureDictionary.from_toml": (lambda v: cg.FeatureDictionary.from_toml(v), "path", PATH),
    "SiteSchema.from_toml": (lambda v: cg.SiteSchema.from_toml(v), "path", PATH),
    "HospitalConfig.from_toml": (lambda v: cg.HospitalConfig.from_toml(v), "path", PATH),
    "SimulationConfig.from_toml": (lambda v: cg.SimulationConfig.from_toml(v), "path", PATH),
    "ServerConfig.from_toml": (lambda v: cg.ServerConfig.from_toml(v), "path", PATH),
    "Identity.load": (lambda v: cg.Identity.load("h1", v), "path", PATH),
    "verify_audit_dir": (lambda v: cg.verify_audit_dir(v), "directory", PATH),
    "render_report": (lambda v: cg.render_report(Path("audit"), out=v), "out", PATH),
    "simulate_from_config": (lambda v: cg.simulate_from_config(v), "config", "expected SimulationConfig"),
    "simulate": (lambda v: cg.simulate(v, None, None, audit_dir=Path("a")), "tables",
                 "expected a sequence (list or tuple)"),
    "build_simulation": (lambda v: cg.build_simulation([], v, None, audit_dir=Path("a")), "dictionary",
                         "expected FeatureDictionary"),
    "run_rounds": (lambda v: cg.run_rounds(v, None, rounds=1), "server", "expected FederationServer"),
}


@pytest.mark.parametrize("value", [None, 5, {"site": "a"}], ids=["None", "int", "dict"])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_wrong_argument_type_is_named(call, value):
    fn, name, expected = CALLS[call]
    got = "None" if value is None else "an int" if value == 5 else "a dict"
    with pytest.raises(ConfigError, match=re.escape(f"{call}: {name} is {got}; {expected}.")):
        fn(value)


def test_what_the_annotation_allows_passes():
    @checked_arguments
    def f(path: str | Path, *, schema: cg.SiteSchema | None = None, rounds: int = 1) -> str:
        return f"{path}:{schema}:{rounds}"

    assert f("a.toml") == "a.toml:None:1" and f(Path("a.toml"), rounds=2.5) == "a.toml:None:2.5"  # numbers: unchecked
    with pytest.raises(ConfigError, match=re.escape("f: path is a bytes; expected a file name (str or pathlib.Path)")):
        f(b"a.toml")
    with pytest.raises(ConfigError, match=re.escape("f: schema is a str; expected SiteSchema or None.")):
        f("a.toml", schema="site.toml")
    with pytest.raises(TypeError, match="missing a required argument|required positional"):
        f()  # Python's own message for a missing argument
    assert cg.hospital_split([0, 1] * 5, site="a", test_fraction=0.2, validation_fraction=0.0, seed=0).test.size == 2
    # ^ labels: np.ndarray in the annotation, a list coerced by the function: arrays are not checked
