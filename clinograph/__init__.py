"""Clinograph: federated learning across hospitals over a shared clinical ontology."""

__version__ = "0.1.0"
