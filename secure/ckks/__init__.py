"""``ckks``: the server adds CKKS ciphertexts and never sees an update or the sum.

Key ceremony (once, separate from rounds; :mod:`.keys`): a hospital runs
:class:`CkksKeyDealer`, the others :meth:`CkksKeyring.unwrap` the package wrapped to them; the
server loads :class:`CkksServerContext` (parameters only) and puts
:func:`ckks_plan_options` into ``RoundPlan.options``. Rounds: :class:`CkksClient` /
:class:`CkksServer` (build them with ``CkksClient.with_keyring(ring)`` /
``CkksServer.with_context(ctx)``); the hospitals read the sums from
``CkksClient.decrypted_result()``. Parameters: :class:`CkksPreset`.
"""

from ..aggregation import SecureMode, register_mode
from .client import CkksClient
from .describe import describe
from .keys import CkksKeyDealer, CkksKeyring, CkksRecipientKey, CkksServerContext, ckks_plan_options
from .presets import CkksPreset
from .server import CkksServer
from .setup import join_ckks, prepare_ckks

register_mode(SecureMode("ckks", CkksServer, CkksClient, server_sees_sum=False, prepare=prepare_ckks, join=join_ckks,
                           describe=describe))

__all__ = ["CkksClient", "CkksKeyDealer", "CkksKeyring", "CkksPreset", "CkksRecipientKey", "CkksServer",
           "CkksServerContext", "ckks_plan_options"]
