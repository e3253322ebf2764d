"""The node's registry of its local endpoints: which servant of this node offers which in-process port.

Replaces finding a bridge by duck typing (``Runtime.local_servant(ref)`` then ``getattr(servant, "local_batches" |
"t2_participant" | "take_in_t2")``). A bridge registers the ports of its endpoint servant when it activates it
(:meth:`LocalEndpoints.add`, :meth:`LocalEndpoints.update` for the T2 participant it makes after) and removes them
when it is destroyed; the channel asks for the port it needs by the client reference it was given
(:meth:`LocalEndpoints.outbound_batches`, :meth:`~LocalEndpoints.outbound_t2`, :meth:`~LocalEndpoints.inbound`):
the reference is resolved in the node's persistent POA (any spelling of the IOR names the same servant), so a
reference to another process, or to an object that is not a bridge endpoint, finds nothing.

The channel side registers the one port the bridge needs of it (:attr:`LocalEndpoints.inbound_rounds`, the local
rounds of JMS → channel PUSH into a Persistent channel).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from router.routing.ports import InboundRounds, InboundSource, OutboundBatches, OutboundParticipant

if TYPE_CHECKING:
    from psycopg import Xid

    from xa.coordinator import Coordinator, Transaction
    from xa.log import RecoveryLog
    from xa.resource import Resource

__all__ = ["LocalEndpoint", "LocalEndpoints", "NodeRuntime", "Resolve", "T2Host"]

#: The servant behind a CORBA object reference when it lives in this node's persistent POA, else None.
Resolve = Callable[[object], object | None]


@dataclass(frozen=True)
class LocalEndpoint:
    """The in-process ports one bridge endpoint servant offers (None: not this variant)."""

    batches: OutboundBatches | None = None           # channel PUSH → JMS without T2
    t2: OutboundParticipant | None = None            # channel PUSH → JMS in a T2
    inbound: InboundSource | None = None             # JMS → channel PULL, in a T2 or a local unit of work


def _nothing(ref: object) -> object | None:
    return None


class LocalEndpoints:
    """This node's endpoint servants and their ports, found by object reference (thread-safe)."""

    def __init__(self, resolve: Resolve = _nothing) -> None:
        self._resolve = resolve
        self._lock = threading.Lock()
        self._by_servant: dict[int, tuple[object, LocalEndpoint]] = {}
        #: the channel's local rounds (JMS → channel PUSH into a Persistent channel); None: not offered
        self.inbound_rounds: InboundRounds | None = None

    # -- registering (the bridge) ----------------------------------------------------------------------------
    def add(self, servant: object, endpoint: LocalEndpoint) -> None:
        with self._lock:
            self._by_servant[id(servant)] = (servant, endpoint)

    def update(self, servant: object, *, t2: OutboundParticipant | None) -> None:
        """Set the T2 participant of an added servant (the bridge makes it after it activated the servant)."""
        with self._lock:
            held = self._by_servant.get(id(servant))
            endpoint = held[1] if held is not None else LocalEndpoint()
            self._by_servant[id(servant)] = (servant, replace(endpoint, t2=t2))

    def remove(self, servant: object) -> None:
        with self._lock:
            self._by_servant.pop(id(servant), None)

    # -- finding (the channel) -------------------------------------------------------------------------------
    def servant(self, ref: object) -> object | None:
        """The servant behind ``ref`` when it lives in this node (remote, inactive or unresolvable: None)."""
        try:
            return self._resolve(ref)
        except Exception:  # noqa: BLE001 — not resolvable here: not a local object
            return None

    def endpoint(self, ref: object) -> LocalEndpoint | None:
        """The ports of the bridge endpoint behind ``ref``, or None (not a bridge endpoint of this node)."""
        servant = self.servant(ref)
        if servant is None:
            return None
        with self._lock:
            held = self._by_servant.get(id(servant))
        return held[1] if held is not None and held[0] is servant else None

    def outbound_batches(self, ref: object) -> OutboundBatches | None:
        endpoint = self.endpoint(ref)
        return endpoint.batches if endpoint is not None else None

    def outbound_t2(self, ref: object) -> OutboundParticipant | None:
        endpoint = self.endpoint(ref)
        return endpoint.t2 if endpoint is not None else None

    def inbound(self, ref: object) -> InboundSource | None:
        endpoint = self.endpoint(ref)
        return endpoint.inbound if endpoint is not None else None


class T2Host(Protocol):
    """What the data paths ask of the node's routing transactions
    (``router.routing.t2.transactions.NodeTransactions``)."""

    coordinator: Coordinator
    #: the node's recovery log (which T2s are still live: in-doubt entries are settled once they are not)
    log: RecoveryLog

    def enlist(self, txn: Transaction, resource: Resource) -> Xid:
        ...

    def register_local(self, ior: str, target: Any) -> None:
        """An in-process participant by its client's stringified IOR (the fast path before :class:`LocalEndpoints`)."""
        ...

    def unregister_local(self, ior: str) -> None:
        ...

    def local(self, ior: str | None) -> Any:
        ...


class NodeRuntime(Protocol):
    """What a bridge's data paths ask of the node's runtime (``router.channel.runtime.Runtime``)."""

    t2: T2Host | None
    endpoints: LocalEndpoints
