"""NS <-> JMS message and QoS mapping for the bridge (NJI 2.4-2.6), pure functions without I/O.

* :func:`event_to_jms` - StructuredEvent -> :class:`router.jms.model.JmsMessage` (NJI 2.4.2, 2.5);
* :func:`jms_to_event` / :func:`map_message` - JmsMessage -> StructuredEvent (NJI 2.4.1, 2.5), fitted to what the
  receiving channel accepts (:class:`ChannelTimeSupport`); exact inverse of :func:`event_to_jms` when the channel
  supports StopTime/StartTime and the JMS side added nothing;
* :mod:`router.mapping.typed_props` - JMS headers/properties <-> STOMP headers keeping property types;
* :mod:`router.mapping.stomp_body` - JMS bodies <-> STOMP frame bodies (text, bytes, ``jms-map-json``, markers);
* :mod:`router.mapping.limits` - bounds on hostile input (JSON and CDR nesting, CDR size);
* :class:`MappingError` and its :class:`MessageExpired` - the only exceptions.

Everything that marshals CDR (complex values, type descriptors) needs an initialised ORB. See ``docs/mapping.md``.
"""

from router.mapping.errors import MappingError, MessageExpired
from router.mapping.times import ChannelTimeSupport
from router.mapping.to_event import MappedEvent, jms_to_event, map_message
from router.mapping.to_jms import event_to_jms

__all__ = ["ChannelTimeSupport", "MappedEvent", "MappingError", "MessageExpired", "event_to_jms", "jms_to_event",
           "map_message"]
