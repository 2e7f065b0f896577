"""secure/enrolment.py: a federation.toml that is not what `clinograph keys init` wrote is a
ConfigError naming the file -- never a traceback or a hang -- and names from it are quoted."""

from __future__ import annotations

import os

import pytest
from clinograph.secure.enrolment import load_federation

from clinograph.core.errors import ConfigError


@pytest.mark.parametrize(("kind", "expected"), [
    ("latin1", "not valid UTF-8"), ("deep", "nested too deeply"), ("fifo", "a FIFO"),
])
def test_an_unreadable_federation_file_is_a_config_error(tmp_path, kind, expected):
    """Before: UnicodeDecodeError and RecursionError tracebacks, and a FIFO read without end."""
    path = tmp_path / "federation.toml"
    if kind == "latin1":
        path.write_bytes(b'federation_id = "caf\xe9"\n')
    elif kind == "deep":
        path.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    else:
        os.mkfifo(path)
    with pytest.raises(ConfigError) as err:
        load_federation(path)
    assert str(path) in str(err.value) and expected in str(err.value)


def test_a_hospital_name_with_escapes_is_quoted_in_the_error(tmp_path):
    """A table key is the file's own text: it went into the message raw (ANSI escapes, a newline)."""
    path = tmp_path / "federation.toml"
    path.write_text('federation_id = "f"\nsuperlink_address = "x:1"\n[server]\nname = "s"\npublic_key = "AAAA"\n'
                    '[hospitals."\\u001b[31mh1\\n"]\npublic_key = "AAAA"\nnode_auth_public_key = "x"\n')
    with pytest.raises(ConfigError) as err:
        load_federation(path)
    assert "hospitals.\\x1b[31mh1\\n.node_auth_public_key" in str(err.value)
    assert "\x1b" not in str(err.value) and "h1\n" not in str(err.value)
