"""Loading a site schema or dictionary from TOML ends in a model or a ConfigError, whatever the file."""

from __future__ import annotations

import os
import threading

import pytest
from clinograph.sdk.ontology import FeatureDictionary, SiteSchema

from clinograph.core import tomlio  # the one loader; clinograph.sdk.tomlio re-exports it
from clinograph.core.errors import ConfigError


def test_invalid_utf8_is_a_config_error_naming_the_encoding_fix(tmp_path):
    p = tmp_path / "s.toml"
    p.write_bytes('site = "h1"\n# Sören\nlabel = "y"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"s\.toml: it is not valid UTF-8 \(first bad byte at line 2.*iconv"):
        SiteSchema.from_toml(p)


def test_a_utf8_bom_is_accepted(tmp_path):
    p = tmp_path / "s.toml"
    p.write_bytes(b"\xef\xbb\xbf" + b'site = "h1"\n')
    assert SiteSchema.from_toml(p).site == "h1"


@pytest.mark.parametrize("opener, closer", [("[", "]"), ("{a=", "}")])
def test_ten_thousand_deep_nesting_is_a_config_error(tmp_path, opener, closer):
    p = tmp_path / "deep.toml"
    p.write_text("x = " + opener * 10_000 + "1" + closer * 10_000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        SiteSchema.from_toml(p)


def test_a_directory_is_refused_before_opening(tmp_path):
    with pytest.raises(ConfigError, match="it is a directory, not a regular file"):
        FeatureDictionary.from_toml(tmp_path)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    p = tmp_path / "pipe.toml"
    os.mkfifo(p)
    out = {}

    def load():
        try:
            SiteSchema.from_toml(p)
        except ConfigError as exc:
            out["err"] = str(exc)

    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "reading a FIFO blocked"
    assert "FIFO (named pipe), not a regular file" in out["err"]


def test_missing_file_bad_syntax_and_oversize(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="does not exist"):
        SiteSchema.from_toml(tmp_path / "nope.toml")
    p = tmp_path / "bad.toml"
    p.write_text('site = "h1"\nlabel = \n')
    with pytest.raises(ConfigError, match=r"invalid TOML: .*line 2"):
        SiteSchema.from_toml(p)
    monkeypatch.setattr(tomlio, "MAX_TOML_BYTES", 4)
    with pytest.raises(ConfigError, match="over the limit of 4 bytes"):
        SiteSchema.from_toml(p)


@pytest.mark.parametrize(("extra", "expected"), [
    ({"patient_id": "y"}, ["'y' is named by patient_id and label"]),
    ({"ignore": ["pid", "hr"], "columns": {"hr": {"feature": "heart_rate"}, "y": {"feature": "sex"}}},
     ["'pid' is the patient_id column and also listed under ignore",
      "'y' is the label column and also mapped under [columns]", "'hr' is mapped under [columns] and also listed"]),
    ({"format": "long", "long": {"patient": "pid", "time": "pid", "feature": "code", "value": "v"}},
     ["'pid' is named by long.patient and long.time"]),
])
def test_site_schema_refuses_a_column_with_two_roles_all_at_once(extra, expected):
    # before: the first role silently won (an ignored patient id column was still the id, ...)
    from clinograph.core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        SiteSchema(**{"site": "h1", "patient_id": "pid", "label": "y", **extra})
    for text in expected:
        assert text in str(err.value)
