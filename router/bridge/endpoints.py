"""External endpoints of a bridge (NJI 2.2, 3.1): validation per Table 2-1 and a storable form.

A bridge joins one *source* to one *sink*; exactly one of them is a JMS destination and the other an event
channel of this node. :func:`check_pair` returns one :class:`Problem` per offending endpoint, which the factory
raises as ``InvalidExternalEndPoints`` with the matching ``ExternalEndpointErrorCode``:

* ``INVALID_CHANNELID`` — the channel id names no channel of this node, or a channel endpoint is used with the
  JMS_MESSAGE type, or both endpoints are channels;
* ``INVALID_JMSDESTINATION`` — empty or ill-formed destination name, or both endpoints are JMS destinations;
* ``MISMATCH_ENDPOINTROLE_NOTIFSTYLE`` — the role, style and type do not fit together, e.g. a PULL sink on the
  JMS side (JMS has no pull on the sender side, Table 2-1), or a channel endpoint whose type is not
  STRUCTURED_EVENT/SEQUENCE_EVENT, or an endpoint whose ``role`` is not the one its position requires.
* ``INVALID_JMSDESTINATION`` also for a **queue** joined to a channel whose ConnectionReliability is BestEffort:
  NJI Table 2-3 maps BestEffort only to a (non-durable) TopicSubscriber; the point-to-point model has no
  BestEffort counterpart ("[no supported]"). ``create_bridge`` can raise nothing but ``InvalidExternalEndPoints``,
  and the destination is what does not fit.

Supported combinations (all the ones Table 2-1 allows, including the "implementation dependent" one):

=================  =====================  ======================================================
source             sink                   how the bridge connects
=================  =====================  ======================================================
channel PUSH       JMS PUSH               structured/sequence push consumer of the channel
channel PULL       JMS PUSH               structured/sequence pull consumer (paced by PacingInterval)
JMS PUSH           channel PUSH           JMS listener, pushes into a structured/sequence proxy consumer
JMS PULL           channel PUSH           synchronous JMS receive paced by PacingInterval, pushes
JMS PUSH / PULL    channel PULL           the channel pulls from the bridge's pull supplier
=================  =====================  ======================================================
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from router.jms.selector import SelectorSyntaxError, check_selector

__all__ = [
    "DESTINATION_NAME",
    "EndpointSpec",
    "FactoryProfile",
    "Problem",
    "check_pair",
    "from_idl",
    "parse_factory",
    "to_idl",
]

# A conservative destination-name syntax that every STOMP broker accepts and that cannot inject headers.
DESTINATION_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-:$]{0,199}$")


PROFILES = {"": None, "default": None, "jms-json": "jms-json"}


@dataclass(frozen=True)
class FactoryProfile:
    """What ``JMSDestination.factory_name`` selects: ``[profile][;selector=<JMS selector>]``.

    ``profile`` is ``default`` (plain STOMP subscription: never stalls; Java Map/Stream/Object bodies arrive
    empty and are refused to the broker's DLQ) or ``jms-json`` (Java MapMessages arrive typed; an ObjectMessage on
    the destination stalls the subscription, so use it only where producers never send ObjectMessages). The
    selector is checked against the JMS selector grammar (``router.jms.selector``) and passed to the broker, which
    evaluates it (nsjms never evaluates it)."""

    transformation: str | None = None
    selector: str | None = None


def parse_factory(text: str | None, *, check_selector_syntax: bool = True) -> FactoryProfile:
    """Raises ValueError naming what is wrong. ``check_selector_syntax=False``: a bridge stored before selectors were
    checked keeps its selector (the broker decides, and its refusal shows as the bridge's state)."""
    name, _, rest = (text or "").partition(";")
    name = name.strip()
    if name not in PROFILES:
        raise ValueError(f"unknown connection factory profile {name!r} (known: default, jms-json)")
    selector = None
    if rest:
        key, eq, value = rest.partition("=")
        if key.strip() != "selector" or not eq or not value.strip():
            raise ValueError(f"factory_name option {rest!r} is not 'selector=<JMS selector>'")
        if any(ch in value for ch in "\r\n\0"):
            raise ValueError("the selector contains a line break or NUL")

        selector = value.strip()
        try:  # refused when presented (JMS 2.0 §3.8.1.1), not by the broker at every subscription attempt
            if check_selector_syntax:
                check_selector(selector)
        except SelectorSyntaxError as exc:
            raise ValueError(f"invalid JMS selector {selector!r}: {exc}") from None
    return FactoryProfile(PROFILES[name], selector)


@dataclass(frozen=True)
class EndpointSpec:
    """A storable, validated view of ``CosBridgeAdmin::ExternalEndpoint``."""

    role: str                 # "SOURCE" | "SINK"
    type: str                 # "JMS_MESSAGE" | "STRUCTURED_EVENT" | "SEQUENCE_EVENT"
    style: str                # "PUSH" | "PULL"
    channel_id: int | None = None
    destination_type: str | None = None   # "QUEUE" | "TOPIC"
    destination_name: str | None = None
    factory_name: str | None = None

    @property
    def is_jms(self) -> bool:
        return self.type == "JMS_MESSAGE"

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EndpointSpec:
        return cls(**data)

    def describe(self) -> str:
        if self.is_jms:
            return f"{self.style} {(self.destination_type or '').lower()} {self.destination_name}"
        return f"{self.style} {self.type.lower()} channel {self.channel_id}"


@dataclass(frozen=True)
class Problem:
    role: str     # the offending endpoint's role as given
    code: str     # ExternalEndpointErrorCode name
    reason: str


def from_idl(ep: Any) -> EndpointSpec:
    """Read an IDL ``ExternalEndpoint`` (omniORBpy value) into an :class:`EndpointSpec`."""
    conn = ep.connector
    kind = ep.type._n
    if conn._d._n == "JMS_MESSAGE":
        dest = conn._v
        return EndpointSpec(ep.role._n, kind, ep.style._n, None, dest.destination_type._n,
                            dest.destination_name, dest.factory_name)
    return EndpointSpec(ep.role._n, kind, ep.style._n, channel_id=int(conn._v))


def to_idl(spec: EndpointSpec) -> Any:
    """The IDL ``ExternalEndpoint`` value of a stored spec."""
    from idl.generated import CosBridgeAdmin as BA

    if spec.is_jms:
        dest = BA.JMSDestination(getattr(BA, spec.destination_type or "QUEUE"), spec.destination_name or "",
                                 spec.factory_name or "")
        connector = BA.ExternalEndpointConnector(destination=dest)
    else:
        connector = BA.ExternalEndpointConnector(getattr(BA, spec.type), int(spec.channel_id or 0))
    return BA.ExternalEndpoint(getattr(BA, spec.role), connector, getattr(BA, spec.style), getattr(BA, spec.type))


def _check_one(spec: EndpointSpec, position: str, channel_exists: Callable[[int], bool]) -> Problem | None:
    if spec.role != position:
        return Problem(spec.role, "MISMATCH_ENDPOINTROLE_NOTIFSTYLE",
                       f"endpoint given as {position.lower()} has role {spec.role}")
    if spec.is_jms:
        if spec.channel_id is not None:
            return Problem(spec.role, "INVALID_JMSDESTINATION", "JMS_MESSAGE endpoint without a JMS destination")
        if not spec.destination_name or not DESTINATION_NAME.match(spec.destination_name):
            return Problem(spec.role, "INVALID_JMSDESTINATION",
                           f"destination name {spec.destination_name!r} is empty or not a plain name")
        try:
            parse_factory(spec.factory_name)
        except ValueError as exc:
            return Problem(spec.role, "INVALID_JMSDESTINATION", str(exc))
        if position == "SINK" and spec.style == "PULL":
            return Problem(spec.role, "MISMATCH_ENDPOINTROLE_NOTIFSTYLE",
                           "a JMS sink cannot be pulled (NJI Table 2-1: not allowed by the JMS specification)")
        return None
    if spec.channel_id is None:
        return Problem(spec.role, "INVALID_CHANNELID", f"{spec.type} endpoint carries a JMS destination")
    if not channel_exists(spec.channel_id):
        return Problem(spec.role, "INVALID_CHANNELID", f"no event channel with id {spec.channel_id}")
    return None


def check_pair(source: EndpointSpec, sink: EndpointSpec, channel_exists: Callable[[int], bool],
               channel_persistent: Callable[[int], bool] | None = None) -> list[Problem]:
    """Every consistency problem of a (source, sink) pair; empty when the bridge can be created.
    ``channel_persistent(id)`` tells whether a channel's ConnectionReliability is Persistent (Table 2-3 check;
    skipped when not given)."""
    problems = [p for p in (_check_one(source, "SOURCE", channel_exists),
                            _check_one(sink, "SINK", channel_exists)) if p is not None]
    if problems:
        return problems
    if source.is_jms == sink.is_jms:
        code = "INVALID_JMSDESTINATION" if source.is_jms else "INVALID_CHANNELID"
        what = "JMS destinations" if source.is_jms else "event channels"
        return [Problem(source.role, code, f"both endpoints are {what}"),
                Problem(sink.role, code, f"both endpoints are {what}")]
    jms, channel = (source, sink) if source.is_jms else (sink, source)
    if (channel_persistent is not None and jms.destination_type == "QUEUE"
            and not channel_persistent(int(channel.channel_id or 0))):
        return [Problem(jms.role, "INVALID_JMSDESTINATION",
                        f"queue {jms.destination_name} with channel {channel.channel_id}, whose ConnectionReliability "
                        "is BestEffort: NJI Table 2-3 supports BestEffort only with topics (use a Persistent channel "
                        "or a topic)")]
    return []
