"""What a channel and a bridge of the same node share (bridge → routing ← channel, never bridge ⇄ channel).

* :mod:`router.routing.ports`: typed ports of the in-process link (outbound batches, the outbound T2 participant,
  the inbound source, the channel's inbound rounds);
* :mod:`router.routing.registry`: the node's registry of its local endpoints (:class:`LocalEndpoints`) and the
  runtime's protocol the bridge sees (:class:`NodeRuntime`, :class:`T2Host`);
* :mod:`router.routing.errors`: the one error tree for "could not forward now / refused content";
* :mod:`router.routing.faults`: the minor codes and the store-failure boundary of both sides' CORBA servants;
* :mod:`router.routing.eventsize`: the node's one event size limit both sides check (``node.max_event_bytes``);
* :mod:`router.routing.qos`: the QoS property names both sides read (``EnableTransaction``);
* :mod:`router.routing.runner`: the one T2 runner (begin, enlist, work, decide, complete; an outcome value) both
  directions use, and :mod:`router.routing.completer`, the phase-two thread of a T2 client.

See docs/architecture.md ("The routing layer").
"""

from router.routing.errors import ForwardDeferred, ForwardError, ForwardFailed
from router.routing.registry import LocalEndpoint, LocalEndpoints

__all__ = ["ForwardDeferred", "ForwardError", "ForwardFailed", "LocalEndpoint", "LocalEndpoints"]
