"""What an ERROR frame from the broker means: a refusal of the message itself, or a broker out of a resource.

A pure decision over the ERROR frame's texts (its ``message`` header and its body, which for ActiveMQ holds the Java
exception and its stack trace), table-driven and free of I/O, so every caller classifies the same way:

* :attr:`Refusal.RESOURCE` — the broker cannot store anything now: a full disk (``No space left on device``,
  ENOSPC), a disk quota (``Disk quota exceeded``, EDQUOT), its store, temp or memory usage limit
  (``<systemUsage>`` with ``sendFailIfNoSpace``: ``javax.jms.ResourceAllocationException: Persistent store is
  Full, 100% of 10485760. Stopping producer (...) to prevent flooding queue://x``), producer flow control, an
  Artemis address or disk that is full. This is an OUTAGE: the message is fine and is accepted once the resource is
  freed. The caller keeps it queued and retries with back-off; it is never dead-lettered for it (the dead-letter
  destination is on the same full store) and never counts as a failure of the message.
* :attr:`Refusal.CONTENT` — anything else the broker refuses in answer to one frame (authorization, a header it
  cannot parse, a destination name it refuses): the same frame would be refused again, so the message is
  dead-lettered with the reason instead of stalling the messages behind it.

The texts in :data:`RESOURCE_PATTERNS` were taken from ActiveMQ Classic 5.17's broker classes
(``BaseDestination``, ``Queue``, ``Topic``, ``DefaultIOExceptionHandler``), from the JDK's ``IOException`` messages for
ENOSPC / EDQUOT and from ActiveMQ Artemis's STOMP ERROR frames; ``tests/unit/test_refusal.py`` holds real frames.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

__all__ = ["CONTENT_PATTERNS", "RESOURCE_MARK", "RESOURCE_PATTERNS", "Refusal", "Verdict", "classify", "is_resource"]


class Refusal(enum.StrEnum):
    CONTENT = "content"      # this message is refused: dead-letter it
    RESOURCE = "resource"    # the broker is out of a resource: an outage, retry later, never dead-letter


@dataclass(frozen=True)
class Verdict:
    """The classification of one ERROR frame and, for a resource refusal, which resource (for the status/logs)."""

    refusal: Refusal
    resource: str = ""


#: Added by the transport to a reason string built from an ERROR frame that classified as a resource refusal (a
#: transaction's rollback-only reason keeps only the message header; the body may be what told it), so a later
#: classification of that string agrees. Matched by the table below.
RESOURCE_MARK = "broker out of resources"

#: (pattern, the resource it names), first match wins; searched case-insensitively in the message header and body.
RESOURCE_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), resource) for pattern, resource in (
        (r"no space left on device", "disk full (ENOSPC)"),
        (r"disk quota exceeded", "disk quota (EDQUOT)"),
        (r"persistent store is full", "store usage limit"),
        (r"usage manager store is full", "store usage limit"),
        (r"temp store is full", "temp usage limit"),
        (r"usage manager memory limit", "memory usage limit"),
        (r"ResourceAllocationException", "broker resource limit"),
        (r"to prevent flooding", "producer flow control"),
        (r"producer-flow-control", "producer flow control"),
        (r"sendFailIfNoSpace", "producer flow control"),
        (r"\bdisk (?:capacity )?(?:is )?full\b", "disk full"),                  # Artemis AMQ119119 / AMQ222212
        (r"\bAMQ229102\b", "address full"),                                     # Artemis: Address "x" is full
        (re.escape(RESOURCE_MARK), "broker resource limit"),
    ))

#: Refusals that name the frame itself, checked FIRST: the broker echoes destination names and header values in its
#: errors, so a destination called ``ops.quota.exceeded`` or ``producer-flow-control.audit`` must not turn an
#: authorization or format error into a permanent outage (review finding).
CONTENT_PATTERNS: tuple[re.Pattern[str], ...] = tuple(re.compile(p, re.IGNORECASE) for p in (
    r"\bis not authorized to\b", r"SecurityException", r"InvalidDestinationException", r"InvalidSelectorException",
    r"MessageFormatException", r"NumberFormatException", r"\bUnable to convert\b", r"\bInvalid selector\b",
))


def classify(message: str, body: str = "") -> Verdict:
    """The meaning of an ERROR frame with ``message`` header and ``body`` text (either may be empty)."""
    first_line = body.split("\n", 1)[0]
    for text in (message, first_line):
        if text and any(p.search(text) for p in CONTENT_PATTERNS):
            return Verdict(Refusal.CONTENT)
    for text in (message, body):
        if not text:
            continue
        for pattern, resource in RESOURCE_PATTERNS:
            if pattern.search(text):
                return Verdict(Refusal.RESOURCE, resource)
    return Verdict(Refusal.CONTENT)


def is_resource(message: str, body: str = "") -> bool:
    """True when the ERROR frame is a resource refusal (an outage, see the module docstring)."""
    return classify(message, body).refusal is Refusal.RESOURCE
