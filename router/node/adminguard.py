"""Which servant operations need an authenticated caller (docs/security.md): applied once, at node start.

- The project's administrative interfaces are guarded WHOLE (:func:`router.security.auth.admin_surface`): every IDL
operation
  of ``NsjmsAdmin::TransactionAdmin``, ``NsjmsAdmin::DeadLetterAdmin``, ``CosBridgeAdmin::BridgeFactory`` and
  ``NsjmsAdmin::ManagedBridge`` (with
  ``CosBridgeAdmin::Bridge`` and ``BridgeTransactionMgmt::TransactionManagement``) needs an operator, except the
  read operations named here, which a reader may call. An operation added to their IDL is guarded by default; a new
  administrative servant class goes in :func:`admin_surfaces` (tests/unit/test_auth.py fails until it does).
- The standard Notification Service interfaces stay open to suppliers and consumers, except the operations that
  create or destroy a channel or change the properties that can delete held events (:data:`CHANNEL_GUARDS`).
"""

from __future__ import annotations

from typing import Any

import router.channel.ack
import router.channel.consumers
import router.channel.proxies  # noqa: F401 - every proxy class exists before apply()'s walk
from router.bridge import flows
from router.bridge.bridge import BridgeFactoryImpl, BridgeImpl
from router.channel.admins import _AdminBase
from router.channel.channel import EventChannelFactoryImpl, EventChannelImpl
from router.channel.proxybase import ProxyBase
from router.deadletter.admin import DeadLetterAdminImpl
from router.routing.t2.admin import TransactionAdminImpl
from router.security.auth import Role, admin_surface, guard_ops, guard_when, node_internal

__all__ = ["ADMIN_READS", "CHANNEL_GUARDS", "apply"]

#: Per servant class name: the operations a reader may call (everything else of the class: operator).
ADMIN_READS: dict[str, frozenset[str]] = {
    "TransactionAdminImpl": frozenset({"list_json", "show_json"}),
    "DeadLetterAdminImpl": frozenset({"list_json", "show_json"}),
    "BridgeFactoryImpl": frozenset({"get_all_bridges", "get_bridge_with_id"}),
    "BridgeImpl": frozenset({"_get_end_point_receiver", "_get_end_point_sender", "get_status"}),
}
#: Operations of the standard NS servants that need an operator: channel lifecycle and properties that can drop or
#: delete held events (MaxQueueLength, DiscardPolicy, ...). Admins and proxies stay open: NS clients make their own.
CHANNEL_GUARDS: dict[str, dict[str, Role]] = {
    "EventChannelFactoryImpl": {"create_channel": Role.OPERATOR},
    "EventChannelImpl": {"destroy": Role.OPERATOR, "set_admin": Role.OPERATOR, "set_qos": Role.OPERATOR},
}


def admin_surfaces() -> list[type]:

    return [TransactionAdminImpl, DeadLetterAdminImpl, BridgeFactoryImpl, BridgeImpl]


def node_internal_servants() -> list[type]:
    """The bridges' endpoint servants: the node's own channel calls them; a remote caller must be an operator."""

    return [flows.StructuredPushReceiver, flows.SequencePushReceiver, flows.StructuredPullReceiver,
            flows.SequencePullReceiver, flows.StructuredPullSender, flows.SequencePullSender,
            flows.PushSenderServant, flows.SequencePushSenderServant]


#: Operations of an admin or proxy that can drop the events it holds or change what it receives: on one that belongs
#: to a bridge (its channel-side proxy and that proxy's admin) a remote caller needs an operator (review finding:
#: a local user destroyed a bridge's proxy or set MaxEventsPerConsumer on it). Other clients' admins and proxies
#: stay open, as the NS has it (docs/security.md).
BRIDGE_PROXY_OPS = frozenset({
    "destroy", "set_qos", "suspend_connection", "resume_connection", "add_filter", "remove_filter",
    "remove_all_filters", "_set_priority_filter", "_set_lifetime_filter",
    "disconnect_structured_push_supplier", "disconnect_sequence_push_supplier", "disconnect_push_supplier",
    "disconnect_structured_pull_supplier", "disconnect_sequence_pull_supplier", "disconnect_pull_supplier",
    "disconnect_structured_push_consumer", "disconnect_sequence_push_consumer", "disconnect_push_consumer",
    "disconnect_structured_pull_consumer", "disconnect_sequence_pull_consumer", "disconnect_pull_consumer",
})


def _proxy_of_bridge(proxy: Any) -> bool:
    try:
        route = proxy.rt.store.ledger.route(proxy.channel.id, proxy.side, proxy.admin.id, proxy.id)
    except AttributeError:
        return False
    return route is not None and getattr(route, "bridge_id", None) is not None


def _admin_of_bridge(admin: Any) -> bool:
    return any(_proxy_of_bridge(p) for p in list(getattr(admin, "proxies", {}).values()))


def _subclasses(cls: type) -> list[type]:
    out: list[type] = []
    todo: list[type] = [cls]
    while todo:
        subs: list[type] = todo.pop().__subclasses__()
        out.extend(subs)
        todo.extend(subs)
    return out


def apply() -> None:
    """Wrap the servant classes (idempotent)."""
    for cls in node_internal_servants():
        node_internal(cls)
    for cls in _subclasses(ProxyBase):
        guard_when(cls, BRIDGE_PROXY_OPS, Role.OPERATOR, _proxy_of_bridge)
    for cls in _subclasses(_AdminBase):
        guard_when(cls, BRIDGE_PROXY_OPS, Role.OPERATOR, _admin_of_bridge)
    for cls in admin_surfaces():
        admin_surface(read=ADMIN_READS.get(cls.__name__, frozenset()))(cls)
    for cls in (EventChannelFactoryImpl, EventChannelImpl):
        guard_ops(cls, CHANNEL_GUARDS[cls.__name__])
