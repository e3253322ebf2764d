"""Proxy servants: the registry of proxy kinds and the concrete supplier-side servants (NS 3.4.1-3.4.14).

The code of the supplier side lives in :mod:`router.channel.proxybase` (:class:`ProxyBase`, the common base, and
:class:`ProxySupplierBase`), :mod:`router.channel.pushsupplier` (push delivery) and
:mod:`router.channel.pullsupplier` (pull delivery); this module puts the servant classes together and re-exports
the names other modules import from it.

* Proxy *suppliers* (channel → consumer) own a :class:`~router.channel.queue.ProxyQueue`. Push proxies run one
  dispatcher thread each, so a slow or dead consumer only delays itself; a failed push keeps the events queued and
  is retried with backoff until the consumer answers, disconnects (``Disconnected``) or no longer exists
  (``OBJECT_NOT_EXIST``), in which case the proxy disconnects itself and is destroyed (NS 3.3.7.1).
* Proxy *consumers* (supplier → channel) live in :mod:`router.channel.consumers`.
"""

from __future__ import annotations

from typing import Any

from omniORB import CORBA

import CosEventChannelAdmin__POA
import CosEventComm
import CosNotifyChannelAdmin__POA
import CosNotifyComm

from router.channel.boundary import Outcome, store_boundary_all
from router.channel.proxybase import (
    _TRANSIENT,
    OWN_ENABLE_TRANSACTION,
    ProxyBase,
    ProxySupplierBase,
)
from router.channel.pullsupplier import PullSupplierMixin
from router.channel.pushsupplier import PushSupplierMixin
from router.channel.typesets import TypeSet

__all__ = ["OWN_ENABLE_TRANSACTION", "_TRANSIENT", "Outcome", "ProxyBase", "ProxySupplierBase", "PullSupplierMixin",
           "PushSupplierMixin", "TypeSet", "proxy_class"]




# ----------------------------------------------------------------------------------------------------------
# Concrete proxy suppliers
# ----------------------------------------------------------------------------------------------------------
class ProxyPushSupplierImpl(PushSupplierMixin, CosNotifyChannelAdmin__POA.ProxyPushSupplier):
    client_iface = CosEventComm.PushConsumer
    push_op = "push"
    client_disconnect_op = "disconnect_push_consumer"

    def connect_any_push_consumer(self, push_consumer: Any) -> None:
        self._connect(push_consumer, required=True)

    def disconnect_push_supplier(self) -> None:
        self.client_disconnected()


class StructuredProxyPushSupplierImpl(PushSupplierMixin, CosNotifyChannelAdmin__POA.StructuredProxyPushSupplier):
    client_iface = CosNotifyComm.StructuredPushConsumer
    push_op = "push_structured_event"
    client_disconnect_op = "disconnect_structured_push_consumer"

    def connect_structured_push_consumer(self, push_consumer: Any) -> None:
        self._connect(push_consumer, required=True)

    def disconnect_structured_push_supplier(self) -> None:
        self.client_disconnected()


class SequenceProxyPushSupplierImpl(PushSupplierMixin, CosNotifyChannelAdmin__POA.SequenceProxyPushSupplier):
    client_iface = CosNotifyComm.SequencePushConsumer
    push_op = "push_structured_events"
    client_disconnect_op = "disconnect_sequence_push_consumer"

    def connect_sequence_push_consumer(self, push_consumer: Any) -> None:
        self._connect(push_consumer, required=True)

    def disconnect_sequence_push_supplier(self) -> None:
        self.client_disconnected()


class ProxyPullSupplierImpl(PullSupplierMixin, CosNotifyChannelAdmin__POA.ProxyPullSupplier):
    client_iface = CosEventComm.PullConsumer
    client_disconnect_op = "disconnect_pull_consumer"

    def connect_any_pull_consumer(self, pull_consumer: Any) -> None:
        self._connect(pull_consumer, required=False)

    def pull(self) -> Any:
        return self._pull(lambda: 1)

    def try_pull(self) -> tuple[Any, bool]:
        return self._try_pull(1)

    def disconnect_pull_supplier(self) -> None:
        self.client_disconnected()


