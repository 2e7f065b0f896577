"""One federation runtime: one round loop over one transport seam (torch-free).

Where a round's data goes, in the order it flows:

- :mod:`.participant` -- the hospital side as bytes in, bytes out (:class:`RoundParticipant`)
  and :func:`dispatch`, the one place that maps a stage message to a participant call. Both
  transports use it: the in-process one directly, Flower inside each SuperNode.
- :mod:`.transport` -- the seam: :class:`Transport` ``exchange(stage, outgoing)``, with
  :class:`InProcessTransport` (simulations, the demo, tests) here and
  :class:`clinograph.secure.transport.flower.FlowerTransport` for hospitals on other machines.
  :mod:`.workers` -- :class:`.workers.ProcessTransport`, the in-process transport with the
  hospitals in forked worker processes (a simulation's ``[simulation] workers``).
- :mod:`.loop` -- :func:`run_round` and :func:`run_rounds`: plan, reports, the secure mode's
  stages, close, model delivery. The only round loop.
- :mod:`.setup` -- the run's set-up sums (federated scaling, shared features) before the
  candidates, driven by :func:`.run.run_federation` over the same transport and loop.
- :mod:`.config` and :mod:`.build` -- :class:`ServerConfig` (TOML) and :func:`build_server`, the
  one place where weight bounds, thresholds, the DP policy and the mode's parameters are decided.
"""

from .build import build_server, initial_model_from_bytes
from .config import ServerConfig
from .loop import RoundOutcome, run_round, run_rounds
from .participant import RoundParticipant, dispatch
from .transport import InProcessTransport, Transport

__all__ = ["InProcessTransport", "RoundOutcome", "RoundParticipant", "ServerConfig", "Transport", "build_server",
           "dispatch", "initial_model_from_bytes", "run_round", "run_rounds"]
