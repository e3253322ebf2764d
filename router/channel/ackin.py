"""Inbound acknowledgement (NJI 4.2): the channel acknowledges the events of ``CosNotifyCommAck`` suppliers.

A proxy consumer whose DeliveryReliability is Acknowledgment and whose connected supplier is a ``CosNotifyCommAck``
supplier acknowledges each event (or batch) by its SequenceNumber once the channel has queued and, if persistent,
stored it; a number seen before on that connection is a duplicate: acknowledged again, not routed again.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from idl.generated import CosNotifyCommAck
from router.channel.ackstate import ack_enabled, sequence_number_of
from router.channel.events import Form
from router.channel.proxyport import AckingConsumer
from router.channel.store import StoreError
from router.corbacall import NOTIFY, PROBE, CallFailed, best_effort, call

__all__ = ["InboundAck"]

log = logging.getLogger("nsjms.ack")

_ACK_SUPPLIER_IFACES = {
    "PUSH_STRUCTURED": CosNotifyCommAck.StructuredPushSupplierAck,
    "PUSH_SEQUENCE": CosNotifyCommAck.SequencePushSupplierAck,
    "PULL_STRUCTURED": CosNotifyCommAck.StructuredPullSupplierAck,
    "PULL_SEQUENCE": CosNotifyCommAck.SequencePullSupplierAck,
}
_SEEN = 4096


class InboundAck:
    """Duplicate suppression and acknowledgement towards one Ack supplier (one per proxy consumer)."""

    def __init__(self, proxy: AckingConsumer) -> None:
        self.proxy = proxy
        self._lock = threading.Lock()
        saved = proxy.extra.get("ack_in") or {}
        self._seen: deque[int] = deque(saved.get("seen", []), maxlen=_SEEN)
        self._seen_set = set(self._seen)
        self._ack_ref: Any = None
        self._probed = False

    def active(self) -> bool:
        """DeliveryReliability=Acknowledgment on the proxy and a CosNotifyCommAck supplier connected."""
        if not ack_enabled(self.proxy.qos):
            return False
        if not self._probed:
            self._ack_ref = self._probe()
            self._probed = True
        return self._ack_ref is not None

    def _probe(self) -> Any:
        iface = _ACK_SUPPLIER_IFACES.get(self.proxy.kind)
        try:
            client = self.proxy.client_ref()
            if iface is None or client is None or not call(client, "_is_a", iface._NP_RepositoryId, policy=PROBE):
                return None
            return client._unchecked_narrow(iface)
        except CallFailed as exc:
            log.info("proxy %s: cannot tell whether the supplier acknowledges (%s)", self.proxy.oid, exc)
            return None

    def accept(self, events: list[Any], route: Callable[[list[Any]], None]) -> None:
        """Route ``events`` unless their SequenceNumber was seen; then acknowledge it to the supplier."""
        sn = sequence_number_of(events[0].value) if events and events[0].form is Form.STRUCTURED else None
        if sn is None:
            route(events)
            return
        with self._lock:
            duplicate = sn in self._seen_set
        if duplicate:
            log.info("proxy %s: duplicate SequenceNumber %d from the supplier; not routed again", self.proxy.oid, sn)
        else:
            route(events)
            self._remember(sn)
        self._acknowledge([sn])

    def _remember(self, sn: int) -> None:
        with self._lock:
            if len(self._seen) == self._seen.maxlen:
                self._seen_set.discard(self._seen[0])
            self._seen.append(sn)
            self._seen_set.add(sn)
            recent = list(self._seen)[-256:]
        try:
            self.proxy.save_extra(ack_in={"seen": recent})
        except StoreError as exc:
            # The events are routed and committed: the answer is success (TRANSIENT would tell the supplier they
            # were not, which is false). The number is remembered in memory, and the next save stores it too;
            # only a crash before then lets a resend of this number through (at-least-once, docs/ack.md).
            log.warning("proxy %s: events with SequenceNumber %d are stored and routed, but the numbers seen could "
                        "not be saved (%s); a resend after a crash may be routed again", self.proxy.oid, sn, exc)

    def _acknowledge(self, sns: list[int]) -> None:
        client = self._ack_ref

        def acknowledge() -> None:
            best_effort(client, "acknowledge", sns, policy=NOTIFY, logger=log,
                        what=f"proxy {self.proxy.oid}: acknowledge {sns} to the supplier")

        self.proxy.rt.spawn(f"ack-{self.proxy.oid}", acknowledge)
