"""``ckks``: the server adds CKKS ciphertexts and never sees an update or the sum.

Key ceremony (once, separate from rounds; :mod:`.keys`): a hospital runs
:class:`CkksKeyDealer`, the others :meth:`CkksKeyring.unwrap` the package wrapped to them; the
server loads :class:`CkksServerContext` (parameters only) and puts
:func:`ckks_plan_options` into ``RoundPlan.options``. Rounds: :class:`CkksClient` /
:class:`CkksServer` (build them with ``CkksClient.with_keyring(ring)`` /
``CkksServer.with_context(ctx)``); the hospitals read the sums from
``CkksClient.decrypted_result()``. Parameters: :class:`CkksPreset`.

``ckks_threshold`` (:mod:`.threshold_setup`): the secret key is shared among the hospitals
(collective key generation at set-up); the server adds ciphertexts and opens the sum -- which
every holder first checks is the aggregate -- with all holders' decryption shares.
"""

from ..aggregation import SecureMode, register_mode
from .client import CkksClient
from .describe import describe
from .keys import CkksKeyDealer, CkksKeyring, CkksRecipientKey, CkksServerContext, ckks_plan_options
from .presets import CkksPreset
from .server import CkksServer
from .setup import join_ckks, prepare_ckks
from .threshold_client import ThresholdClient
from .threshold_server import ThresholdServer
from .threshold_setup import describe_threshold, join_threshold, prepare_threshold

register_mode(SecureMode("ckks", CkksServer, CkksClient, server_sees_sum=False, prepare=prepare_ckks, join=join_ckks,
                           describe=describe))
# ``ckks_threshold``: no single party holds the key; the server opens the checked sum with every holder's share
register_mode(SecureMode("ckks_threshold", ThresholdServer, ThresholdClient, server_sees_sum=True,
                         prepare=prepare_threshold, join=join_threshold, describe=describe_threshold))

__all__ = ["CkksClient", "CkksKeyDealer", "CkksKeyring", "CkksPreset", "CkksRecipientKey", "CkksServer",
           "CkksServerContext", "ckks_plan_options"]
