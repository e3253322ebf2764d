"""The operations on the broker's dead-letter queues: list, show, retry, discard (``nsjms deadletter broker``, the
console's dead-letters page). One code path for both.

Two queues (docs/bridge.md, docs/operations.md "Dead letters on the broker"):

* ``nsjms.DLQ`` (:data:`router.bridge.core.DEFAULT_DLQ`): what a bridge could not route, with its reason in
  ``nsjms_dlq_*`` properties. ``nsjms_dlq_origin`` says what it is: ``message`` (a JMS message a JMS -> channel
  bridge could not turn into an event: its original body, from ``nsjms_dlq_destination``), ``event`` (an event a
  channel -> JMS bridge could not turn into a message or the broker refused: its CDR encoding), ``refused`` (a
  record, empty: the original JMS message was NACKed to ``ActiveMQ.DLQ``; ``nsjms_dlq_message_id`` names it).
* ``ActiveMQ.DLQ`` (:data:`router.bridge.core.BROKER_DLQ`): originals the broker moved there (a bridge's NACK, an
  expiry, a redelivery limit); the broker names where each came from (``original-destination``). Its reason, when a
  bridge NACKed it, is in the ``refused`` record of ``nsjms.DLQ`` with its message id, and is shown with it.

**Retry** sends a copy back to where the message came from: an ``origin=message`` dead letter to
``nsjms_dlq_destination`` (the bridge's JMS source: the bridge reads it again), an ``ActiveMQ.DLQ`` message to its
``original-destination``. The copy has the original's body and properties (application properties, ``persistent``,
``priority``, ``type``, ``correlation-id``, ``reply-to``; the dead letter's own ``nsjms_dlq_*`` reason properties
left out) and no expiration; the broker gives it a new message id. The copy is sent and the dead letter consumed
(by a selector on its message id) in ONE broker transaction (:class:`router.jms.stomp.browse.StompBrowser`): a crash
or a lost connection before the commit leaves the dead letter where it was and sends nothing; after it, both are
done. Only a commit whose answer was lost leaves the outcome unknown (reported as such; list again). An ``event``
dead letter (the CDR encoding of a StructuredEvent) is mapped again as the bridge maps it
(:mod:`router.deadletter.broker_event`) and sent to its bridge's JMS destination (asked of the running node), or to the
one the operator names. Refused (the dead letter kept): an event whose bridge is not known and no destination named, or
that the mapping still refuses; a ``refused`` record (retry the original in ``ActiveMQ.DLQ``), a message whose body
did not come over STOMP (a Java Map/Stream/Object message: a copy would be empty), and one whose source is unknown.
**Discard** consumes it (selector on its id, ACK).

Every retry and discard, done or refused, is appended to the operator log (:func:`router.routing.t2.ops.operator_log`).
Results are plain dicts (the JSON ``--json`` prints). Exceptions: :class:`Refused` (nothing done, the message says
why); :class:`BrokerDown` (the broker could not be asked).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from router.deadletter.broker_event import EventUnmappable, event_copy
from router.jms.browsing import BrowsedMessage, DestinationBrowser, MessageHeld, OutgoingCopy, id_selector
from router.jms.codec import body_lost
from router.jms.errors import BrokerError, LocalProtocolError, TransportError, UnconfirmedOutcome
from router.routing.t2.ops import operator_log

__all__ = ["BROKER_QUEUES", "BrokerDeadLetterOps", "BrokerDown", "Refused", "copy_for_retry", "retry_target",
           "summary"]

NSJMS_DLQ = "nsjms.DLQ"
AMQ_DLQ = "ActiveMQ.DLQ"
BROKER_QUEUES = (NSJMS_DLQ, AMQ_DLQ)
PREVIEW_BYTES = 200
#: The messages one listing reads of a queue at most, bodies included (ActiveMQ shows 400 by default: its
#: ``maxBrowsePageSize``).
SCAN_LIMIT = 1000
#: Headers the broker (or the dead letter itself) sets: never copied to a retried message.
_NOT_COPIED = frozenset({"message-id", "destination", "subscription", "ack", "timestamp", "redelivered", "expires",
                         "original-destination", "originalExpiration", "receipt", "transaction", "content-length",
                         "browser", "dlqDeliveryFailureCause", "JMSXDeliveryCount"})


T = TypeVar("T")


class Refused(Exception):
    """The operator's request is refused; the message says why (nothing changed)."""


