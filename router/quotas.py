"""Per-node quotas (``[limits]``, docs/security.md "Quotas"): how many channels, admins, proxies and bridges one node
holds, so an authorised but runaway client cannot exhaust it.

Refusals use the spec's limit exceptions where the IDL has one, ``CORBA::IMP_LIMIT`` (``COMPLETED_NO``) otherwise:

=====================  ==========================================================  =====================================
limit                  refused operation                                            exception
=====================  ==========================================================  =====================================
``max_channels``       ``EventChannelFactory::create_channel``                      ``IMP_LIMIT`` (the IDL raises only
                                                                                    UnsupportedQoS/UnsupportedAdmin)
``max_admins``         ``EventChannel::new_for_consumers/new_for_suppliers``        ``IMP_LIMIT`` (no raises clause)
``max_proxies``        ``obtain_notification_*`` / ``obtain_*`` of an admin         ``CosNotifyChannelAdmin::
                                                                                    AdminLimitExceeded`` (name
                                                                                    ``nsjms.MaxProxies``)
``max_bridges``        ``CosBridgeAdmin::BridgeFactory::create_bridge``             ``IMP_LIMIT`` (NJI's IDL raises only
                                                                                    InvalidExternalEndPoints)
=====================  ==========================================================  =====================================

Counts are of the live objects; the decisions (:func:`over`) are free of I/O.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

__all__ = ["PROXY_LIMIT_NAME", "NodeLimits", "check_admins", "check_bridges", "check_channels", "check_proxies",
           "over"]

log = logging.getLogger("nsjms.quotas")

#: The AdminLimit name of a refused proxy (not a standard property: the node's, not the channel's MaxConsumers).
PROXY_LIMIT_NAME = "nsjms.MaxProxies"


@dataclass(frozen=True)
class NodeLimits:
    max_channels: int = 1000
    max_admins: int = 10000
    max_proxies: int = 20000
    max_bridges: int = 1000


def over(count: int, limit: int) -> bool:
    """One more would exceed ``limit`` (0: no limit)."""
    return limit > 0 and count >= limit


def _imp_limit(what: str, limit: int) -> None:
    from omniORB import CORBA

    log.warning("refused: the node already holds its limit of %d %s ([limits])", limit, what)
    raise CORBA.IMP_LIMIT(0, CORBA.COMPLETED_NO)


def _channels(factory: Any) -> list[Any]:
    return list(factory.channels.values())


def check_channels(limits: NodeLimits, factory: Any) -> None:
    if over(len(factory.channels), limits.max_channels):
        _imp_limit("channels", limits.max_channels)


def check_admins(limits: NodeLimits, factory: Any) -> None:
    count = sum(len(ch.consumer_admins) + len(ch.supplier_admins) for ch in _channels(factory))
    if over(count, limits.max_admins):
        _imp_limit("admins", limits.max_admins)


def check_proxies(limits: NodeLimits, factory: Any) -> None:
    from omniORB import CORBA

    import CosNotifyChannelAdmin

    count = sum(ch.proxy_count("C") + ch.proxy_count("S") for ch in _channels(factory))
    if over(count, limits.max_proxies):
        log.warning("refused: the node already holds its limit of %d proxies ([limits])", limits.max_proxies)
        value = CORBA.Any(CORBA.TC_long, limits.max_proxies)
        raise CosNotifyChannelAdmin.AdminLimitExceeded(CosNotifyChannelAdmin.AdminLimit(PROXY_LIMIT_NAME, value))


def check_bridges(limits: NodeLimits, count: int) -> None:
    if over(count, limits.max_bridges):
        _imp_limit("bridges", limits.max_bridges)
