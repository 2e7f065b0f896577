"""Transports that carry a secure-aggregation round: in-process (tests, simulations, demo)."""

from .inprocess import run_aggregation

__all__ = ["run_aggregation"]
