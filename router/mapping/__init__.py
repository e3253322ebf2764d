"""NS <-> JMS message and QoS mapping for the bridge (NJI 2.4-2.6), pure functions without I/O.

* :func:`event_to_jms` - StructuredEvent -> :class:`router.jms.model.JmsMessage` (NJI 2.4.2, 2.5);
* :func:`jms_to_event` - JmsMessage -> StructuredEvent (NJI 2.4.1, 2.5); exact inverse of :func:`event_to_jms`;
* :mod:`router.mapping.typed_props` - JMS headers/properties <-> STOMP headers keeping property types;
* :mod:`router.mapping.stomp_body` - JMS bodies <-> STOMP frame bodies (text, bytes, ``jms-map-json``, markers);
* :class:`MappingError` - the one exception.

Everything that marshals CDR (complex values, type descriptors) needs an initialised ORB. See ``docs/mapping.md``.
"""

from router.mapping.errors import MappingError
from router.mapping.to_event import jms_to_event
from router.mapping.to_jms import event_to_jms

__all__ = ["MappingError", "event_to_jms", "jms_to_event"]
