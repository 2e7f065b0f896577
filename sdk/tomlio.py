"""Loading strict pydantic models from TOML: the one implementation lives in
:mod:`clinograph.core.tomlio` (torch-free, shared by the server and the SDK)."""

from clinograph.core.tomlio import load_toml_model, read_toml_text, validation_message

__all__ = ['read_toml_text', 'validation_message', 'load_toml_model']
