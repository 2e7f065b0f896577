"""``masked``: SecAgg+-style secure aggregation (Bonawitz et al. 2017; Bell et al. 2020).

The server learns the per-module weighted sums, weight sums and contributor counts of the
clients that survived the round, and nothing else in the clear. Importing this package
registers the mode; build plan options with :func:`masked_plan_options`.
"""

from __future__ import annotations

from ..aggregation import SecureMode, register_mode
from .client import MaskingClient
from .describe import describe
from .params import MaskingParams, accept_plan, masked_plan_options, neighbour_count
from .server import MaskingServer
from .setup import prepare_masked

register_mode(SecureMode("masked", MaskingServer, MaskingClient, server_sees_sum=True, prepare=prepare_masked, distributed_dp=True,
                           describe=describe, accept=accept_plan))

__all__ = ["MaskingClient", "MaskingParams", "MaskingServer", "masked_plan_options", "neighbour_count"]
