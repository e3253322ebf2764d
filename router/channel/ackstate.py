"""The acknowledgement state of one logical connection (NJI 4.2): SequenceNumbers and the in-flight window.

Every event (structured) or batch (sequence, first event only) an Ack proxy supplier sends carries a
``SequenceNumber`` header from a per-connection counter (0 … 2^31-1, then 0); :class:`AckState` keeps the batches
in flight until ``acknowledge`` names them (at most :data:`WINDOW`), what was in flight before a restart, and the
retry count. No I/O here: the servants of :mod:`router.channel.ack` save it (``to_json``) in the proxy's ``extra``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from omniORB import CORBA

import CosNotification

from router.channel import qos as Q
from router.channel.queue import Entry

__all__ = ["SN_LIMIT", "WINDOW", "AckState", "Pending", "ack_enabled", "next_sn", "retry_policy",
           "sequence_number_of", "with_sequence_number"]

SN_LIMIT = 2**31 - 1            # SequenceNumber range 0..2^31-1; the value after SN_LIMIT is 0
WINDOW = 64                     # batches in flight per connection before the proxy waits for acknowledgements
_TIMET = 10_000_000


def next_sn(sn: int) -> int:
    return 0 if sn >= SN_LIMIT else sn + 1


def ack_enabled(qos: dict[str, Any]) -> bool:
    return int(qos.get(Q.DELIVERY_RELIABILITY, Q.ACK_NONE)) == Q.ACK_ACKNOWLEDGMENT


def retry_policy(qos: dict[str, Any]) -> tuple[int, float]:
    """(Retries, RetryInterval in seconds) of a proxy's effective QoS."""
    return int(qos.get(Q.RETRIES, 3)), int(qos.get(Q.RETRY_INTERVAL, _TIMET)) / _TIMET


# -- SequenceNumber header ---------------------------------------------------------------------------------
def with_sequence_number(event: Any, sn: int) -> Any:
    """A copy of a StructuredEvent whose variable header carries ``SequenceNumber = sn`` (any old one replaced)."""
    header = event.header
    variable = [p for p in header.variable_header if p.name != Q.SEQUENCE_NUMBER]
    variable.append(CosNotification.Property(Q.SEQUENCE_NUMBER, CORBA.Any(CORBA.TC_long, sn)))
    new_header = CosNotification.EventHeader(header.fixed_header, variable)
    return CosNotification.StructuredEvent(new_header, event.filterable_data, event.remainder_of_body)


def sequence_number_of(event: Any) -> int | None:
    for p in event.header.variable_header:
        if p.name == Q.SEQUENCE_NUMBER:
            try:
                value = p.value.value()
            except (AttributeError, CORBA.Exception):
                return None
            return int(value) if isinstance(value, int) and 0 <= value <= SN_LIMIT else None
    return None


# -- outbound state ----------------------------------------------------------------------------------------
@dataclass
class Pending:
    """One event or batch sent (or about to be sent) under a SequenceNumber, waiting for its acknowledgement."""

    sn: int
    entries: list[Entry]
    sent_at: float = 0.0            # 0: never sent in this process (due at once)
    order: int = 0


@dataclass
class AckState:
    """Per-connection acknowledgement bookkeeping of one proxy supplier (thread-safe through ``lock``)."""

    next: int = 0
    stopped: str = ""
    retry_count: int = 0
    resends: int = 0                # retries counted on this connection (resends and push retries); never reset
    checked_at: float = 0.0         # clock reading of the last finished scheduling pass (see ``passed``)
    inflight: dict[int, Pending] = field(default_factory=dict)
    restored: dict[int, int] = field(default_factory=dict)      # event db id -> SN, from before a restart
    lock: threading.Lock = field(default_factory=threading.Lock)
    _order: int = 0

    @classmethod
    def load(cls, saved: dict[str, Any] | None) -> AckState:
        saved = saved or {}
        restored = {int(eid): int(sn) for sn, eids in (saved.get("inflight") or {}).items() for eid in eids}
        return cls(next=int(saved.get("next", 0)), stopped=str(saved.get("stopped", "")), restored=restored)

    def to_json(self) -> dict[str, Any]:
        inflight = {str(p.sn): [e.record.db_id for e in p.entries if e.record.db_id is not None]
                    for p in self.inflight.values()}
        return {"next": self.next, "stopped": self.stopped, "inflight": {k: v for k, v in inflight.items() if v}}

    def open(self, entries: list[Entry], now: float) -> Pending:
        with self.lock:
            sn, self.next = self.next, next_sn(self.next)
            self._order += 1
            p = Pending(sn, entries, now, self._order)
            self.inflight[sn] = p
            return p

    def adopt(self, entry: Entry) -> bool:
        """Put a restored entry back in flight under its old SequenceNumber; False if it was not in flight."""
        sn = self.restored.pop(entry.record.db_id, None) if entry.record.db_id is not None else None
        if sn is None:
            return False
        with self.lock:
            p = self.inflight.get(sn)
            if p is None:
                self._order += 1
                p = self.inflight[sn] = Pending(sn, [], 0.0, self._order)
            p.entries.append(entry)
        return True

    def acknowledge(self, sns: list[int]) -> list[Entry]:
        with self.lock:
            done = [self.inflight.pop(sn) for sn in dict.fromkeys(sns) if sn in self.inflight]
            if done:
                self.retry_count = 0
        return [e for p in done for e in p.entries]

    def overdue(self, now: float, interval: float) -> list[Pending]:
        with self.lock:
            return sorted((p for p in self.inflight.values() if p.sent_at + interval <= now), key=lambda p: p.order)

    def next_due(self, interval: float) -> float | None:
        with self.lock:
            return min((p.sent_at + interval for p in self.inflight.values()), default=None)

    def room(self) -> bool:
        with self.lock:
            return len(self.inflight) < WINDOW

    def passed(self, now: float) -> None:
        """A scheduling pass that decided at ``now`` is over: every resend due by ``now`` has been pushed (or the
        connection is stopped). Tests and operators wait for ``checked_at`` to pass a deadline, not for time."""
        with self.lock:
            self.checked_at = max(self.checked_at, now)

    def schedule(self, interval: float) -> dict[str, Any]:
        """The resend scheduler's state for ``status_extra`` (``next_resend_at`` None: nothing will be resent)."""
        due = None if self.stopped else self.next_due(interval)
        with self.lock:
            return {"resends": self.resends, "checked_at": self.checked_at, "next_resend_at": due}

    def drain(self) -> list[Entry]:
        with self.lock:
            rest = [e for p in self.inflight.values() for e in p.entries]
            self.inflight.clear()
        return rest