class StructuredProxyPullSupplierImpl(PullSupplierMixin, CosNotifyChannelAdmin__POA.StructuredProxyPullSupplier):
    client_iface = CosNotifyComm.StructuredPullConsumer
    client_disconnect_op = "disconnect_structured_pull_consumer"

    def connect_structured_pull_consumer(self, pull_consumer: Any) -> None:
        self._connect(pull_consumer, required=False)

    def pull_structured_event(self) -> Any:
        return self._pull(lambda: 1)

    def try_pull_structured_event(self) -> tuple[Any, bool]:
        return self._try_pull(1)

    def disconnect_structured_pull_supplier(self) -> None:
        self.client_disconnected()


class SequenceProxyPullSupplierImpl(PullSupplierMixin, CosNotifyChannelAdmin__POA.SequenceProxyPullSupplier):
    client_iface = CosNotifyComm.SequencePullConsumer
    client_disconnect_op = "disconnect_sequence_pull_consumer"

    def connect_sequence_pull_consumer(self, pull_consumer: Any) -> None:
        self._connect(pull_consumer, required=False)

    def pull_structured_events(self, max_number: int) -> list[Any]:
        events: list[Any] = self._pull(lambda: self._limit(max_number))
        return events

    def try_pull_structured_events(self, max_number: int) -> tuple[list[Any], bool]:
        events: tuple[list[Any], bool] = self._try_pull(self._limit(max_number))
        return events

    def disconnect_sequence_pull_supplier(self) -> None:
        self.client_disconnected()


def proxy_class(side: str, kind: str, es_style: bool = False) -> type:
    """The servant class for a proxy kind (a ``ProxyType`` name) on one side of the channel.

    Event-Service-style proxies (``obtain_push_supplier`` etc.) get ``CosEventChannelAdmin`` servants: the NS
    proxy interfaces do not inherit the Event Service ones (NS 3.4), so a client narrowing to
    ``CosEventChannelAdmin::ProxyPushSupplier`` needs an object of that type.
    """
    # cycle: router.channel.consumers imports this module (ProxyBase, the supplier tables) at its top
    from router.channel.consumers import CONSUMER_CLASSES, ES_CONSUMER_CLASSES

    if es_style:
        table = ES_SUPPLIER_CLASSES if side == "C" else ES_CONSUMER_CLASSES
    else:
        table = SUPPLIER_CLASSES if side == "C" else CONSUMER_CLASSES
    try:
        return table[kind]
    except KeyError:
        raise ValueError(f"unknown proxy kind {kind!r} on side {side!r} (es_style={es_style})") from None


class EsProxyPushSupplierImpl(PushSupplierMixin, CosEventChannelAdmin__POA.ProxyPushSupplier):
    """Event Service ProxyPushSupplier (no id; Any events)."""

    client_iface = CosEventComm.PushConsumer
    push_op = "push"
    client_disconnect_op = "disconnect_push_consumer"

    def connect_push_consumer(self, push_consumer: Any) -> None:
        if push_consumer is None or CORBA.is_nil(push_consumer):
            raise CORBA.BAD_PARAM(0, CORBA.COMPLETED_NO)
        self._connect(push_consumer, required=True)

    def disconnect_push_supplier(self) -> None:
        self.client_disconnected()


class EsProxyPullSupplierImpl(PullSupplierMixin, CosEventChannelAdmin__POA.ProxyPullSupplier):
    """Event Service ProxyPullSupplier (no id; Any events)."""

    client_iface = CosEventComm.PullConsumer
    client_disconnect_op = "disconnect_pull_consumer"

    def connect_pull_consumer(self, pull_consumer: Any) -> None:
        self._connect(pull_consumer, required=False)

    def pull(self) -> Any:
        return self._pull(lambda: 1)

    def try_pull(self) -> tuple[Any, bool]:
        return self._try_pull(1)

    def disconnect_pull_supplier(self) -> None:
        self.client_disconnected()


ES_SUPPLIER_CLASSES: dict[str, type] = {"PUSH_ANY": EsProxyPushSupplierImpl, "PULL_ANY": EsProxyPullSupplierImpl}


SUPPLIER_CLASSES: dict[str, type] = {
    "PUSH_ANY": ProxyPushSupplierImpl,
    "PUSH_STRUCTURED": StructuredProxyPushSupplierImpl,
    "PUSH_SEQUENCE": SequenceProxyPushSupplierImpl,
    "PULL_ANY": ProxyPullSupplierImpl,
    "PULL_STRUCTURED": StructuredProxyPullSupplierImpl,
    "PULL_SEQUENCE": SequenceProxyPullSupplierImpl,
}


store_boundary_all([SUPPLIER_CLASSES, ES_SUPPLIER_CLASSES])