class BrokerDown(Exception):
    """The broker could not be asked (unreachable, or it refused the connection); nothing changed."""


@dataclass(frozen=True)
class Record:
    """What ``nsjms.DLQ``'s ``refused`` record says of an ``ActiveMQ.DLQ`` message."""

    reason: str
    bridge: int | None
    source: str


# ---------------------------------------------------------------------------------------------- decisions
def _bridge(headers: Mapping[str, str]) -> int | None:
    text = headers.get("nsjms_dlq_bridge", "")
    return int(text) if text.lstrip("-").isdigit() else None


def untransportable(headers: Mapping[str, str], body: bytes) -> bool:
    """An empty body nothing marks: a Java Map/Stream/Object message over STOMP (the transport's rule,
    :attr:`router.jms.transport.Delivery.body_lost`)."""
    return body_lost(headers, body)


def retry_target(queue: str, msg: BrowsedMessage, record: Record | None = None,
                 event_to: str | None = None) -> tuple[str | None, str]:
    """Where a retry sends ``msg`` (a STOMP destination) and how, or (None, why it is refused); ``event_to``: the
    destination of an ``event`` dead letter (the operator's, else its bridge's; None: not known)."""
    h = msg.headers
    if queue == NSJMS_DLQ:
        origin = h.get("nsjms_dlq_origin")
        if origin == "message":
            source = h.get("nsjms_dlq_destination", "")
            if not source.startswith(("/queue/", "/topic/")):
                return None, "the dead letter does not name the destination it came from (nsjms_dlq_destination)"
            return source, f"back to {source}, the bridge's JMS source (the bridge reads it again)"
        if origin == "event":
            if event_to is None:
                return None, (f"an event of bridge {h.get('nsjms_dlq_bridge', '?')}, which is not a channel -> JMS "
                              "bridge of the running node (destroyed?): name the destination to send it to (--to)")
            if not event_to.startswith(("/queue/", "/topic/")) or event_to == f"/queue/{queue}":
                return None, f"not a destination to retry to: {event_to!r}"
            return event_to, f"the event mapped again as the bridge maps it, to {event_to}"
        if origin == "refused":
            return None, (f"a record only: the message itself is in {AMQ_DLQ} (id "
                          f"{h.get('nsjms_dlq_message_id', '?')}): retry that one, then discard this record")
        return None, "not a dead letter of an nsjms bridge (no nsjms_dlq_origin property)"
    source = h.get("original-destination") or (record.source if record else "")
    if not source.startswith(("/queue/", "/topic/")):
        return None, "the broker does not say where it came from (no original-destination)"
    if source == f"/queue/{queue}":
        return None, f"its original destination is {queue} itself"
    if untransportable(h, msg.body):
        return None, ("its body did not come over STOMP (a Java Map, Stream or Object message, or an empty text): a "
                      "copy sent over STOMP would be empty; move it with a JMS client or the broker's console")
    return source, f"back to {source}, its original destination"


def copy_for_retry(msg: BrowsedMessage, destination: str) -> OutgoingCopy:
    """The copy a retry sends: the body, the properties and JMS headers, not what the broker or the dead letter set
    (ids, times, expiry, the ``nsjms_dlq_*`` reason); ``content-length`` again for a bytes body (a BytesMessage)."""
    headers = {k: v for k, v in msg.headers.items() if k not in _NOT_COPIED and not k.startswith("nsjms_dlq_")}
    if "content-length" in msg.headers:
        headers["content-length"] = str(len(msg.body))
    return OutgoingCopy(destination, headers, msg.body)


def preview(body: bytes) -> str:
    """The body's start as text (undecodable bytes shown as escapes), with its size when cut."""
    text = body[:PREVIEW_BYTES].decode("utf-8", errors="backslashreplace")
    return text if len(body) <= PREVIEW_BYTES else f"{text}… ({len(body)} bytes)"


