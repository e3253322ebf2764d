"""The QoS property names a channel and a bridge of the same node agree on.

``EnableTransaction`` (NJI 2.7.6) switches a proxy's routing transactions; the channel checks and stores it
(``router.channel.qos``), the bridge's ``BridgeTransactionMgmt`` sets and reads it on its proxy.
"""

from __future__ import annotations

__all__ = ["ENABLE_TRANSACTION"]

ENABLE_TRANSACTION = "EnableTransaction"
