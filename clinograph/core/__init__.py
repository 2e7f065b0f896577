"""Clinograph's neutral core: what the hospital SDK (:mod:`clinograph.sdk`) and the server
(:mod:`clinograph.secure`) both stand on, and that imports neither.

=====================  ==================================================================
:mod:`.errors`         the one exception tree (``ClinographError`` and its kinds)
:mod:`.tomlio`         strict TOML into pydantic models, every problem named at once
:mod:`.fileio`         bounded reads of regular files, atomic writes
:mod:`.logging`        structlog set-up that refuses patient data and secrets in events
:mod:`.spec`           module specs: what a model's modules are, and their digest
:mod:`.codec`          module tensors to and from bytes
:mod:`.identity`       Ed25519 identities: keys, signatures, key files
:mod:`.labels`         the domain-separation labels every signature carries
=====================  ==================================================================

Torch-free, SDK-free and server-free (the ``neutral-core`` import contract in pyproject.toml).
The errors are importable from the package root too: ``from clinograph import ConfigError``.
"""