def summary(queue: str, msg: BrowsedMessage, record: Record | None = None) -> dict[str, Any]:
    """One dead letter as listed: id, reason, origin, bridge, source, time, size, body preview, headers, where a
    retry goes (or why it is refused)."""
    h = msg.headers
    reason = h.get("nsjms_dlq_reason") or h.get("dlqDeliveryFailureCause") or (record.reason if record else "")
    target, how = retry_target(queue, msg, record)
    event = queue == NSJMS_DLQ and h.get("nsjms_dlq_origin") == "event"
    if event:
        how = (f"the event mapped again as the bridge maps it, to bridge {h.get('nsjms_dlq_bridge', '?')}'s JMS "
               "destination (or to one the operator names)")
    stamp = h.get("timestamp", "")
    return {"id": msg.message_id, "queue": queue, "reason": reason or "not recorded (moved there by the broker)",
            "origin": h.get("nsjms_dlq_origin") or ("broker" if queue == AMQ_DLQ else "unknown"),
            "bridge": _bridge(h) if _bridge(h) is not None else (record.bridge if record else None),
            "source": h.get("nsjms_dlq_destination") or h.get("original-destination")
            or (record.source if record else None),
            "at": int(stamp) / 1000.0 if stamp.isdigit() else None, "size": len(msg.body),
            "preview": preview(msg.body), "headers": dict(h), "retry_to": target, "retry": how,
            "retryable": target is not None or event}


