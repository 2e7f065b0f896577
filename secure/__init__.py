"""Clinograph's server library and protocol: the safe recipes.

Raw primitives live in :mod:`clinograph.secure.hazmat`. This package never imports torch,
torch_geometric or opacus: the server is a lean, auditable install.
"""