# ---------------------------------------------------------------------------------------------- operations
class BrokerDeadLetterOps:
    """List, show, retry and discard the messages of the broker's dead-letter queues (see the module docstring)."""

    def __init__(self, node: str, state_dir: Path, broker: Callable[[], DestinationBrowser], *,
                 mode: str = "broker", wait_s: float = 10.0) -> None:
        self.node, self.state_dir, self.broker, self.mode, self.wait_s = node, state_dir, broker, mode, wait_s
        self._serial = threading.Lock()     # one operator action at a time from this process

    # --------------------------------------------------------------------------------------------------- read
    def listing(self, queue: str, offset: int = 0, limit: int = 1000, scan: int = SCAN_LIMIT) -> dict[str, Any]:
        """The dead letters of ``queue``, oldest first (the broker's order), ``limit`` of them from ``offset``;
        ``total``: how many the broker showed, reading at most ``scan`` (``complete``: all of them; bodies are read
        too: a browse carries whole messages)."""
        self._known(queue)
        browse = self._ask(lambda b: b.browse(f"/queue/{queue}", limit=max(1, scan)))
        records = self._records() if queue == AMQ_DLQ and browse.messages else {}
        rows = [summary(queue, m, records.get(m.message_id)) for m in browse.messages]
        start = max(0, offset)
        return {"node": self.node, "queue": queue, "total": len(rows), "complete": browse.complete,
                "offset": start, "dead_letters": rows[start:start + max(1, limit)]}

    def show(self, queue: str, message_id: str) -> dict[str, Any]:
        msg = self._find(queue, message_id)
        record = self._records().get(message_id) if queue == AMQ_DLQ else None
        return summary(queue, msg, record)

    # ---------------------------------------------------------------------------------------------------- act
    def retry(self, queue: str, message_id: str, who: str, why: str = "", *, to: str | None = None,
              bridge_sink: Callable[[int], str | None] | None = None) -> dict[str, Any]:
        """``to``: where an ``event`` dead letter goes (``/queue/NAME``, ``/topic/NAME``); without it, its bridge's
        destination by ``bridge_sink`` (a bridge id -> its JMS destination, None when not known)."""
        return self._audited("broker deadletter retry", queue, message_id, who, why,
                             lambda: self._retry(queue, message_id, to, bridge_sink))

    def discard(self, queue: str, message_id: str, who: str, why: str) -> dict[str, Any]:
        return self._audited("broker deadletter discard", queue, message_id, who, why,
                             lambda: self._discard(queue, message_id))

    def _audited(self, action: str, queue: str, message_id: str, who: str, why: str,
                 act: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        target = f"{queue} {message_id}"
        with self._serial:
            try:
                result = act()
            except Refused as exc:
                operator_log(self.state_dir, self.node, self.mode, who, why, action, target, f"refused: {exc}")
                raise
            except Exception as exc:
                operator_log(self.state_dir, self.node, self.mode, who, why, action, target,
                             f"failed: {type(exc).__name__}: {exc}")
                raise
        operator_log(self.state_dir, self.node, self.mode, who, why, action, target, result)
        return result

    def _retry(self, queue: str, message_id: str, to: str | None,
               bridge_sink: Callable[[int], str | None] | None) -> dict[str, Any]:
        msg = self._find(queue, message_id)
        record = self._records().get(message_id) if queue == AMQ_DLQ else None
        event = queue == NSJMS_DLQ and msg.headers.get("nsjms_dlq_origin") == "event"
        bridge = _bridge(msg.headers)
        event_to = (to or (bridge_sink(bridge) if bridge_sink is not None and bridge is not None else None)
                    if event else None)
        target, how = retry_target(queue, msg, record, event_to)
        if target is None:
            raise Refused(f"{queue} message {message_id}: {how}; kept")
        if event:
            self._mapped(msg, target, message_id)              # refused before anything is consumed
        chosen: list[OutgoingCopy] = []

        def copy(taken: BrowsedMessage) -> OutgoingCopy:
            again, why_not = retry_target(queue, taken, record, event_to)       # the message actually consumed
            if again is None:
                raise Refused(f"{queue} message {message_id}: {why_not}; kept")
            chosen.append(self._mapped(taken, again, message_id) if event else copy_for_retry(taken, again))
            return chosen[-1]

        taken = self._settle(queue, message_id, copy)
        return {"id": message_id, "queue": queue, "retried": True, "to": chosen[0].destination, "how": how,
                "bridge": summary(queue, taken, record)["bridge"], "size": len(taken.body)}

    @staticmethod
    def _mapped(msg: BrowsedMessage, target: str, message_id: str) -> OutgoingCopy:

        try:
            return event_copy(msg, target)
        except EventUnmappable as exc:
            raise Refused(f"{NSJMS_DLQ} message {message_id}: {exc}; kept") from None

    def _discard(self, queue: str, message_id: str) -> dict[str, Any]:
        taken = self._settle(queue, message_id, None)
        row = summary(queue, taken)
        return {"id": message_id, "queue": queue, "discarded": True, "reason": row["reason"],
                "bridge": row["bridge"], "source": row["source"]}

    # ------------------------------------------------------------------------------------------------ helpers
    def _settle(self, queue: str, message_id: str,
                copy: Callable[[BrowsedMessage], OutgoingCopy] | None) -> BrowsedMessage:
        self._known(queue)                   # only the dead-letter queues, whoever calls (a composite name: refused)
        try:
            taken = self._ask(lambda b: b.settle(f"/queue/{queue}", message_id, copy, wait_s=self.wait_s))
        except MessageHeld as exc:
            raise Refused(str(exc)) from None
        except UnconfirmedOutcome as exc:
            raise BrokerDown(f"the broker did not confirm ({exc}): list {queue} again to see whether it was done "
                             "(the dead letter gone and its copy sent, or neither)") from None
        if taken is None:
            raise Refused(self._unknown(queue, message_id))
        return taken

    def _find(self, queue: str, message_id: str) -> BrowsedMessage:

        self._known(queue)
        if not message_id:
            raise Refused("a message id is required")
        found = self._ask(lambda b: b.browse(f"/queue/{queue}", selector=id_selector(message_id), limit=1))
        if not found.messages:
            raise Refused(self._unknown(queue, message_id))
        return found.messages[0]

    def _records(self) -> dict[str, Record]:
        """The ``refused`` records of ``nsjms.DLQ`` by the id of the message they name in ``ActiveMQ.DLQ``."""
        browse = self._ask(lambda b: b.browse(f"/queue/{NSJMS_DLQ}", selector="nsjms_dlq_origin = 'refused'",
                                              limit=SCAN_LIMIT))
        return {m.headers["nsjms_dlq_message_id"]: Record(m.headers.get("nsjms_dlq_reason", ""), _bridge(m.headers),
                                                          m.headers.get("nsjms_dlq_destination", ""))
                for m in browse.messages if m.headers.get("nsjms_dlq_message_id")}

    def _ask(self, call: Callable[[DestinationBrowser], T]) -> T:
        try:
            return call(self.broker())
        except (Refused, MessageHeld, UnconfirmedOutcome):
            raise
        except BrokerError as exc:
            raise BrokerDown(f"the broker refused: {exc}") from None
        except LocalProtocolError as exc:
            raise Refused(str(exc)) from None
        except TransportError as exc:
            raise BrokerDown(f"the broker is not reachable: {exc}") from None

    @staticmethod
    def _known(queue: str) -> None:
        if queue not in BROKER_QUEUES:
            raise Refused(f"{queue!r} is not a dead-letter queue nsjms handles (one of {', '.join(BROKER_QUEUES)})")

    def _unknown(self, queue: str, message_id: str) -> str:
        return (f"no message {message_id} on {queue} (retried or discarded already?); "
                f"`nsjms deadletter broker list {queue}`")
